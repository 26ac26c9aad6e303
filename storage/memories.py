"""The memory store: memories (the `cards` table), their links, and the reinforcement trace.

PostgreSQL is the source of truth; the fingerprint index is rebuilt from it. Every write
that changes what the index must hold bumps the person's generation (a trigger does it,
whoever writes), and the writes here hand back the generation they produced, so the index
can tell "my own change" from "someone else's".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID, uuid4

import asyncpg

from storage.records import Memory, MemoryDraft, MemoryLink, Reinforcement

RECOGNITION_TIERS = ("exact", "close", "shared")


def memory(row: asyncpg.Record) -> Memory:
    return Memory(
        id=row["id"],
        person=row["person"],
        conversation=row["conversation"],
        type=row["kind"],
        text=row["text"],
        people=tuple(row["people"]),
        themes=tuple(row["themes"]),
        status=row["status"],
        corrected_by=row["corrected_by"],
        mention_count=row["mention_count"],
        created_at=row["created_at"],
        first_mentioned=row["first_mentioned"],
        last_mentioned=row["last_mentioned"],
        starts_at=row["starts_at"],
        ends_at=row["ends_at"],
        due_at=row["due_at"],
        all_day=row["all_day"],
        resolved_at=row["resolved_at"],
        fingerprint_model=row["fingerprint_model"],
    )


def _reinforcement(row: asyncpg.Record) -> Reinforcement:
    return Reinforcement(
        id=row["id"],
        person=row["person"],
        tier=row["tier"],
        score=float(row["score"]),
        new_text=row["new_text"],
        existing=row["existing"],
        new_id=row["new_id"],
        at=row["at"],
    )


@dataclass(frozen=True, slots=True)
class Fingerprints:
    """A person's indexable fingerprints, read in one snapshot with their generation."""

    generation: int
    ids: list[UUID]
    values: list[bytes]


@dataclass(frozen=True, slots=True)
class Unfingerprinted:
    id: UUID
    person: str
    text: str
    model: str | None  # the model of the fingerprint it has (another one), or None


