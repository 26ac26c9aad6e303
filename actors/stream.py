"""A conversation's outbound stream: seq numbering, replay buffer, fan-out to links.

It lives on the loop side so that each streamed delta reaches the links without crossing
into the actor's thread. It outlives links (they attach and detach) and even a failed actor
(a replacement takes over the same stream); it ends with the conversation or when the
actor is parked.

Seq numbers are reserved from PostgreSQL in blocks, so after `kill -9` a restarted server
starts above anything the dead one could have sent: seq never repeats, though it may jump.
Turn-level events (all but `reply.delta`) are also written to the events table, so a link
that comes back after the buffer is gone still gets every reply whole (`reply.end` holds
the whole text).
The replay buffer (`actors.replay`) holds the last events, every seq from its oldest on.

Every write is made under the epoch of this node's ownership of the person
(`actors/ownership.py`), and while this node cannot be sure it still owns them (its lease
could not be renewed in time) events are numbered and kept but not sent: they go out when
the lease is renewed, or never from here if another node took the person over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol
from uuid import UUID

from actors.loose_ends import KeptEnds
from actors.replay import Frame, ReplayBuffer
from actors.trace import Traces
from storage.event_log import ReplyRow
from storage.owners import Fenced
from storage.store import Store

Sure = Callable[[str], bool]  # does this node still surely own this person?

log = logging.getLogger("stillhere.stream")


class Link(Protocol):
    """One client link as the stream sees it: somewhere to queue frames."""

    name: str

    def send(self, frame: Frame) -> None: ...

    def flush(self) -> None:
        """Write now what was sent so far, rather than with the rest of the loop step's."""

    def end(self, code: int = 1000) -> None: ...


