"""The directory: person -> live conversation, on the loop side.

It opens a conversation on demand (one per person, even when two links race: a per-person
lock serialises opening), resumes from PostgreSQL when the conversation is still within the
resume window, and otherwise archives it and starts a new one. Among several nodes on one
PostgreSQL, it first takes the person (actors/ownership.py), asking the node that has them
to hand over, and hands its own over when asked: their links are closed with `moved`, and
the conversation is let go once its turn is over.

A live conversation's actor runs while it has work. One with nothing to do for
`--actor-idle` is deactivated: the actor stops, while its stream (seq, replay buffer, links)
and the person's lease stay here. The next message for it activates an actor from the
database, once, however many messages arrive meanwhile: they wait, in order, for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import pykka

from actors.archive import archive, mark_archived, write_summary
from actors.conversation import ConversationActor, conversation_actor
from actors.jobs import Jobs
from actors.memory.consolidation import scheduled_pass
from actors.messages import Attach, CardsWithdrawn, End, Interrupt, Park, Snapshot
from actors.ownership import Ownership
from actors.runtime import ActorFailed, Reply, Runtime
from actors.stream import ConversationStream, Frame, Link
from providers.slices import in_slices
from storage.owners import Fenced
from storage.records import ConversationRecord

log = logging.getLogger("stillhere.directory")

CLOSE_MOVED = 4001  # the conversation moved to another node, or this one is stopping
MOVED: Frame = {"type": "bye", "reason": "moved"}
# How long a turn under way may go on once its person is handed over (its reply is stored
# and replayed by the next owner); then it is cut, as an interrupt would.
HANDOFF_GRACE_S = 2.0
# Conversations the quiet-actor pass looks at between two yields to the loop: a few
# milliseconds should every one of them be deactivated, a fraction of one otherwise.
SCAN_SLICE = 200


class Draining(Exception):
    """This node is stopping (SIGTERM): it starts no conversation, the person's next hello
    goes to another node."""


class ConversationGone(Exception):
    """The conversation's actor has stopped (ended, parked): nothing will answer."""


class LiveConversation:
    """The stable address of a live conversation: its actor may be replaced, deactivated
    and activated again; this stays, with the stream."""

    def __init__(
        self, directory: Directory, person: str, conversation: UUID, stream: ConversationStream
    ) -> None:
        self.person = person
        self.id = conversation
        self.stream = stream
        self.ref: pykka.ActorRef[ConversationActor] | None = None
        # The actor's state as of its last message, published by the actor after each one:
        # a hello reads it here instead of asking the actor's thread, if it is current.
        self.snapshot: Snapshot | None = None
        self.told = 0  # messages delivered to the actor; counted on the loop only
        self.ending = False  # set on the loop as `End` is sent, before the actor sees it
        self.released = False  # set as it is let go: a deactivated one is not woken again
        # While an actor is being activated, the messages told meanwhile, in order; None
        # otherwise. With `ref` None too, the conversation is deactivated.
        self.waiting: list[object] | None = None
        self.unlinked_since: datetime | None = None
        self.is_gone = False  # set once let go (ended or parked)
        # What `wait_gone` waits on, made only then: most conversations are never waited
        # for, and an Event would hold a 0.5 KB deque for each.
        self._gone: asyncio.Future[None] | None = None
        self._directory = directory

    @property
    def active(self) -> bool:
        """An actor runs for it, or is being activated."""
        return self.ref is not None or self.waiting is not None

    def tell(self, message: object) -> bool:
        """Deliver to the current actor, activating one first if the conversation is
        deactivated; on the loop. False if nothing will answer."""
        if self.ref is None:
            return self._directory.wake(self, message)
        try:
            self.ref.tell(message)
            self.told += 1
            return True
        except pykka.ActorDeadError:
            dropped(message)
            return False

    def deactivate(self) -> None:
        """Stop the actor; the conversation stays, its actor to be activated by the next
        message. Only once the actor has handled every message it was told."""
        ref, self.ref = self.ref, None
        self.snapshot, self.told = None, 0
        if ref is not None:
            ref.stop(block=False)

    def run_actor(self, rt: Runtime, record: ConversationRecord) -> None:
        """Start the conversation's actor (on the runtime's pool, or a thread of its own),
        first or in place of a failed one; the count of messages told starts again with it."""
        self.told = 0
        self.ref = conversation_actor(rt).start(rt, record, self)

    def current_snapshot(self) -> Snapshot | None:
        """The published snapshot if the actor has handled every message told to it, so
        nothing it was told is missing (a turn that ended just before a phone's reconnect,
        a say acked just before it); else None, and the caller asks the actor."""
        snapshot = self.snapshot
        return snapshot if snapshot is not None and snapshot.handled == self.told else None

    async def ask(self, make: Callable[[Reply], object], timeout: float = 30.0) -> Any:
        reply = Reply(asyncio.get_running_loop())
        if not self.tell(make(reply)):
            raise ConversationGone(str(self.id))
        return await reply.wait(timeout)

    async def wait_gone(self) -> None:
        """Until it is let go."""
        if self.is_gone:
            return
        if self._gone is None:
            self._gone = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._gone)  # a waiter that gives up leaves it to the others

    def set_gone(self) -> None:
        self.is_gone = True
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)

    def report_failure(self, error: BaseException) -> None:
        """Called from the thread that served the failed actor: the supervisor replaces it."""
        self._directory.actor_failed(self, error)

    async def finish(self, reason: str, reply: Reply | None) -> None:
        await self._directory.finish(self, reason, reply)