class MemoryStore:
    def __init__(self, pool: asyncpg.Pool, *, owned: bool = False) -> None:
        self._pool = pool
        self._owned = owned

    @classmethod
    async def open(cls, dsn: str, *, max_size: int = 4) -> MemoryStore:
        """A store with its own small pool (migrations are run by `Store.open`)."""
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=max_size)
        return cls(pool, owned=True)

    async def close(self) -> None:
        if self._owned:
            await self._pool.close()

    # -- reading --------------------------------------------------------------------------

    async def generation(self, person: str) -> int:
        value = await self._pool.fetchval(
            "SELECT generation FROM memory_generations WHERE person = $1", person
        )
        return int(value or 0)

    async def fingerprints(self, person: str, model: str) -> Fingerprints:
        """The active memories' fingerprints of `model`, and the generation they are at."""
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            generation = await conn.fetchval(
                "SELECT generation FROM memory_generations WHERE person = $1", person
            )
            rows = await conn.fetch(
                "SELECT id, fingerprint FROM cards WHERE person = $1 AND status = 'active' "
                "AND fingerprint_model = $2 ORDER BY created_at, id",
                person,
                model,
            )
        return Fingerprints(
            int(generation or 0), [r["id"] for r in rows], [r["fingerprint"] for r in rows]
        )

    async def get(self, person: str, ids: Iterable[UUID]) -> dict[UUID, Memory]:
        """The person's memories among `ids` (another person's ids are simply not found)."""
        rows = await self._pool.fetch(
            "SELECT * FROM cards WHERE person = $1 AND id = ANY($2::uuid[])", person, list(ids)
        )
        return {r["id"]: memory(r) for r in rows}

    async def active(self, person: str) -> list[Memory]:
        rows = await self._pool.fetch(
            "SELECT * FROM cards WHERE person = $1 AND status = 'active' ORDER BY created_at, id",
            person,
        )
        return [memory(r) for r in rows]

    async def active_of_length(self, person: str, low: int, high: int) -> list[Memory]:
        """Active memories whose text is between `low` and `high` characters long: the
        few a verbatim restatement can be, found without any fingerprint."""
        rows = await self._pool.fetch(
            "SELECT * FROM cards WHERE person = $1 AND status = 'active' "
            "AND length(text) BETWEEN $2 AND $3 ORDER BY created_at, id",
            person,
            low,
            high,
        )
        return [memory(r) for r in rows]

    async def active_unfingerprinted(self, person: str, model: str) -> list[Memory]:
        """Active memories the index cannot see (no fingerprint of `model` yet)."""
        rows = await self._pool.fetch(
            "SELECT * FROM cards WHERE person = $1 AND status = 'active' "
            "AND fingerprint_model IS DISTINCT FROM $2 ORDER BY created_at, id",
            person,
            model,
        )
        return [memory(r) for r in rows]

    async def links(self, person: str, ids: Iterable[UUID]) -> list[MemoryLink]:
        """Links from or to any of `ids`."""
        rows = await self._pool.fetch(
            "SELECT source, target, kind FROM memory_links WHERE person = $1 "
            "AND (source = ANY($2::uuid[]) OR target = ANY($2::uuid[])) "
            "ORDER BY created_at, kind",
            person,
            list(ids),
        )
        return [MemoryLink(r["source"], r["target"], r["kind"]) for r in rows]

    async def reinforcements(self, person: str) -> list[Reinforcement]:
        rows = await self._pool.fetch(
            "SELECT * FROM reinforcements WHERE person = $1 ORDER BY id", person
        )
        return [_reinforcement(r) for r in rows]

    # -- writing --------------------------------------------------------------------------

    async def create(
        self,
        person: str,
        draft: MemoryDraft,
        now: datetime,
        *,
        conversation: UUID | None = None,
        fingerprint: bytes | None = None,
        model: str | None = None,
        contradicts: Sequence[UUID] = (),
    ) -> tuple[Memory, int]:
        """Store a new memory (and its contradiction links); return it and the generation."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "INSERT INTO cards (id, person, conversation, kind, text, created_at, people, "
                "themes, first_mentioned, last_mentioned, starts_at, ends_at, due_at, all_day, "
                "fingerprint, fingerprint_model) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $6, "
                "$6, $9, $10, $11, $12, $13, $14) RETURNING *",
                uuid4(),
                person,
                conversation,
                draft.type,
                draft.text,
                now,
                list(draft.people),
                list(draft.themes),
                draft.starts_at,
                draft.ends_at,
                draft.due_at,
                draft.all_day,
                fingerprint,
                model if fingerprint is not None else None,
            )
            await conn.executemany(
                "INSERT INTO memory_links (source, target, kind, person, created_at) "
                "VALUES ($1, $2, 'contradicts', $3, $4) ON CONFLICT DO NOTHING",
                [(row["id"], other, person, now) for other in contradicts],
            )
            generation = await conn.fetchval(
                "SELECT generation FROM memory_generations WHERE person = $1", person
            )
        return memory(row), int(generation)

    async def reinforce(
        self,
        person: str,
        existing: UUID,
        *,
        tier: str,
        score: float,
        new_text: str,
        now: datetime,
        conversation: UUID | None = None,
    ) -> Memory | None:
        """Count one more mention of an active memory and trace it; None if it is no longer
        active (muted or forgotten meanwhile)."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "UPDATE cards SET mention_count = mention_count + 1, "
                "last_mentioned = GREATEST(last_mentioned, $3) "
                "WHERE id = $1 AND person = $2 AND status = 'active' RETURNING *",
                existing,
                person,
                now,
            )
            if row is None:
                return None
            await conn.execute(
                "INSERT INTO reinforcements (person, conversation, tier, score, new_text, "
                "existing, new_id, at) VALUES ($1, $2, $3, $4, $5, $6, NULL, $7)",
                person,
                conversation,
                tier,
                score,
                new_text,
                existing,
                now,
            )
        return memory(row)

    async def unfingerprinted(self, model: str, limit: int) -> list[Unfingerprinted]:
        """Memories with no fingerprint of `model` (failed, or made by another model),
        oldest first. Muted ones too: they may be unmuted."""
        rows = await self._pool.fetch(
            "SELECT id, person, text, fingerprint_model FROM cards "
            "WHERE fingerprint_model IS DISTINCT FROM $1 "
            "AND status IN ('active', 'muted') ORDER BY created_at, id LIMIT $2",
            model,
            limit,
        )
        return [
            Unfingerprinted(r["id"], r["person"], r["text"], r["fingerprint_model"]) for r in rows
        ]

    async def set_fingerprint(
        self, memory_id: UUID, previous: str | None, fingerprint: bytes, model: str
    ) -> bool:
        """Fill a fingerprint in, unless someone else changed it meanwhile."""
        result = await self._pool.execute(
            "UPDATE cards SET fingerprint = $3, fingerprint_model = $4 "
            "WHERE id = $1 AND fingerprint_model IS NOT DISTINCT FROM $2",
            memory_id,
            previous,
            fingerprint,
            model,
        )
        return result.endswith(" 1")

    async def clear_fingerprints(self, person: str, ids: Sequence[UUID]) -> None:
        """Drop fingerprints that cannot be read, so the back-fill pass makes them again."""
        await self._pool.execute(
            "UPDATE cards SET fingerprint = NULL, fingerprint_model = NULL "
            "WHERE person = $1 AND id = ANY($2::uuid[])",
            person,
            list(ids),
        )

    # -- consolidation ----------------------------------------------------------------------

    async def dirty_persons(self) -> list[tuple[str, int]]:
        """Persons whose memories changed since their last consolidation, with the
        generation they are at."""
        rows = await self._pool.fetch(
            "SELECT person, generation FROM memory_generations "
            "WHERE generation > consolidated ORDER BY person"
        )
        return [(r["person"], r["generation"]) for r in rows]

    async def persons(self) -> list[str]:
        rows = await self._pool.fetch("SELECT person FROM memory_generations ORDER BY person")
        return [r["person"] for r in rows]

    async def mark_consolidated(self, person: str, generation: int) -> None:
        await self._pool.execute(
            "UPDATE memory_generations SET consolidated = GREATEST(consolidated, $2) "
            "WHERE person = $1",
            person,
            generation,
        )

    async def merge(
        self,
        person: str,
        reference: UUID,
        absorbed: Sequence[tuple[UUID, float, str]],
        now: datetime,
    ) -> list[UUID]:
        """Mute each `(id, score, tier)` of `absorbed` into `reference`, in one transaction:
        status muted, a `merged_into` link, a trace row, and the reference takes their
        mentions and their first and last mention times. Returns the ids muted (those still
        active)."""
        muted: list[UUID] = []
        async with self._pool.acquire() as conn, conn.transaction():
            ref = await conn.fetchrow(
                "SELECT id FROM cards WHERE id = $1 AND person = $2 AND status = 'active' "
                "FOR UPDATE",
                reference,
                person,
            )
            if ref is None:
                return []
            for other, score, tier in absorbed:
                row = await conn.fetchrow(
                    "UPDATE cards SET status = 'muted' WHERE id = $1 AND person = $2 "
                    "AND status = 'active' AND id <> $3 RETURNING *",
                    other,
                    person,
                    reference,
                )
                if row is None:
                    continue
                muted.append(other)
                await conn.execute(
                    "INSERT INTO memory_links (source, target, kind, person, created_at) "
                    "VALUES ($1, $2, 'merged_into', $3, $4) ON CONFLICT DO NOTHING",
                    other,
                    reference,
                    person,
                    now,
                )
                await conn.execute(
                    "INSERT INTO reinforcements (person, tier, score, new_text, existing, "
                    "new_id, at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    person,
                    f"consolidated:{tier}",
                    score,
                    row["text"],
                    reference,
                    other,
                    now,
                )
                await conn.execute(
                    "UPDATE cards SET mention_count = mention_count + $2, "
                    "first_mentioned = LEAST(first_mentioned, $3), "
                    "last_mentioned = GREATEST(last_mentioned, $4) WHERE id = $1",
                    reference,
                    row["mention_count"],
                    row["first_mentioned"],
                    row["last_mentioned"],
                )
        return muted

    async def unmerge(self, person: str, muted: UUID, now: datetime) -> UUID | None:
        """Undo a consolidation merge: the muted memory is active again, the reference gives
        back its mentions, and a `distinct` link keeps the pass from merging them again.
        Returns the reference, or None if `muted` was not merged."""
        async with self._pool.acquire() as conn, conn.transaction():
            link = await conn.fetchrow(
                "DELETE FROM memory_links WHERE source = $1 AND person = $2 "
                "AND kind = 'merged_into' RETURNING target",
                muted,
                person,
            )
            if link is None:
                return None
            reference = link["target"]
            row = await conn.fetchrow(
                "UPDATE cards SET status = 'active' WHERE id = $1 AND status = 'muted' "
                "RETURNING mention_count",
                muted,
            )
            if row is None:
                raise RuntimeError(f"memory {muted} is merged but not muted")
            # First and last mentions are recomputed from what is still merged in and the
            # reference's own reinforcements, rather than remembered: merges may be undone
            # in any order.
            await conn.execute(
                """
                UPDATE cards c SET
                    mention_count = c.mention_count - $2,
                    first_mentioned = LEAST(c.created_at, (
                        SELECT min(m.first_mentioned) FROM memory_links l
                        JOIN cards m ON m.id = l.source
                        WHERE l.target = c.id AND l.kind = 'merged_into')),
                    last_mentioned = GREATEST(c.created_at, (
                        SELECT max(m.last_mentioned) FROM memory_links l
                        JOIN cards m ON m.id = l.source
                        WHERE l.target = c.id AND l.kind = 'merged_into'), (
                        SELECT max(r.at) FROM reinforcements r
                        WHERE r.existing = c.id AND r.tier = ANY($3::text[])))
                WHERE c.id = $1
                """,
                reference,
                row["mention_count"],
                list(RECOGNITION_TIERS),
            )
            await conn.execute(
                "INSERT INTO memory_links (source, target, kind, person, created_at) "
                "VALUES ($1, $2, 'distinct', $3, $4) ON CONFLICT DO NOTHING",
                muted,
                reference,
                person,
                now,
            )
            await conn.execute(
                "INSERT INTO reinforcements (person, tier, score, new_text, existing, new_id, "
                "at) SELECT $1, 'unmerged', 0, text, $2, $3, $4 FROM cards WHERE id = $3",
                person,
                reference,
                muted,
                now,
            )
        return reference

    async def forget_persons(self, pattern: str) -> int:
        """Delete every memory of the persons whose key is LIKE `pattern`, with their
        links, traces and generations: for scratch persons (the eval), never real ones."""
        async with self._pool.acquire() as conn, conn.transaction():
            deleted = await conn.execute("DELETE FROM cards WHERE person LIKE $1", pattern)
            await conn.execute("DELETE FROM reinforcements WHERE person LIKE $1", pattern)
            await conn.execute("DELETE FROM memory_generations WHERE person LIKE $1", pattern)
        return int(deleted.split()[-1])