class ConversationStream:
    # Slots, not a dict: every conversation held, running or deactivated, has one.
    __slots__ = (
        "_block",
        "_buffer",
        "_ceiling",
        "_reserving",
        "_store",
        "_sure",
        "_unsent_after",
        "_unwritten",
        "conversation",
        "epoch",
        "last_seq",
        "links",
        "loose_ends",
        "ordering",
        "person",
        "traces",
    )

    def __init__(
        self,
        store: Store,
        conversation: UUID,
        person: str,
        last_seq: int,
        ceiling: int,
        *,
        epoch: int,
        sure: Sure,
        block: int,
        buffer_size: int,
    ) -> None:
        self.conversation = conversation
        self.person = person
        self.epoch = epoch
        self._sure = sure
        self._unsent_after: int | None = None  # held back from here on while unsure
        self.last_seq = last_seq
        # Attached, oldest first: a list, as a person has a few at most (most often one),
        # and a dict of one link holds a table of eight.
        self.links: list[Link] = []
        self.ordering = asyncio.Lock()  # says are stored and acked one at a time, in order
        self._store = store
        self._ceiling = ceiling
        self._block = block
        self._buffer = ReplayBuffer(buffer_size)
        # Turn-level events handed to the event log and not yet written, oldest first: a
        # list, as a few are at most, and an empty deque holds a 0.5 KB block for every
        # conversation, quiet or not.
        self._unwritten: list[tuple[Frame, asyncio.Future[bool]]] = []
        self._reserving: asyncio.Task[None] | None = None
        # The last turns' traces (actors/trace.py), for the admin API; they go with the stream.
        self.traces = Traces()
        # The person's open loose ends, as the turns last read them (actors/loose_ends.py).
        self.loose_ends = KeptEnds()

    @classmethod
    async def open(
        cls,
        store: Store,
        conversation: UUID,
        person: str,
        *,
        epoch: int,
        sure: Sure,
        block: int = 1000,
        buffer_size: int = 2000,
    ) -> ConversationStream:
        """Reserve a first block of seqs above anything handed out before (Fenced if
        `epoch` is no longer the person's)."""
        ceiling = await store.raise_seq_ceiling(conversation, person, epoch, block)
        return cls(
            store,
            conversation,
            person,
            ceiling - block,
            ceiling,
            epoch=epoch,
            sure=sure,
            block=block,
            buffer_size=buffer_size,
        )

    # -- sending --------------------------------------------------------------------------

    def emit(self, type_: str, **fields: Any) -> Frame:
        """Number an event, keep it for replay, send it to every attached link. Turn-level
        events go to the event log."""
        self.last_seq += 1
        frame: Frame = {"type": type_, "seq": self.last_seq, **fields}
        self._buffer.append(frame)
        if type_ != "reply.delta":
            self._write(frame)
        if self.last_seq > self._ceiling - self._block // 2:
            self._kick_reservation()
        if self._unsent_after is None and not self._sure(self.person):
            self._unsent_after = self.last_seq - 1
            log.warning("conversation %s held back: its lease is unconfirmed", self._short)
        if self._unsent_after is None:
            for link in self.links:
                link.send(frame)
        return frame

    def catch_up(self) -> None:
        """The lease is confirmed: send what was held back meanwhile."""
        after = self._unsent_after
        if after is None or not self._sure(self.person):
            return
        self._unsent_after = None
        held = self._buffer.after(after)
        for link in self.links:
            for frame in held:
                link.send(frame)
        log.info("conversation %s sent %d events held back", self._short, len(held))

    @property
    def _short(self) -> str:
        return str(self.conversation)[:8]

    def end_reply(self, row: ReplyRow, **fields: Any) -> Frame:
        """Emit `reply.end` with its reply's turn queued beside it: the two are written in
        one statement, and neither waits for the other. So the phone hears the end as soon
        as the reply is done, and a crash before the write loses that reply whole (from the
        record and the replay alike), the one DESIGN allows. Whatever reads this
        conversation's record back awaits `written()` first."""
        self._store.events.add_reply(replace(row, epoch=self.epoch))
        return self.emit("reply.end", **fields)

    def farewell(self, frame: Frame, code: int = 1000) -> None:
        """Send a last frame outside the numbered stream (`bye`, a `revoked` error) and
        close every link with `code`."""
        for link in self.links:
            link.send(frame)
            link.end(code)
        self.links.clear()

    # -- links ----------------------------------------------------------------------------

    async def attach(self, link: Link, welcome: Frame, last_seq: int | None) -> int:
        """Send `welcome`, then every event after `last_seq`, then live events; in order.

        Returns how many events were replayed. The buffer holds every seq from its oldest
        one to `self.last_seq` without a hole (ended replies' deltas are folded, not
        dropped), so one number decides where the events table is needed: the seqs after
        `last_seq` and below the buffer's oldest are read from it (turn-level events only:
        there, deltas are gone and each `reply.end` carries its whole text), plus any not yet
        written; the rest come from the buffer. The read is repeated if the buffer moved on
        while it ran, and everything after the last read happens in one loop step, so no
        event can slip between the replay and the live stream, or be sent twice. Events held
        back while the lease is unconfirmed are not replayed: `catch_up` sends them to
        every link, this one too.
        """
        self.catch_up()
        if last_seq is not None:
            self.confirm(last_seq)
        stored: list[Frame] = []
        after = last_seq
        while after is not None and after + 1 < self._oldest():
            below = self._oldest()
            stored += await self._stored_between(after, below)
            after = below - 1
        sent = self.last_seq if self._unsent_after is None else self._unsent_after
        link.send({**welcome, "seq": sent})
        replay = [] if after is None else stored + self._buffer.after(after)
        replay = [f for f in replay if f["seq"] <= sent]  # held back: `catch_up` sends them
        for frame in replay:
            link.send(frame)
        link.flush()  # the phone waits on its welcome; the loop step may have more to do
        self.links.append(link)
        return len(replay)

    def _oldest(self) -> int:
        return self._buffer.oldest(self.last_seq + 1)

    async def _stored_between(self, after: int, below: int) -> list[Frame]:
        """Turn-level events with `after < seq < below`, written or still on their way."""
        stored = await self._store.events_between(self.conversation, after, below)
        pending = [f for f, _ in self._unwritten if after < f["seq"] < below]
        if not pending:
            return stored
        by_seq = {f["seq"]: f for f in stored} | {f["seq"]: f for f in pending}
        return [by_seq[seq] for seq in sorted(by_seq)]

    def confirm(self, seq: int) -> None:
        """A client has every event up to `seq`: the buffer lets them go, so a conversation's
        memory stays that of what its phone has not yet seen, whatever its age."""
        self._buffer.trim(min(seq, self.last_seq))

    def detach(self, link: Link) -> None:
        if link in self.links:
            self.links.remove(link)

    def shed(self, keep: int, frame: Frame, code: int) -> None:
        """Close the oldest links, with `frame` then `code`, until fewer than `keep` are
        left: room for one more under a person's link limit. The oldest go first: a link
        a phone has left without closing is the likeliest to be dead."""
        while self.links and len(self.links) >= keep:
            oldest = self.links.pop(0)
            oldest.send(frame)
            oldest.end(code)

    @property
    def buffered(self) -> int:
        """Events replayable without a database read (shown by the admin API): every seq
        from the buffer's oldest to the last, each folded delta counted as one."""
        return len(self._buffer)

    # -- persistence ----------------------------------------------------------------------

    def _write(self, frame: Frame) -> None:
        written = self._store.events.append(self.conversation, self.person, self.epoch, frame)
        self._unwritten.append((frame, written))
        written.add_done_callback(self._forget_written)

    def _forget_written(self, _: asyncio.Future[bool]) -> None:
        # The event log writes its batches in order, so the written ones are at the front.
        unwritten, written = self._unwritten, 0
        while written < len(unwritten) and unwritten[written][1].done():
            written += 1
        del unwritten[:written]

    def _kick_reservation(self) -> None:
        if self._reserving is None or self._reserving.done():
            self._reserving = asyncio.get_running_loop().create_task(self._reserve())

    async def _reserve(self) -> None:
        try:
            self._ceiling = await self._store.raise_seq_ceiling(
                self.conversation, self.person, self.epoch, self._block
            )
        except Fenced:  # another node owns the person: this stream is being let go
            return
        if self.last_seq > self._ceiling:
            log.warning("seq %d ran past its reserved ceiling %d", self.last_seq, self._ceiling)

    async def written(self) -> None:
        """Wait until every event emitted so far is written (or its write has failed): after
        an `ack`, the ack itself, which a resend of that id is acked with again. A waiter
        that gives up (a say past `--store-timeout`) leaves the write's future to the others."""
        if self._unwritten:
            await asyncio.shield(self._unwritten[-1][1])

    def after_written(self, callback: Callable[[], object]) -> None:
        """Call `callback` on the loop once every event emitted so far is written (or its
        write has failed), without a task waiting for it."""
        if self._unwritten:
            self._unwritten[-1][1].add_done_callback(lambda _: callback())
        else:
            callback()

    async def close(self) -> None:
        """Flush pending events and give back the seqs reserved but unused."""
        if self._reserving is not None:
            await self._reserving
        await self.written()
        await self._store.set_seq_ceiling(self.conversation, self.person, self.epoch, self.last_seq)
        self.links.clear()
