"""Stream events of every conversation, written many to a statement (group commit).

A turn emits a few turn-level events (ack, reply.start, reply.end...), and each used to be
a round trip of its own. Here they queue, and one writer task writes whatever queued while
the previous write was in flight: under load the events of many conversations share one
statement; on a quiet server an event is written at once. An `ack` carries the say it
acknowledges, so the say's `ack_seq` (what a resend of it is acked with) rides in the
same statement.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import orjson

log = logging.getLogger("stillhere.events")

_WRITE = """
WITH written AS (
    INSERT INTO events (conversation, seq, frame)
    SELECT c, s, f::jsonb FROM unnest($1::uuid[], $2::bigint[], $3::text[]) AS e (c, s, f)
    ON CONFLICT DO NOTHING
)
UPDATE turns SET ack_seq = a.seq
FROM unnest($4::text[], $5::text[], $6::bigint[]) AS a (person, client_id, seq)
WHERE turns.person = a.person AND turns.client_id = a.client_id
"""


@dataclass(frozen=True, slots=True)
class _Entry:
    conversation: UUID
    frame: dict[str, Any]
    person: str | None  # set on an ack: the say's owner, whose ack_seq is recorded


class EventLog:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._queue: list[_Entry] = []
        self._batch: asyncio.Future[bool] | None = None
        self._writer: asyncio.Task[None] | None = None

    def append(
        self, conversation: UUID, frame: dict[str, Any], *, acked_by: str | None = None
    ) -> asyncio.Future[bool]:
        """Queue one event. The future says, once its batch is written, whether the write
        went through (a failure is logged here, once for the batch)."""
        loop = asyncio.get_running_loop()
        if self._batch is None:
            self._batch = loop.create_future()
        self._queue.append(_Entry(conversation, frame, acked_by))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_all())
        return self._batch

    async def _write_all(self) -> None:
        while self._queue:
            entries, self._queue = self._queue, []
            batch, self._batch = self._batch, None
            assert batch is not None
            written = await self._write(entries)
            if not batch.done():
                batch.set_result(written)

    async def _write(self, entries: list[_Entry]) -> bool:
        acks = [e for e in entries if e.person is not None]
        try:
            await self._pool.execute(
                _WRITE,
                [e.conversation for e in entries],
                [e.frame["seq"] for e in entries],
                [orjson.dumps(e.frame).decode() for e in entries],
                [e.person for e in acks],
                [e.frame["id"] for e in acks],
                [e.frame["seq"] for e in acks],
            )
        except Exception:
            log.exception("%d stream events could not be written", len(entries))
            return False
        return True
