"""Says of every conversation, stored many to a statement (group commit).

Storing a say is the one write a turn waits on before anything else can happen (its `ack`
means "stored"), so under load the says of many conversations share one statement rather
than queueing for the pool one round trip each.

A say comes again, with its id, when its write took longer than the caller waited
(`--store-timeout`: the say was answered `unavailable` and the client resent it). If that
write is still queued or in flight, the resend joins it rather than queueing another: an
overloaded PostgreSQL gets each say once, however often its phone retries, instead of a
queue that grows with every retry and so never drains below the timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from storage.group_commit import GroupCommit
from storage.owners import FENCE
from storage.pool import DiskSpace

# Each say's row, in the order given: `owned` is false when the say's epoch is no longer its
# person's (storage/owners.py), `live` when its conversation has ended or is not owned (then
# nothing is stored); a null `id` with `live` true means the say was stored before (its id
# came again). The person's context generation rides along: the say's turn needs it next.
# `FOR SHARE` holds an archive back until the says are in: a say is never stored into a
# conversation that has ended, and an ending waits for no more than one batch. The
# conversation's row is locked, not updated, for a say stored: its last activity is its last
# turn's (`Store`). A resent say is activity too but makes no turn: its time goes onto the
# row, so the sweep, a restart and the admin API all count it.
_ADD_SAYS = """
WITH s AS (
    SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::text[], $5::text[],
                         $6::bigint[], $7::bigint[])
        WITH ORDINALITY AS s (conversation, at, person, client_id, text, place, epoch, n)
), owned AS ({fence}), first AS (
    SELECT DISTINCT ON (person, client_id) * FROM s ORDER BY person, client_id, n
), live AS (
    SELECT c.id FROM conversations c
    WHERE c.id IN (SELECT conversation FROM s) AND c.status = 'active'
      AND c.person IN (SELECT person FROM owned)
    FOR SHARE
), added AS (
    INSERT INTO turns (conversation, person, role, client_id, text, at, place)
    SELECT f.conversation, f.person, 'user', f.client_id, f.text, f.at, f.place
    FROM first f JOIN live ON live.id = f.conversation
    WHERE (f.person, f.epoch) IN (SELECT person, epoch FROM owned) ORDER BY f.n
    ON CONFLICT (person, client_id) WHERE client_id IS NOT NULL DO NOTHING
    RETURNING *
), resent AS (
    UPDATE conversations c SET last_activity = r.at
    FROM (
        SELECT s.conversation, max(s.at) AS at FROM s JOIN live ON live.id = s.conversation
        WHERE NOT EXISTS (
            SELECT 1 FROM added a WHERE a.person = s.person AND a.client_id = s.client_id
        )
        GROUP BY s.conversation
    ) r
    WHERE c.id = r.conversation AND c.last_activity < r.at
)
SELECT s.n, (s.person, s.epoch) IN (SELECT person, epoch FROM owned) AS owned,
       live.id IS NOT NULL AS live,
       g.generation AS context_generation, added.*
FROM s
LEFT JOIN live ON live.id = s.conversation
LEFT JOIN first f ON f.n = s.n
LEFT JOIN added ON added.person = f.person AND added.client_id = f.client_id
LEFT JOIN context_generations g ON g.person = s.person
ORDER BY s.n
""".format(fence=FENCE.format(persons="$3", epochs="$7"))


# What makes a say's write the same write: its row's key, in the conversation and under the
# owner epoch it was written for (its row's `owned` and `live` depend on those two).
_Key = tuple[UUID, str, str, int]


@dataclass(frozen=True, slots=True)
class _Say:
    conversation: UUID
    person: str
    client_id: str
    text: str
    at: datetime
    place: int
    epoch: int
    stored: asyncio.Future[asyncpg.Record]

    @property
    def key(self) -> _Key:
        return (self.conversation, self.person, self.client_id, self.epoch)


def _seen(stored: asyncio.Future[asyncpg.Record]) -> None:
    """Mark a refusal as seen: a caller that gave up on the say (its store timeout) has
    answered and logged it already, and asyncio would report it again, as never retrieved,
    for every say of the batch. A caller still waiting gets the error all the same."""
    if not stored.cancelled():
        stored.exception()


class SayLog(GroupCommit[list[_Say]]):
    def __init__(self, pool: asyncpg.Pool, space: DiskSpace) -> None:
        super().__init__()
        self._pool = pool
        self._space = space
        self._queue: list[_Say] = []
        self._unwritten: dict[_Key, _Say] = {}  # queued or in flight
        self.on_joined: Callable[[], None] = lambda: None  # told of each say that joined

    def add(
        self,
        conversation: UUID,
        person: str,
        client_id: str,
        text: str,
        at: datetime,
        place: int,
        epoch: int,
    ) -> asyncio.Future[asyncpg.Record]:
        """Queue a say (`place`: `records.say_place`) made under the person's `epoch`; the
        future holds its row once its batch is written, or the error that refused it.

        A say whose write is still queued or in flight gets that write's future, shared:
        callers shield it, so that one giving up does not cancel it for the others. Its row
        is the first write's (its text, time and place; `id` set if that write stored it)."""
        pending = self._unwritten.get((conversation, person, client_id, epoch))
        if pending is not None:
            self.on_joined()
            return pending.stored
        stored: asyncio.Future[asyncpg.Record] = asyncio.get_running_loop().create_future()
        stored.add_done_callback(_seen)
        say = _Say(conversation, person, client_id, text, at, place, epoch, stored)
        self._unwritten[say.key] = say
        self._queue.append(say)
        self._kick()
        return stored

    def _take(self) -> list[_Say] | None:
        if not self._queue:
            return None
        batch, self._queue = self._queue, []
        return batch

    async def _write(self, batch: list[_Say]) -> None:
        try:
            await self._settle(batch)
        finally:  # settled in this same step: a say coming again from now on is written again
            for say in batch:
                del self._unwritten[say.key]

    async def _settle(self, batch: list[_Say]) -> None:
        try:
            rows = await self._pool.fetch(
                _ADD_SAYS,
                [s.conversation for s in batch],
                [s.at for s in batch],
                [s.person for s in batch],
                [s.client_id for s in batch],
                [s.text for s in batch],
                [s.place for s in batch],
                [s.epoch for s in batch],
            )
            if len(rows) != len(batch):
                raise RuntimeError(f"{len(rows)} rows back for {len(batch)} says")
        except Exception as error:  # each say's caller says what it cost
            self._space.note(error)
            for say in batch:
                if not say.stored.done():
                    say.stored.set_exception(error)
            return
        self._space.note(None)
        for say, row in zip(batch, rows, strict=True):
            if not say.stored.done():
                say.stored.set_result(row)
