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
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Protocol
from uuid import UUID

from storage.store import Store

log = logging.getLogger("stillhere.stream")

Frame = dict[str, Any]


class Link(Protocol):
    """One client link as the stream sees it: somewhere to queue frames."""

    name: str

    def send(self, frame: Frame) -> None: ...

    def end(self, code: int = 1000) -> None: ...


class ConversationStream:
    def __init__(
        self,
        store: Store,
        conversation: UUID,
        last_seq: int,
        ceiling: int,
        *,
        block: int,
        buffer_size: int,
    ) -> None:
        self.conversation = conversation
        self.last_seq = last_seq
        self.links: set[Link] = set()
        self.ordering = asyncio.Lock()  # says are stored and acked one at a time, in order
        self._store = store
        self._ceiling = ceiling
        self._block = block
        self._buffer: deque[Frame] = deque(maxlen=buffer_size)
        self._unsaved: list[Frame] = []
        self._saver: asyncio.Task[None] | None = None
        self._reserving: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, store: Store, conversation: UUID, *, block: int = 1000, buffer_size: int = 2000
    ) -> ConversationStream:
        """Reserve a first block of seqs above anything handed out before."""
        ceiling = await store.raise_seq_ceiling(conversation, block)
        return cls(
            store, conversation, ceiling - block, ceiling, block=block, buffer_size=buffer_size
        )

    # -- sending --------------------------------------------------------------------------

    def emit(self, type_: str, **fields: Any) -> Frame:
        """Number an event, keep it for replay, send it to every attached link."""
        self.last_seq += 1
        frame: Frame = {"type": type_, "seq": self.last_seq, **fields}
        self._buffer.append(frame)
        if type_ != "reply.delta":
            self._unsaved.append(frame)
            self._kick_saver()
        if self.last_seq > self._ceiling - self._block // 2:
            self._kick_reservation()
        for link in self.links:
            link.send(frame)
        return frame

    def farewell(self, frame: Frame) -> None:
        """Send a last frame outside the numbered stream (`bye`) and close every link."""
        for link in self.links:
            link.send(frame)
            link.end()
        self.links.clear()

    # -- links ----------------------------------------------------------------------------

    async def attach(self, link: Link, welcome: Frame, last_seq: int | None) -> int:
        """Send `welcome`, then every event after `last_seq`, then live events; in order.

        Returns how many events were replayed. Everything after the database read happens
        in one loop step, so no event can slip between the replay and the live stream.
        """
        stored: list[Frame] = []
        if last_seq is not None:
            oldest = self._buffer[0]["seq"] if self._buffer else self.last_seq + 1
            if last_seq + 1 < oldest:
                stored = await self._store.events_between(self.conversation, last_seq, oldest)
        link.send({**welcome, "seq": self.last_seq})
        replay = stored
        if last_seq is not None:
            after = stored[-1]["seq"] if stored else last_seq
            replay = stored + [f for f in self._buffer if f["seq"] > after]
        for frame in replay:
            link.send(frame)
        self.links.add(link)
        return len(replay)

    def detach(self, link: Link) -> None:
        self.links.discard(link)

    @property
    def buffered(self) -> int:
        """Events held for replay without a database read (shown by the admin API)."""
        return len(self._buffer)

    # -- persistence ----------------------------------------------------------------------

    def _kick_saver(self) -> None:
        if self._saver is None or self._saver.done():
            self._saver = asyncio.get_running_loop().create_task(self._save())

    async def _save(self) -> None:
        while self._unsaved:
            frames, self._unsaved = self._unsaved, []
            await self._store.save_events(self.conversation, frames)

    def _kick_reservation(self) -> None:
        if self._reserving is None or self._reserving.done():
            self._reserving = asyncio.get_running_loop().create_task(self._reserve())

    async def _reserve(self) -> None:
        self._ceiling = await self._store.raise_seq_ceiling(self.conversation, self._block)
        if self.last_seq > self._ceiling:
            log.warning("seq %d ran past its reserved ceiling %d", self.last_seq, self._ceiling)

    async def close(self) -> None:
        """Flush pending events and give back the seqs reserved but unused."""
        for task in (self._saver, self._reserving):
            if task is not None:
                await task
        await self._save()
        await self._store.set_seq_ceiling(self.conversation, self.last_seq)
        self.links.clear()
