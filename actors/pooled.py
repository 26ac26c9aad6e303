"""Actors served by a shared pool of threads: pykka actors that own no thread.

A `ThreadingActor` holds a thread for as long as it lives, waiting on its inbox. A
`PooledActor`'s inbox instead knows whether it is queued on its pool: the first message
put into an inbox that is not queues it on the pool's ready queue, and a pool thread then
handles up to `BATCH` of its messages, one at a time and in order, before it queues the
inbox again if more are left: so a busy actor takes turns with the others instead of
holding a thread. An inbox is queued at most once, so at most one thread serves an actor
at a time, and its state needs no locks, as a `ThreadingActor`'s does not.

The queued flag is set by `put` and cleared by the serving thread under the inbox's lock,
each together with a look at the messages: a message put while a thread finishes serving
is either seen by that thread or queues the inbox again, never left waiting.

Everything else is pykka's: `tell`, `ask` and proxies through `ActorRef`, its
`ThreadingFuture`, `on_start` before the first message (on a pool thread), `_stop` and
`on_stop`, the `ActorRegistry`, a told message's exception through `_handle_failure` and
`on_failure`, and the teardown that answers asks left in the inbox with `ActorDeadError`.
An actor handling a message must not wait for another pooled actor: with every thread of
the pool waiting, nothing would serve the one waited for. Ours never wait (they hear back
by message), which is the rule between the loop and the actors.
"""

from __future__ import annotations

import abc
import logging
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pykka
from pykka import ActorDeadError, ActorRegistry, ThreadingFuture

if TYPE_CHECKING:  # pykka keeps its envelope private; only its type is named here
    from pykka._envelope import Envelope

log = logging.getLogger("stillhere.pool")

# Messages an actor handles in one go before the others queued get their turn: enough that
# a busy actor does not pay a round through the ready queue for every message.
BATCH = 16


class ActorPool:
    """`threads` daemon threads serving the inboxes queued on it, in the order queued."""

    def __init__(self, threads: int, name: str = "ActorPool") -> None:
        if threads < 1:
            raise ValueError(f"a pool needs a thread at least, not {threads}")
        self._ready: queue.SimpleQueue[PoolInbox | None] = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self.threads:
            thread.start()

    def queue(self, inbox: PoolInbox) -> None:
        self._ready.put(inbox)

    def stop(self, timeout: float | None = None) -> None:
        """End the threads once what is queued before now is served; wait `timeout` for
        them (None: do not wait). Stop the actors first: nothing serves them after."""
        for _ in self.threads:
            self._ready.put(None)
        if timeout is not None:
            for thread in self.threads:
                thread.join(timeout)

    def _work(self) -> None:
        while (inbox := self._ready.get()) is not None:
            try:
                inbox.serve()
            except Exception:  # a fault of the pool's own: the thread goes on serving
                log.exception("a pool thread failed serving an actor")


class PoolInbox:
    """An actor's inbox (pykka's `ActorInbox`: `put`, `get`, `empty`) that queues itself on
    its pool when a message arrives and it is not queued already. Until its actor starts it
    counts as queued, so messages told early wait for `on_start`."""

    __slots__ = ("_closed", "_lock", "_messages", "_pool", "_queued", "_serve")

    def __init__(self) -> None:
        self._messages: deque[Envelope[Any]] = deque()
        self._lock = threading.Lock()
        self._queued = True
        self._closed = False
        self._pool: ActorPool | None = None
        self._serve: Callable[[], None] | None = None

    def open(self, pool: ActorPool, serve: Callable[[], None]) -> None:
        """Start serving: `serve` runs on `pool` now, and whenever messages come later."""
        self._pool, self._serve = pool, serve
        pool.queue(self)

    def put(self, envelope: Envelope[Any], /) -> None:
        with self._lock:
            closed = self._closed
            wake = not (closed or self._queued)
            if not closed:
                self._messages.append(envelope)
                self._queued = True
        if closed:
            _refuse(envelope)
        elif wake:
            assert self._pool is not None
            self._pool.queue(self)

    def get(self) -> Envelope[Any]:
        """The oldest message; only the thread serving the actor takes them."""
        return self._messages.popleft()

    def empty(self) -> bool:
        return not self._messages

    def serve(self) -> None:
        assert self._serve is not None
        self._serve()

    def served(self) -> None:
        """The serving thread is done for now: queued again if messages are left."""
        with self._lock:
            more = self._queued = bool(self._messages)
        if more:
            assert self._pool is not None
            self._pool.queue(self)

    def close(self) -> None:
        """The actor has stopped: a message put from now on is refused at once, and those
        already in are left to pykka's teardown. Nothing serves the inbox again, so it lets
        go of its actor (`_serve` is the actor's method, and the actor holds its inbox):
        a stopped actor is freed as soon as nothing refers to it, not left to the next
        full collection."""
        with self._lock:
            self._closed = True
            self._pool = self._serve = None


def _refuse(envelope: Envelope[Any]) -> None:
    """A message that reached a stopped actor's inbox: an ask hears so (a tell is dropped,
    as pykka drops one told to a dead actor)."""
    if envelope.reply_to is not None:
        error = ActorDeadError("the actor stopped before handling the message")
        envelope.reply_to.set_exception(exc_info=(ActorDeadError, error, None))


class PooledActor(pykka.Actor):
    """A pykka actor whose messages a shared `ActorPool` handles; subclasses say which
    pool (`actor_pool`)."""

    actor_inbox: PoolInbox
    _set_up = False  # on_start has run

    @staticmethod
    def _create_actor_inbox() -> PoolInbox:
        return PoolInbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return ThreadingFuture()

    @abc.abstractmethod
    def actor_pool(self) -> ActorPool:
        """The pool that serves this actor; asked once, as it starts."""

    def _start_actor_loop(self) -> None:
        self.actor_inbox.open(self.actor_pool(), self._serve_some)

    def _serve_some(self) -> None:
        """One turn on a pool thread: `on_start` the first time, then up to `BATCH`
        messages; the teardown once the actor has stopped."""
        if not self._set_up:
            self._set_up = True
            self._actor_loop_setup()
        inbox = self.actor_inbox
        for _ in range(BATCH):
            if self.actor_stopped.is_set() or inbox.empty():
                break
            self._handle_envelope(inbox.get())
        if self.actor_stopped.is_set():
            inbox.close()
            self._actor_loop_teardown()
        else:
            inbox.served()

    def _handle_envelope(self, envelope: Envelope[Any]) -> None:
        """One message, as pykka's loop handles it: an ask's exception goes back to the
        asker; a tell's fails the actor (`_handle_failure`, then `on_failure`); a
        BaseException stops it and every other actor."""
        try:
            response = self._handle_receive(envelope.message)
        except Exception:
            if envelope.reply_to is not None:
                log.info("exception returned from %s to its asker", self, exc_info=True)
                envelope.reply_to.set_exception()
                return
            self._handle_failure(*sys.exc_info())
            try:
                self.on_failure(*sys.exc_info())
            except Exception:
                self._handle_failure(*sys.exc_info())
        except BaseException as error:
            log.debug("%r in %s: stopping all actors", error, self)
            self._stop()
            # Not waiting, as pykka's own loop does: this thread may be the one that
            # would serve the actors waited for.
            ActorRegistry.stop_all(block=False)
        else:
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
