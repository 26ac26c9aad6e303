"""The reads behind context assembly (actors/context.py), one query per source.

Each is one round trip on its own pooled connection, so the sources can run at the same
time. Muted memories never leave these queries: the filter is in the SQL, not downstream,
so no later step can forget it. Memories of type `summary` are left out of every list of
facts: a conversation's summary belongs to the recent-conversations section only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from storage.records import LAST_FIRST, TALK_ORDER, Turn

# The memory columns a context line needs; never the fingerprint (it is large).
_MEMORY_COLUMNS = "id, kind, text, mention_count, last_mentioned"
_FACTS = "status = 'active' AND kind <> 'summary'"


@dataclass(frozen=True, slots=True)
class PastConversation:
    """An archived conversation as the context lists it."""

    id: UUID
    summary: str | None
    last_activity: datetime
    turns: int


@dataclass(frozen=True, slots=True)
class ContextMemory:
    """A memory as the context lists it: enough for one line and a stable order."""

    id: UUID
    kind: str
    text: str
    mention_count: int
    last_mentioned: datetime


def _memory(row: asyncpg.Record) -> ContextMemory:
    return ContextMemory(
        row["id"], row["kind"], row["text"], row["mention_count"], row["last_mentioned"]
    )


class ContextReads:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def generation(self, person: str) -> int:
        """The person's context generation: it moves with every change to what the other
        reads return (storage/migrations/006); 0 before the first."""
        value = await self._pool.fetchval(
            "SELECT generation FROM context_generations WHERE person = $1", person
        )
        return int(value or 0)

    async def past_conversations(self, person: str, limit: int) -> list[PastConversation]:
        """The person's latest archived conversations, newest first, with their turn counts."""
        rows = await self._pool.fetch(
            "SELECT c.id, c.summary, c.last_activity, "
            "(SELECT count(*) FROM turns t WHERE t.conversation = c.id) AS turns "
            "FROM conversations c WHERE c.person = $1 AND c.status = 'archived' "
            "ORDER BY c.last_activity DESC, c.id DESC LIMIT $2",
            person,
            limit,
        )
        return [
            PastConversation(r["id"], r["summary"], r["last_activity"], r["turns"]) for r in rows
        ]

    async def last_turns(self, conversation: UUID, limit: int) -> list[Turn]:
        """The last `limit` turns of a conversation, in the order they were said."""
        rows = await self._pool.fetch(
            "SELECT role, text, at, interrupted FROM (SELECT * FROM turns "
            f"WHERE conversation = $1 ORDER BY {LAST_FIRST} LIMIT $2) t ORDER BY {TALK_ORDER}",
            conversation,
            limit,
        )
        return [Turn(r["role"], r["text"], r["at"], interrupted=r["interrupted"]) for r in rows]

    async def working(self, conversation: UUID) -> list[ContextMemory]:
        """The memories made or reinforced in this conversation, oldest first."""
        rows = await self._pool.fetch(
            f"SELECT {_MEMORY_COLUMNS} FROM cards WHERE {_FACTS} AND (conversation = $1 OR id IN "
            "(SELECT existing FROM reinforcements WHERE conversation = $1)) "
            "ORDER BY created_at, id",
            conversation,
        )
        return [_memory(r) for r in rows]

    async def mentioned_since(
        self, person: str, since: datetime, limit: int
    ) -> list[ContextMemory]:
        """Memories mentioned at or after `since`, latest mention first."""
        rows = await self._pool.fetch(
            f"SELECT {_MEMORY_COLUMNS} FROM cards WHERE person = $1 AND {_FACTS} "
            "AND last_mentioned >= $2 ORDER BY last_mentioned DESC, id DESC LIMIT $3",
            person,
            since,
            limit,
        )
        return [_memory(r) for r in rows]

    async def most_mentioned_before(
        self, person: str, before: datetime, limit: int
    ) -> list[ContextMemory]:
        """The rest: memories last mentioned before `before`, most mentioned first."""
        rows = await self._pool.fetch(
            f"SELECT {_MEMORY_COLUMNS} FROM cards WHERE person = $1 AND {_FACTS} "
            "AND last_mentioned < $2 "
            "ORDER BY mention_count DESC, last_mentioned DESC, id DESC LIMIT $3",
            person,
            before,
            limit,
        )
        return [_memory(r) for r in rows]
