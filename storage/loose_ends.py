"""Loose ends and open threads (migration 010): what an exchange left unaddressed.

Every read and write is scoped to the person, like the rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from storage.owners import hold

BY = ("person", "assistant")
KINDS = ("point", "question", "thread")


@dataclass(frozen=True, slots=True)
class LooseEnd:
    id: UUID
    by: str  # person | assistant
    kind: str  # point | question | thread
    text: str
    at: datetime

    def wire(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "by": self.by,
            "kind": self.kind,
            "text": self.text,
            "at": self.at.isoformat(),
        }


def _loose_end(row: asyncpg.Record) -> LooseEnd:
    return LooseEnd(row["id"], row["by"], row["kind"], row["text"], row["at"])


@dataclass(frozen=True, slots=True)
class Noted:
    """A new loose end, before it has an id."""

    by: str
    kind: str
    text: str


class LooseEndStore:
    def __init__(self, pool: asyncpg.Pool, fenced: Callable[[str, int], None]) -> None:
        self._pool = pool
        self._fenced = fenced  # told of each person a write was refused for

    async def open_ends(
        self, person: str, since: datetime, limit: int
    ) -> tuple[list[LooseEnd], list[LooseEnd]]:
        """What a turn reads as it begins, in one round trip: the person's open loose ends
        other than threads noted since `since` (the newest `limit`), and their open threads
        however old; each oldest first."""
        rows = await self._pool.fetch(
            "SELECT * FROM (SELECT * FROM loose_ends WHERE person = $1 AND closed_at IS NULL "
            "AND kind <> 'thread' AND at >= $2 ORDER BY at DESC, id LIMIT $3) recent "
            "UNION ALL SELECT * FROM loose_ends WHERE person = $1 AND kind = 'thread' "
            "AND closed_at IS NULL ORDER BY at, id",
            person,
            since,
            limit,
        )
        ends = [_loose_end(r) for r in rows]
        return [e for e in ends if e.kind != "thread"], [e for e in ends if e.kind == "thread"]

    async def threads(self, person: str) -> list[LooseEnd]:
        """The person's open threads, oldest first, however old."""
        rows = await self._pool.fetch(
            "SELECT * FROM loose_ends WHERE person = $1 AND kind = 'thread' "
            "AND closed_at IS NULL ORDER BY at, id",
            person,
        )
        return [_loose_end(r) for r in rows]

    async def settle(
        self,
        person: str,
        conversation: UUID,
        epoch: int,
        now: datetime,
        closed: Sequence[UUID],
        noted: Sequence[Noted],
    ) -> None:
        """Close the loose ends addressed and note the new ones, in one transaction, under
        the person's owner `epoch` (else Fenced, nothing changed)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await hold(conn, person, epoch, self._fenced)
            await conn.execute(
                "UPDATE loose_ends SET closed_at = $3 "
                "WHERE person = $1 AND id = ANY($2::uuid[]) AND closed_at IS NULL",
                person,
                list(closed),
                now,
            )
            await conn.executemany(
                "INSERT INTO loose_ends (id, person, conversation, by, kind, text, at) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
                [(uuid4(), person, conversation, n.by, n.kind, n.text, now) for n in noted],
            )
