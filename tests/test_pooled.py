"""Actors served by a shared pool (actors/pooled.py) keep what pykka's threading actors
promise: each actor's messages handled one at a time, in the order told, `on_start` first
and `on_stop` last, asks answered (with `ActorDeadError` once stopped), a told message's
failure through `on_failure`; and besides, the threads stay the pool's however many actors
there are, and a busy actor takes turns with the others."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pykka
import pytest
from pykka import ThreadingFuture
from pykka._envelope import Envelope

from actors.pooled import BATCH, ActorPool, PooledActor


@pytest.fixture
def pool() -> Iterator[ActorPool]:
    pool = ActorPool(8, name="TestPool")
    yield pool
    pool.stop(timeout=10)
    assert not any(thread.is_alive() for thread in pool.threads)


class _Recorder(PooledActor):
    """Records what it handles, and whether two threads were ever inside it at once."""

    def __init__(
        self,
        pool: ActorPool,
        journal: list[Any] | None = None,
        release: threading.Event | None = None,
    ) -> None:
        super().__init__()
        self._pool = pool
        self.seen: list[Any] = []
        self.overlaps = 0
        self.failures: list[BaseException | None] = []
        self.stopped = False
        self._inside = threading.Lock()
        self._journal = journal  # shared by several actors: the order across them
        self._release = release

    def actor_pool(self) -> ActorPool:
        return self._pool

    def on_start(self) -> None:
        self.seen.append("started")

    def on_stop(self) -> None:
        self.stopped = True

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        self.failures.append(exception_value)

    def on_receive(self, message: Any) -> Any:
        if not self._inside.acquire(blocking=False):
            self.overlaps += 1
            return None
        try:
            if message == "block" and self._release is not None:
                self._release.wait(10)
            if message == "fail":
                raise ValueError("told to fail")
            if message == "exit":
                raise SystemExit("told to exit")
            time.sleep(0)  # lets another thread run here, if one could
            self.seen.append(message)
            if self._journal is not None:
                self._journal.append((id(self), message))
            return len(self.seen)
        finally:
            self._inside.release()

    def report(self) -> tuple[list[Any], int]:
        return list(self.seen), self.overlaps


def _tell_from_threads(refs: list[pykka.ActorRef[_Recorder]], senders: int, each: int) -> None:
    """`senders` threads, each telling every actor `each` numbered messages, interleaved."""

    def send(n: int) -> None:
        for i in range(each):
            for ref in refs:
                ref.tell((n, i))

    threads = [threading.Thread(target=send, args=(n,)) for n in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_many_senders_to_many_actors_lose_nothing_and_keep_each_senders_order(
    pool: ActorPool,
) -> None:
    refs = [_Recorder.start(pool) for _ in range(40)]
    try:
        _tell_from_threads(refs, senders=6, each=150)
        reports = [ref.proxy().report().get(timeout=30) for ref in refs]
    finally:
        for ref in refs:
            ref.stop()
    for seen, overlaps in reports:
        assert overlaps == 0  # one message at a time per actor, on a pool of 8 threads
        assert seen[0] == "started" and len(seen) == 1 + 6 * 150
        for n in range(6):  # each sender's messages in its order, none lost or repeated
            assert [i for m, i in seen[1:] if m == n] == list(range(150))


def test_a_message_put_as_the_last_drain_finishes_is_not_left_waiting(
    pool: ActorPool,
) -> None:
    """One message at a time, each told as soon as the one before is answered: every tell
    meets an actor whose thread is finishing or has just finished serving it."""
    refs = [_Recorder.start(pool) for _ in range(8)]
    answers: list[list[int]] = [[] for _ in refs]

    def ping_pong(ref: pykka.ActorRef[_Recorder], answered: list[int]) -> None:
        for i in range(500):
            ref.tell(i)
            answered.append(ref.ask("count", timeout=10))

    threads = [
        threading.Thread(target=ping_pong, args=pair) for pair in zip(refs, answers, strict=True)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for ref in refs:
            ref.stop()
    # "started", then each tell and its ask: the count after the i-th pair is 2i + 3.
    assert answers == [[2 * i + 3 for i in range(500)]] * 8


def test_ask_tell_proxy_and_stop_work_as_with_a_threading_actor(pool: ActorPool) -> None:
    ref = _Recorder.start(pool)
    ref.tell("told")
    assert ref.ask("asked", timeout=10) == 3  # started, told, asked
    proxy = ref.proxy()
    assert proxy.seen.get(timeout=10) == ["started", "told", "asked"]
    assert proxy.report().get(timeout=10) == (["started", "told", "asked"], 0)
    actor = ref._actor_weakref()
    assert ref.stop(timeout=10) is True
    assert not ref.is_alive() and actor.stopped  # on_stop ran
    assert ref.stop(timeout=10) is False  # already dead
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("after", timeout=10)
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is None


def test_a_message_left_when_the_actor_stops_fails_instead_of_hanging(pool: ActorPool) -> None:
    release = threading.Event()
    ref = _Recorder.start(pool, release=release)
    ref.tell("block")  # a pool thread waits inside this one
    stopping = ref.stop(block=False)
    late = ref.ask("after the stop", block=False)  # queued behind the stop
    release.set()
    assert stopping.get(timeout=10) is True
    with pytest.raises(pykka.ActorDeadError):
        late.get(timeout=10)
    # An ask that passed the ref's look at the actor just before it stopped, and reaches
    # the inbox after: answered at once, not left in an inbox nobody serves.
    racing: ThreadingFuture[Any] = ThreadingFuture()
    ref.actor_inbox.put(Envelope("racing", reply_to=racing))
    with pytest.raises(pykka.ActorDeadError):
        racing.get(timeout=10)


def test_a_told_failure_goes_through_on_failure_and_stops_only_that_actor(
    pool: ActorPool,
) -> None:
    failing, other = _Recorder.start(pool), _Recorder.start(pool)
    actor = failing._actor_weakref()
    with pytest.raises(ValueError, match="told to fail"):
        failing.ask("fail", timeout=10)  # an asked failure goes back to the asker
    assert failing.is_alive()
    failing.tell("fail")
    deadline = time.monotonic() + 10
    while failing.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not failing.is_alive()
    assert [repr(e) for e in actor.failures] == [repr(ValueError("told to fail"))]
    assert not actor.stopped  # on_stop is not run for a failure, as pykka does
    assert other.ask("still served", timeout=10) == 2
    other.stop()


def test_a_base_exception_stops_the_actor_and_every_other(pool: ActorPool) -> None:
    exiting, other = _Recorder.start(pool), _Recorder.start(pool)
    exiting.tell("exit")
    deadline = time.monotonic() + 10
    while (exiting.is_alive() or other.is_alive()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not exiting.is_alive() and not other.is_alive()
    assert all(thread.is_alive() for thread in pool.threads)  # the pool serves on


def test_a_busy_actor_takes_turns_with_the_others(pool: ActorPool) -> None:
    one = ActorPool(1, name="OneThread")
    journal: list[Any] = []
    release = threading.Event()
    try:
        busy = _Recorder.start(one, journal, release)
        other = _Recorder.start(one, journal)
        assert busy.ask("warm", timeout=10) == 2 and other.ask("warm", timeout=10) == 2
        journal.clear()
        busy.tell("block")  # the only thread waits in it while the rest queue up
        for i in range(10 * BATCH):
            busy.tell(i)
        waited = other.ask("my turn", block=False)
        release.set()
        assert waited.get(timeout=10) == 3
        assert busy.ask("last", timeout=10) == 4 + 10 * BATCH
        busy.stop(timeout=10)
        other.stop(timeout=10)
    finally:
        one.stop(timeout=10)
    served = [message for _, message in journal]
    # The other actor's message is handled after one batch of the busy one's.
    assert served.index("my turn") == BATCH


def test_on_start_runs_on_the_pool_before_any_message(pool: ActorPool) -> None:
    threads_before = threading.active_count()
    refs = [_Recorder.start(pool) for _ in range(200)]
    for ref in refs:
        ref.tell("first")
    firsts = [ref.proxy().seen.get(timeout=10)[:2] for ref in refs]
    assert threading.active_count() == threads_before  # no thread of their own
    for ref in refs:
        ref.stop()
    assert firsts == [["started", "first"]] * 200