def dropped(message: object) -> None:
    log.info("a %s for a stopped conversation was dropped", type(message).__name__)


@dataclass(frozen=True, slots=True)
class Opened:
    live: LiveConversation
    resumed: bool
    age_s: float | None
    snapshot: Snapshot


class Directory:
    def __init__(self, rt: Runtime, ownership: Ownership) -> None:
        self._rt = rt
        self.ownership = ownership
        ownership.on_handoff = self._asked_for
        ownership.on_lost = self._lost
        ownership.on_sure = self._sure_again
        ownership.on_takeover = lambda after: rt.metrics.takeovers.labels(after=after).inc()
        rt.store.on_fenced = self._fenced
        rt.store.says.on_joined = rt.metrics.resends_joined.inc
        if rt.memory is not None:  # memories a turn's tools write are fenced too
            rt.memory.store.on_fenced = self._fenced
        rt.metrics.node.info({"node": ownership.node})
        self._live: dict[str, LiveConversation] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._background = Jobs()  # summaries, awaited by `stop_all`
        self.on_failure: Callable[[LiveConversation, BaseException], None] | None = None
        # Set on SIGTERM, before the conversations are handed over: no new ones start here.
        self.draining = False
        self.deactivated = 0  # since the last sweep, which reports it
        rt.metrics.watch(
            live_actors=self.active_count,
            actor_threads=self.actor_threads,
            conversations=lambda: len(self),
            links=self.link_count,
        )

    def __len__(self) -> int:
        return len(self._live)

    def get(self, person: str) -> LiveConversation | None:
        return self._live.get(person)

    def lives(self) -> list[LiveConversation]:
        """Every live conversation, for the admin API (a copy: it may change meanwhile)."""
        return list(self._live.values())

    def link_count(self) -> int:
        return sum(len(live.stream.links) for live in self._live.values())

    def active_count(self) -> int:
        """Conversations whose actor runs (or is being activated)."""
        return sum(live.active for live in self._live.values())

    def actor_threads(self) -> int:
        """Threads serving the conversation actors: the pool's, or one per running actor."""
        pool = self._rt.actor_pool
        return len(pool.threads) if pool is not None else self.active_count()

    def _lock(self, person: str) -> asyncio.Lock:
        lock = self._locks.get(person)
        if lock is None:
            lock = self._locks[person] = asyncio.Lock()
        return lock

    # -- activation -----------------------------------------------------------------------

    async def open(self, person: str) -> Opened:
        """The person's conversation: resumed within the window, else a new one."""
        opened = await self._open(person, create=True)
        assert opened is not None
        return opened

    async def resume(self, person: str) -> Opened | None:
        """The person's conversation if it is within the window; never starts one."""
        return await self._open(person, create=False)

    async def _open(self, person: str, *, create: bool) -> Opened | None:
        async with self._lock(person):
            live = self._live.get(person)
            if live is not None:
                snapshot = live.current_snapshot() or await live.ask(Attach)
                age = self._age(snapshot.last_activity)
                if live.ending or snapshot.ending:  # open afresh once it is gone
                    await asyncio.wait_for(live.wait_gone(), timeout=120.0)
                elif age < self._rt.settings.resume_window_s:
                    return self._resumed(live, age, snapshot)
                else:
                    await self.end(live, "idle")
            return await self._activate(person, create)

    async def _activate(self, person: str, create: bool) -> Opened | None:
        """Take the person, then resume or start; they are released again if nothing
        started (or starting failed). A draining node takes no one."""
        if self.draining:
            raise Draining(person)
        epoch = await self.ownership.take(person)
        opened = None
        try:
            opened = await self._load(person, epoch, create)
        finally:
            if opened is None:
                await self.ownership.release(person, epoch)
        return opened

    async def _load(self, person: str, epoch: int, create: bool) -> Opened | None:
        rt = self._rt
        record = await rt.store.active_conversation(person, rt.settings.window_turns)
        if record is not None:
            age = self._age(record.last_activity)
            if age < rt.settings.resume_window_s:
                live = await self._start(record, epoch)
                log.info(
                    "resuming conversation %s from the database, age %d s", str(live.id)[:8], age
                )
                return self._resumed(live, age, await live.ask(Attach))
            if await rt.store.archive(record.id, "idle", rt.clock.now(), person, epoch):
                rt.metrics.archives.labels(reason="idle").inc()
                self._background.start(write_summary(rt, record.id, "idle"), "a summary")
        if not create:
            return None
        now = rt.clock.now()
        conversation = await rt.store.create_conversation(person, now, epoch)
        record = ConversationRecord(conversation, person, now, now, None, None, 0)
        live = await self._start(record, epoch)
        log.info("new conversation %s", str(conversation)[:8])
        return Opened(live, False, None, await live.ask(Attach))

    def _resumed(self, live: LiveConversation, age: float, snapshot: Snapshot) -> Opened:
        # Logged by the link's hello, not here: an SSE client's every POST opens too.
        return Opened(live, True, age, snapshot)

    async def _start(self, record: ConversationRecord, epoch: int) -> LiveConversation:
        person = record.person
        stream = await ConversationStream.open(
            self._rt.store, record.id, person, epoch=epoch, sure=self.ownership.sure
        )
        live = LiveConversation(self, record.person, record.id, stream)
        live.unlinked_since = self._rt.clock.now()
        live.run_actor(self._rt, record)
        self._live[record.person] = live
        return live

    def _age(self, last_activity: datetime) -> float:
        return (self._rt.clock.now() - last_activity).total_seconds()

    def withdraw(self, person: str, ids: list[UUID]) -> None:
        """Memories left the active set: the live conversation drops them from its cards
        (a deactivated one has none: it reads them afresh as it is activated)."""
        live = self._live.get(person)
        if live is not None and live.active:
            live.tell(CardsWithdrawn(frozenset(ids)))

    # -- deactivating and activating ------------------------------------------------------

    async def deactivate_quiet(self) -> int:
        """Deactivate every actor that has had nothing to do for `--actor-idle`; how many.
        The look at an actor's snapshot and its deactivation are one step on the loop, so
        no message can reach it in between; the loop is yielded to after every
        `SCAN_SLICE` conversations (at 10,000 a pass took 5 ms, and deactivating 3,000
        of them 70 to 100 ms)."""
        idle_s = self._rt.settings.actor_idle_s
        if idle_s <= 0:
            return 0
        count = 0
        async for part in in_slices(list(self._live.values()), SCAN_SLICE):
            now = self._rt.clock.now()
            count += sum(self._deactivate_if_quiet(live, now, idle_s) for live in part)
        self.deactivated += count
        self._rt.metrics.deactivations.inc(count)
        return count

    def _deactivate_if_quiet(self, live: LiveConversation, now: datetime, idle_s: float) -> bool:
        quiet = self._quiet_for(live, now)
        if quiet is None or quiet < idle_s:
            return False
        live.deactivate()
        log.debug(
            "deactivated conversation %s, quiet %d s, %d links",
            str(live.id)[:8],
            quiet,
            len(live.stream.links),
        )
        return True

    def _quiet_for(self, live: LiveConversation, now: datetime) -> float | None:
        """Seconds the actor has had nothing to do, as its snapshot says: None if it has
        something, has not handled every message told to it, or is leaving."""
        if live.ref is None or live.ending or live.released:
            return None
        snapshot = live.current_snapshot()
        since = None if snapshot is None else snapshot.quiet_since()
        return None if since is None else (now - since).total_seconds()

    async def keep_deactivating(self) -> None:
        """Deactivate quiet actors every quarter of `--actor-idle`, until cancelled."""
        idle_s = self._rt.settings.actor_idle_s
        if idle_s <= 0:
            return
        while True:
            await asyncio.sleep(max(idle_s / 4, 0.05))
            try:
                await self.deactivate_quiet()
            except Exception:  # the next round tries again: a dead loop would keep every actor
                log.exception("deactivating quiet actors failed")

    def wake(self, live: LiveConversation, message: object) -> bool:
        """`message` for a deactivated conversation: it waits for the actor, whose
        activation starts with the first message; False if the conversation is going."""
        if live.waiting is None:
            if live.ending or live.released:
                dropped(message)
                return False
            live.waiting = []
            self._background.start(self._activate_actor(live), "activating a conversation")
        live.waiting.append(message)
        return True

    async def _activate_actor(self, live: LiveConversation) -> None:
        """Start an actor for a deactivated conversation from its record, then hand it the
        messages that waited. If the record cannot be read, they are answered with
        `ActorFailed` (a say is resent, a hello said again) and the next message tries
        again."""
        rt = self._rt
        started = time.monotonic()
        try:
            await live.stream.written()
            record = await rt.store.active_conversation(live.person, rt.settings.window_turns)
        except Exception as error:
            log.warning("conversation %s not activated: %r", str(live.id)[:8], error)
            _fail_waiting(live, ActorFailed(f"not activated: {error!r}"))
            return
        if record is None or record.id != live.id or live.released:
            log.warning("conversation %s not activated: it is over", str(live.id)[:8])
            _fail_waiting(live, ConversationGone(str(live.id)))
            if not live.released:
                await self._let_go(live)
            return
        waiting, live.waiting = live.waiting or [], None
        live.run_actor(rt, record)
        for message in waiting:
            live.tell(message)
        rt.metrics.activations.inc()
        log.debug(
            "activated conversation %s in %.1f ms, %d messages waited",
            str(live.id)[:8],
            (time.monotonic() - started) * 1000,
            len(waiting),
        )

    # -- links ----------------------------------------------------------------------------

    async def attach(
        self,
        live: LiveConversation,
        link: Link,
        welcome: Frame,
        last_seq: int | None,
        *,
        hello_since: float,
    ) -> int:
        """Attach `link` after its hello (read at `hello_since`, monotonic): welcome, replay,
        then live events; the hello is counted and timed here."""
        live.unlinked_since = None
        replayed = await live.stream.attach(link, welcome, last_seq)
        # Counted here, not in open(): an SSE client's every POST say opens too.
        metrics = self._rt.metrics
        outcome = "resumed" if welcome.get("resumed") else "new"
        metrics.hellos.labels(outcome=outcome).inc()
        metrics.hello_seconds.labels(outcome=outcome).observe(time.monotonic() - hello_since)
        metrics.replayed_events.inc(replayed)
        return replayed

    def detach(self, live: LiveConversation, link: Link) -> None:
        live.stream.detach(link)
        if not live.stream.links:
            live.unlinked_since = self._rt.clock.now()

    # -- ending, parking, replacing -------------------------------------------------------

    async def end(self, live: LiveConversation, reason: str) -> bool:
        """Archive now (leave, idle); True once done, False if it was already ending. A
        deactivated conversation has nothing under way: it is finished without an actor."""
        if live.ending:
            return False
        live.ending = True
        if not live.active:
            return await self._finish(live, reason)
        return bool(await live.ask(lambda reply: End(reason, reply), timeout=120.0))

    async def finish(self, live: LiveConversation, reason: str, reply: Reply | None) -> None:
        """The actor's last act, run on the loop: archive, say bye, let go. The summary (a
        model call) is written meanwhile: the person who left does not wait for it; a clean
        shutdown does. If archiving fails, the conversation stays active in the
        database and the next sweep retries."""
        archived = await self._finish(live, reason)
        if reply is not None:
            reply.resolve(archived)

    async def _finish(self, live: LiveConversation, reason: str) -> bool:
        """`finish`; whether the conversation was archived."""
        await live.stream.written()  # the last reply with the rest: the summary reads them
        try:
            archived = await mark_archived(
                self._rt, live.id, reason, live.person, live.stream.epoch
            )
        except Fenced:
            archived = False  # another node owns the person: theirs to end
        except Exception:
            log.exception("archiving conversation %s failed", str(live.id)[:8])
            archived = False
        if archived:
            self._background.start(write_summary(self._rt, live.id, reason), "a summary")
        live.stream.farewell({"type": "bye", "reason": reason})
        await self._let_go(live)
        return archived

    async def park(self, live: LiveConversation) -> bool:
        """Stop an actor with no link for a while; its state is in the database."""
        if not await self._parkable(live):
            return False
        await self._let_go(live)
        log.info("parked conversation %s (no link attached)", str(live.id)[:8])
        return True

    async def _parkable(self, live: LiveConversation) -> bool:
        """Whether the conversation can be let go now, its actor (if one runs) refusing
        says from here on; a deactivated one has nothing under way."""
        return not live.active or bool(await live.ask(Park))

    async def _let_go(self, live: LiveConversation) -> None:
        # Until its record is whole, a hello finds it leaving and waits (`gone`) rather than
        # rehydrate without its last reply.
        live.released = True
        await live.stream.written()
        if self._live.get(live.person) is live:
            del self._live[live.person]
            self._rt.context_cache.drop(live.person)
            if self._rt.memory is not None:
                self._rt.memory.drop(live.person)
        await live.stream.close()
        if live.ref is not None:
            live.ref.stop(block=False)
        await self.ownership.release(live.person, live.stream.epoch)
        live.set_gone()

    def actor_failed(self, live: LiveConversation, error: BaseException) -> None:
        """Thread-safe: hand the failure to whoever supervises (or replace directly)."""
        log.error("conversation actor %s failed: %r", str(live.id)[:8], error)
        if self.on_failure is not None:
            self.on_failure(live, error)

    async def replace(self, live: LiveConversation) -> bool:
        """Start a fresh actor for a failed one, from the database, on the same stream."""
        rt = self._rt
        await live.stream.written()  # its last reply may still be on its way to the record
        record = await rt.store.active_conversation(live.person, rt.settings.window_turns)
        if record is None or record.id != live.id or self._live.get(live.person) is not live:
            await self._let_go(live)
            return False
        live.run_actor(rt, record)
        log.info("replaced the actor of conversation %s from the database", str(live.id)[:8])
        return True

    # -- other nodes ----------------------------------------------------------------------

    def _asked_for(self, person: str) -> None:
        """Another node has a hello for `person` (storage/owners.py, HANDOFF)."""
        self._rt.metrics.handoffs.labels(stage="asked").inc()
        self._background.start(self.hand_over(person), "a handoff")

    async def hand_over(self, person: str, grace: float = HANDOFF_GRACE_S) -> None:
        """Close the person's links with `moved` (their phones reconnect at once, to
        whichever node has their route), let the conversation go once its turn is over (or
        after `grace`, cut as an interrupt would), and release the person."""
        async with self._lock(person):
            live = self._live.get(person)
            if live is None:
                await self.ownership.release(person)  # an earlier run of this node's, maybe
                return
            live.stream.farewell(MOVED, CLOSE_MOVED)
            await self._park_within(live, grace)
            self._rt.metrics.handoffs.labels(stage="done").inc()
            log.info("handed conversation %s over", str(live.id)[:8])

    async def hand_over_when_idle(self, person: str, grace: float = HANDOFF_GRACE_S) -> None:
        """`hand_over` for a node that stops: the person's links stay open while the turn
        under way ends (within `grace`), so its reply reaches them live rather than in the
        next node's replay, and the phone is moved only once the conversation is parked:
        the next node takes it at once instead of waiting for this one. A turn still going
        after `grace` is cut, as `hand_over` cuts one, and the person moved."""
        async with self._lock(person):
            live = self._live.get(person)
            if live is None:
                return
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if await self._parkable(live):  # says are refused from now: resent elsewhere
                    live.stream.farewell(MOVED, CLOSE_MOVED)
                    await self._let_go(live)
                    log.info("handed conversation %s over once idle", str(live.id)[:8])
                    return
                await asyncio.sleep(0.05)
            live.stream.farewell(MOVED, CLOSE_MOVED)
            live.tell(Interrupt())  # its turn had its grace: cut, stored as sent
            await self._park_within(live, grace)
            log.info("handed conversation %s over, its turn cut", str(live.id)[:8])

    async def _park_within(self, live: LiveConversation, grace: float) -> None:
        """Park once idle: within `grace`, then within `grace` again after an interrupt;
        then stop the actor whatever it is doing."""
        for _ in range(2):
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if await self.park(live):
                    return
                await asyncio.sleep(0.05)
            live.tell(Interrupt())
        await self._stop(live)

    def _fenced(self, person: str, epoch: int) -> None:
        """A write for `person` was refused by the fence (storage/store.py, `on_fenced`)."""
        self._rt.metrics.fenced_writes.inc()
        self.ownership.fenced(person, epoch)

    def _lost(self, person: str) -> None:
        """Another node took `person` while this one ran their conversation: close their
        links with `moved` and let it go; its writes are fenced from now on."""
        live = self._live.get(person)
        if live is not None:
            live.stream.farewell(MOVED, CLOSE_MOVED)
            self._background.start(self._drop(live), "letting a lost conversation go")

    async def _drop(self, live: LiveConversation) -> None:
        async with self._lock(live.person):
            if live.active:
                live.tell(Interrupt())
            await self._stop(live)

    async def _stop(self, live: LiveConversation) -> None:
        if live.ref is not None:
            await stop_actors([live.ref])
        await self._let_go(live)

    def _sure_again(self, person: str) -> None:
        live = self._live.get(person)
        if live is not None:
            live.stream.catch_up()

    # -- sweeping -------------------------------------------------------------------------

    async def sweep(self) -> dict[str, Any]:
        """Archive conversations idle past the window (live here, or left by a node that
        stopped or moved on: taken first, so only one node archives each), park actors
        that have had no link for a while, and deactivate quiet ones."""
        rt = self._rt
        now = rt.clock.now()
        before = now - timedelta(seconds=rt.settings.resume_window_s)
        archived = 0
        for conversation, person in await rt.store.idle_conversations(before):
            async with self._lock(person):
                live = self._live.get(person)
                if live is not None and live.id == conversation:
                    archived += await self.end(live, "idle")
                elif live is None:
                    archived += await self._archive_unowned(conversation, person)
        parked = 0
        for live in list(self._live.values()):
            since = live.unlinked_since
            if since is not None and (now - since).total_seconds() >= rt.settings.park_after_s:
                async with self._lock(live.person):  # a hello waits rather than race us
                    parked += await self.park(live)
        await self.deactivate_quiet()
        report: dict[str, Any] = {
            "at": now.isoformat(),
            "archived": archived,
            "parked": parked,
            "deactivated": self.deactivated,  # since the last sweep
            "live": len(self),
            "active": self.active_count(),
        }
        self.deactivated = 0
        if rt.memory is not None:
            report["memory"] = await scheduled_pass(rt.memory)
        return report

    async def _archive_unowned(self, conversation: UUID, person: str) -> bool:
        """Archive a conversation no node runs; False if one does (it sweeps it)."""
        epoch = await self.ownership.try_take(person)
        if epoch is None:
            return False
        try:
            return await archive(self._rt, conversation, "idle", person, epoch)
        finally:
            await self.ownership.release(person, epoch)

    async def stop_all(self, drain_s: float) -> None:
        """Shut down: hand every conversation over (links closed with `moved` once its
        turn under way is over, or cut after the grace), within `drain_s` in all; what is left
        then is cut and let go. Conversations stay resumable, on any node."""
        lives = list(self._live.values())
        handing = [asyncio.ensure_future(self.hand_over_when_idle(live.person)) for live in lives]
        if handing:
            _, late = await asyncio.wait(handing, timeout=drain_s)
            for task in late:
                task.cancel()
        lives = list(self._live.values())
        for live in lives:
            if live.active:
                live.tell(Interrupt())  # a streaming reply is cut and stored as sent
        await self._rt.settle(timeout=5.0)
        await stop_actors([live.ref for live in lives if live.ref is not None])
        for live in lives:
            await self._let_go(live)
        await self.settle()

    async def settle(self) -> None:
        """Wait for the background jobs started so far (summaries); failures are logged."""
        await self._background.settle()


def _fail_waiting(live: LiveConversation, error: BaseException) -> None:
    """Answer the messages that waited for an activation that failed; the next message
    tries again."""
    waiting, live.waiting = live.waiting or [], None
    for message in waiting:
        reply = getattr(message, "reply", None)
        if isinstance(reply, Reply):
            reply.fail(error)
        else:
            dropped(message)


async def stop_actors(refs: list[pykka.ActorRef[Any]], timeout: float = 10.0) -> None:
    """Stop actors without blocking the loop: the waiting happens in a worker thread."""
    stopping = [ref.stop(block=False) for ref in refs]

    def wait() -> None:
        for future in stopping:
            future.get(timeout=timeout)

    await asyncio.get_running_loop().run_in_executor(None, wait)
