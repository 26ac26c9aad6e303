"""The memory store: memories (the `cards` table), their links, and the reinforcement trace.

PostgreSQL is the source of truth; the fingerprint index is rebuilt from it. Every write
that changes what the index must hold bumps the person's generation (a trigger does it,
whoever writes), and the writes here hand back the generation they produced, so the index
can tell "my own change" from "someone else's".

The writes a conversation makes (a memory remembered or reinforced by a turn's tool, a
merge the judge decides about a memory said in it) take the person's owner epoch and are
fenced by it in their transaction (`storage.owners.hold`): a node that lost the person
writes none of them. The memories API and the passes over everyone's memories take none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import numpy as np
import orjson

from storage.fingerprints import decode
from storage.owners import hold
from storage.passes import claimed
from storage.pool import open_pool
from storage.records import Memory, MemoryDraft, MemoryLink, Reinforcement

RECOGNITION_TIERS = ("exact", "close", "shared")
# What the clean-up sweep may take: memories of these types, and muted memories of any type.
CLEANUP_CATEGORIES = ("appointment", "reminder", "task", "memo", "muted")


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
        recognition=row.get("recognition"),
    )


def _reinforcement(row: asyncpg.Record) -> Reinforcement:
    said = orjson.loads(row["draft"]) if row.get("draft") else None
    return Reinforcement(
        id=row["id"],
        person=row["person"],
        tier=row["tier"],
        score=float(row["score"]),
        new_text=row["new_text"],
        existing=row["existing"],
        new_id=row["new_id"],
        at=row["at"],
        decided_by=row.get("decided_by"),
        reason=row.get("reason"),
        draft=_draft(row["new_text"], said) if said is not None else None,
        split_into=row.get("split_into"),
    )


def _said(draft: MemoryDraft) -> str:
    """A restatement's type, people, themes and times, as its trace keeps them (jsonb)."""
    times = {k: getattr(draft, k) for k in ("starts_at", "ends_at", "due_at")}
    return orjson.dumps(
        {
            "type": draft.type,
            "people": list(draft.people),
            "themes": list(draft.themes),
            "all_day": draft.all_day,
            **{k: v.isoformat() for k, v in times.items() if v is not None},
        }
    ).decode()


def _draft(text: str, said: dict[str, Any]) -> MemoryDraft:
    def when(key: str) -> datetime | None:
        return datetime.fromisoformat(said[key]) if said.get(key) else None

    return MemoryDraft(
        text,
        said.get("type") or "fact",
        tuple(said.get("people") or ()),
        tuple(said.get("themes") or ()),
        when("starts_at"),
        when("ends_at"),
        when("due_at"),
        bool(said.get("all_day")),
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


@dataclass(frozen=True, slots=True)
class Listing:
    """What a list asks for: statuses, types, a piece of text, and where the page starts
    (after the memory `after` names, and/or `offset` rows further)."""

    statuses: tuple[str, ...] = ("active",)
    types: tuple[str, ...] = ()
    text: str | None = None
    after: tuple[datetime, UUID] | None = None
    offset: int = 0
    limit: int = 50


@dataclass(frozen=True, slots=True)
class Cleanup:
    """What a clean-up sweep takes: memories of `categories` (types, or `muted` for muted
    memories of any type), every one of them or only what is past.

    Past is what the calendar judges past: resolved (`resolved_at` set, or status done), or
    its window closed: `ends_at`, else `due_at`, else `starts_at`, before `now`; an all-day
    item's window closes with the end of its day, so it is past once the person's date
    (`today`, in their time zone) is after it. An all-day item's day is the UTC date of its
    stored time: all-day times are stored as midnight UTC of their date (`memory_draft`).
    """

    categories: frozenset[str]
    everything: bool
    now: datetime
    today: date


@dataclass(frozen=True, slots=True)
class Changed:
    """What a gesture changed, and the generation that write produced (None if it changed
    nothing the fingerprint index looks at), so the index can follow it."""

    ids: list[UUID]
    generation: int | None
    skipped: list[UUID] | None = None  # merged into another memory: left alone
    taken: list[Memory] | None = None  # what a clean-up sweep took (or would take)


class UnknownMemories(LookupError):
    """Some ids name no memory of the person (unknown, or another person's: the same)."""

    def __init__(self, ids: Sequence[UUID]) -> None:
        super().__init__(f"{len(ids)} unknown memories")
        self.ids = list(ids)


class ErroneousCorrector(ValueError):
    """A memory cannot be corrected by one that is itself erroneous."""


# Bulk gestures are one statement each: the ids the person does not own are found, and
# only if there are none is anything changed, so a bad list changes nothing. The rows are
# locked first, so an id deleted meanwhile counts as unknown rather than half-applied.
_OWNED = """
WITH found AS (
    SELECT id FROM cards WHERE person = $1 AND id = ANY($2::uuid[]) FOR UPDATE
), missing AS (
    SELECT w.id FROM unnest($2::uuid[]) AS w (id)
    WHERE NOT EXISTS (SELECT 1 FROM found f WHERE f.id = w.id)
), """
_ANSWER = """
SELECT ARRAY(SELECT id FROM missing) AS missing, ARRAY(SELECT id FROM changed) AS changed
"""
# Muting and unmuting move between active and muted only (an erroneous or done memory keeps
# its status). A memory the consolidation pass muted into another is left to `unmerge`,
# which gives its mentions back too; it is answered as skipped.
_SET_STATUS = (
    _OWNED
    + """merged AS (
    SELECT DISTINCT l.source AS id FROM memory_links l JOIN found f ON f.id = l.source
    WHERE l.kind = 'merged_into' AND $5
), changed AS (
    UPDATE cards c SET status = $3 FROM found f
    WHERE c.id = f.id AND c.status = $4 AND NOT EXISTS (SELECT 1 FROM missing)
      AND NOT EXISTS (SELECT 1 FROM merged m WHERE m.id = c.id)
    RETURNING c.id
)
SELECT ARRAY(SELECT id FROM missing) AS missing, ARRAY(SELECT id FROM changed) AS changed,
       ARRAY(SELECT m.id FROM merged m JOIN cards c ON c.id = m.id WHERE c.status = $4)
           AS skipped
"""
)
# Forgetting takes the trace along: rows about the memory go by cascade, and the rows of
# merges it went into (which quote its text) by `_TRACES`.
_TRACES = """, traces AS (
    DELETE FROM reinforcements r USING changed g WHERE r.new_id = g.id
)"""
_FORGET = (
    _OWNED
    + """changed AS (
    DELETE FROM cards c USING found f
    WHERE c.id = f.id AND NOT EXISTS (SELECT 1 FROM missing)
    RETURNING c.id
)"""
    + _TRACES
    + _ANSWER
)
_CLEANUP_WHERE = """
WHERE person = $1
  AND (kind = ANY($2::text[]) OR ($3 AND status = 'muted'))
  AND ($4 OR resolved_at IS NOT NULL OR status = 'done'
       OR (all_day AND (COALESCE(ends_at, due_at, starts_at) AT TIME ZONE 'UTC')::date < $5)
       OR (NOT all_day AND COALESCE(ends_at, due_at, starts_at) < $6))
"""


# One row per candidate, or a single row of nulls when there is none, so the generation
# always comes back.
_CANDIDATES = """
SELECT (SELECT generation FROM memory_generations WHERE person = $1) AS person_generation, c.*
FROM (VALUES (1)) AS one
LEFT JOIN cards c ON c.person = $1 AND (
    c.id = ANY($2::uuid[]) OR (c.status = 'active' AND c.text_key = memory_text_key($3))
)
ORDER BY c.created_at, c.id
"""


# Every column but the fingerprint (3.5 kB a row at 896 dimensions), for reads that only
# show memories: a search reads dozens of rows and needs none of them.
_SHOWN = (
    "c.id, c.person, c.conversation, c.kind, c.text, c.people, c.themes, c.status, "
    "c.corrected_by, c.mention_count, c.created_at, c.first_mentioned, c.last_mentioned, "
    "c.starts_at, c.ends_at, c.due_at, c.all_day, c.resolved_at, c.fingerprint_model, "
    "c.recognition"
)
# The hits' rows and the person's generation in one round trip (one row of nulls when no
# hit is found, so the generation always comes back).
_FOUND = f"""
SELECT (SELECT generation FROM memory_generations WHERE person = $1) AS person_generation,
       {_SHOWN}
FROM (VALUES (1)) AS one LEFT JOIN cards c ON c.person = $1 AND c.id = ANY($2::uuid[])
"""
# Each link from or to one of the ids, with the memory at its other end.
_NEIGHBOURS = f"""
SELECT l.source, l.target, l.kind AS link_kind, {_SHOWN}
FROM memory_links l
JOIN cards c ON c.id = CASE WHEN l.source = ANY($2::uuid[]) THEN l.target ELSE l.source END
WHERE l.person = $1 AND c.person = $1
  AND (l.source = ANY($2::uuid[]) OR l.target = ANY($2::uuid[]))
ORDER BY l.created_at, l.kind
"""


async def _insert_card(
    conn: asyncpg.Connection,
    person: str,
    draft: MemoryDraft,
    now: datetime,
    mentioned: datetime,
    conversation: UUID | None,
    fingerprint: bytes | None,
    model: str | None,
    recognition: str | None,
) -> asyncpg.Record:
    """Insert one new memory, first and last mentioned at `mentioned`; return its row."""
    return await conn.fetchrow(
        "INSERT INTO cards (id, person, conversation, kind, text, created_at, people, themes, "
        "first_mentioned, last_mentioned, starts_at, ends_at, due_at, all_day, fingerprint, "
        "fingerprint_model, recognition) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, "
        "$11, $12, $13, $14, $15, $16) RETURNING *",
        uuid4(),
        person,
        conversation,
        draft.type,
        draft.text,
        now,
        list(draft.people),
        list(draft.themes),
        mentioned,
        draft.starts_at,
        draft.ends_at,
        draft.due_at,
        draft.all_day,
        fingerprint,
        model if fingerprint is not None else None,
        recognition,
    )


class MemoryStore:
    def __init__(self, pool: asyncpg.Pool, *, owned: bool = False) -> None:
        self._pool = pool
        self._owned = owned
        # Told of each person a conversation's write was refused for (set by the node).
        self.on_fenced: Callable[[str, int], None] = lambda person, epoch: None

    async def persons_starting(self, start: str, most: int) -> list[str]:
        """The person keys that are `start` or begin with it (at most `most`), of those
        with memories or conversations: `start` alone if it is a whole key."""
        rows = await self._pool.fetch(
            "SELECT person FROM (SELECT person FROM cards UNION SELECT person FROM "
            "conversations) p WHERE starts_with(person, $1) "
            "ORDER BY person <> $1, person LIMIT $2",
            start,
            most,
        )
        keys = [r["person"] for r in rows]
        return keys[:1] if keys and keys[0] == start else keys

    async def _hold(self, conn: asyncpg.Connection, person: str, epoch: int | None) -> None:
        """A conversation's write (`epoch` given) goes on only under the person's owner."""
        if epoch is not None:
            await hold(conn, person, epoch, self.on_fenced)

    @classmethod
    async def open(cls, dsn: str, *, max_size: int = 4) -> MemoryStore:
        """A store with its own small pool (migrations are run by `Store.open`)."""
        pool = await open_pool(dsn, max_size=max_size)
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

    async def fingerprints_of(
        self, person: str, ids: Iterable[UUID], model: str, dim: int
    ) -> dict[UUID, np.ndarray]:
        """The fingerprints `model` made of the person's memories among `ids` (a memory
        without one, or with another model's, is left out)."""
        rows = await self._pool.fetch(
            "SELECT id, fingerprint FROM cards WHERE person = $1 AND id = ANY($2::uuid[]) "
            "AND fingerprint_model = $3 AND fingerprint IS NOT NULL",
            person,
            list(ids),
            model,
        )
        return {r["id"]: decode(r["fingerprint"], dim) for r in rows}

    async def active(self, person: str) -> list[Memory]:
        rows = await self._pool.fetch(
            "SELECT * FROM cards WHERE person = $1 AND status = 'active' ORDER BY created_at, id",
            person,
        )
        return [memory(r) for r in rows]

    async def candidates(
        self, person: str, ids: Iterable[UUID], text: str, model: str | None = None
    ) -> tuple[dict[UUID, Memory], dict[UUID, bytes], int]:
        """The person's memories among `ids` (the closest fingerprints), the active ones
        that may be `text` word for word (same letters and digits: found without any
        fingerprint, by the `text_key` index), the fingerprints `model` made of them, and
        the person's generation, all in one round trip: the generation tells the
        fingerprint index whether it was current."""
        rows = await self._pool.fetch(_CANDIDATES, person, list(ids), text)
        generation = int(rows[0]["person_generation"] or 0)
        found = [r for r in rows if r["id"] is not None]
        fingerprints = {
            r["id"]: r["fingerprint"]
            for r in found
            if r["fingerprint"] is not None and r["fingerprint_model"] == model
        }
        return {r["id"]: memory(r) for r in found}, fingerprints, generation

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

    async def saying(self, person: str, pattern: str, limit: int = 16) -> list[str]:
        """The texts of the person's active memories that match `pattern` (a PostgreSQL
        regular expression, case-insensitive), the most recently mentioned first: the few
        that may say the person's own name (`actors.memory.owner`)."""
        rows = await self._pool.fetch(
            "SELECT text FROM cards WHERE person = $1 AND status = 'active' AND text ~* $2 "
            "ORDER BY last_mentioned DESC LIMIT $3",
            person,
            pattern,
            limit,
        )
        return [r["text"] for r in rows]

    async def named(self, person: str, names: Sequence[str], limit: int) -> list[Memory]:
        """The person's active memories set with any of `names` (lowercase) as a person or
        a theme, the most recently mentioned first (migration 011's index)."""
        # The keys alone find the rows (they carry the person); the fence (OFFSET 0) keeps
        # the planner from starting with the person's rows instead, which on a table not
        # yet analyzed it did: 10,000 rows, each computing its keys, in 57 ms instead of
        # 0.06 through the index.
        rows = await self._pool.fetch(
            f"SELECT {_SHOWN} FROM (SELECT * FROM cards WHERE status = 'active' "
            "AND memory_name_keys(person, people, themes) && $2::text[] OFFSET 0) c "
            "WHERE c.person = $1 ORDER BY c.last_mentioned DESC, c.id DESC LIMIT $3",
            person,
            [f"{person}:{name}" for name in names],
            limit,
        )
        return [memory(r) for r in rows]

    async def found(self, person: str, ids: Iterable[UUID]) -> tuple[dict[UUID, Memory], int]:
        """The person's memories among `ids`, without fingerprints, and the person's
        generation, read together: the fingerprint index's `near` checks it was current."""
        rows = await self._pool.fetch(_FOUND, person, list(ids))
        generation = int(rows[0]["person_generation"] or 0)
        return {r["id"]: memory(r) for r in rows if r["id"] is not None}, generation

    async def neighbours(self, person: str, ids: Iterable[UUID]) -> list[tuple[MemoryLink, Memory]]:
        """Every link from or to any of `ids`, with the memory at its other end."""
        rows = await self._pool.fetch(_NEIGHBOURS, person, list(ids))
        return [(MemoryLink(r["source"], r["target"], r["link_kind"]), memory(r)) for r in rows]

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
        recognition: str | None = None,
        epoch: int | None = None,
    ) -> tuple[Memory, int]:
        """Store a new memory (and its contradiction links); return it and the generation.
        `recognition` says why it was stored although others came near. From a
        conversation, under the person's owner `epoch` (else Fenced, nothing stored)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await self._hold(conn, person, epoch)
            row = await _insert_card(
                conn, person, draft, now, now, conversation, fingerprint, model, recognition
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

    async def link(
        self,
        person: str,
        source: UUID,
        target: UUID,
        kind: str,
        now: datetime,
        epoch: int | None = None,
    ) -> None:
        """Link two of the person's memories (a `related` pair, say); no-op if linked so.
        For a memory said in a conversation (the judge's), under its owner `epoch`."""
        async with self._pool.acquire() as conn, conn.transaction():
            await self._hold(conn, person, epoch)
            await conn.execute(
                "INSERT INTO memory_links (source, target, kind, person, created_at) "
                "SELECT $1, $2, $3, $4, $5 WHERE (SELECT count(*) FROM cards "
                "WHERE person = $4 AND id IN ($1, $2)) = 2 ON CONFLICT DO NOTHING",
                source,
                target,
                kind,
                person,
                now,
            )

    async def reinforce(
        self,
        person: str,
        existing: UUID,
        *,
        tier: str,
        score: float,
        said: MemoryDraft,
        now: datetime,
        conversation: UUID | None = None,
        decided_by: str = "tier",
        reason: str | None = None,
        epoch: int | None = None,
    ) -> Memory | None:
        """Count one more mention of an active memory and trace it, with the restatement
        as `said` (so it can be split back out); None if the memory is no longer active
        (muted or forgotten meanwhile). From a conversation, under the person's owner
        `epoch` (else Fenced, nothing counted)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await self._hold(conn, person, epoch)
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
                "existing, new_id, at, decided_by, reason, draft) "
                "VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8, $9, $10::jsonb)",
                person,
                conversation,
                tier,
                score,
                said.text,
                existing,
                now,
                decided_by,
                reason,
                _said(said),
            )
        return memory(row)

    async def mentions(self, person: str, memory_id: UUID) -> list[Reinforcement]:
        """The restatements recognised as `memory_id`, and the memories still merged into
        it (by the judge or the consolidation pass), oldest first."""
        rows = await self._pool.fetch(
            "SELECT r.* FROM reinforcements r WHERE r.person = $1 AND r.existing = $2 "
            "AND ((r.new_id IS NULL AND r.tier = ANY($3::text[])) OR EXISTS (SELECT 1 FROM "
            "memory_links l WHERE l.source = r.new_id AND l.target = r.existing "
            "AND l.kind = 'merged_into')) ORDER BY r.id",
            person,
            memory_id,
            list(RECOGNITION_TIERS),
        )
        return [_reinforcement(r) for r in rows]

    async def split(
        self,
        person: str,
        mention: int,
        now: datetime,
        *,
        fingerprint: bytes | None,
        model: str | None,
    ) -> tuple[Memory, Memory, int] | None:
        """Make mention `mention` (a reinforcement of one of the person's active memories)
        a memory of its own, as it was said, in one transaction: the memory it was counted
        in gives back that mention, a `distinct` link keeps the two apart from then on, and
        the trace row points at the new memory. Returns (new, former, generation); None if
        there is no such mention, or it was split already."""
        async with self._pool.acquire() as conn, conn.transaction():
            said = await conn.fetchrow(
                "SELECT * FROM reinforcements WHERE id = $1 AND person = $2 AND new_id IS NULL "
                "AND split_into IS NULL AND tier = ANY($3::text[]) FOR UPDATE",
                mention,
                person,
                list(RECOGNITION_TIERS),
            )
            if said is None:
                return None
            trace = _reinforcement(said)
            draft = trace.draft or MemoryDraft(trace.new_text)
            former = await conn.fetchrow(
                "UPDATE cards SET mention_count = GREATEST(1, mention_count - 1) "
                "WHERE id = $1 AND person = $2 RETURNING *",
                trace.existing,
                person,
            )
            row = await _insert_card(
                conn,
                person,
                draft,
                now,
                trace.at,  # first and last mentioned when it was said
                said["conversation"],
                fingerprint,
                model,
                f"split out of {trace.existing}, where it had been counted as a mention",
            )
            await conn.execute(
                "UPDATE reinforcements SET split_into = $2 WHERE id = $1", mention, row["id"]
            )
            await conn.execute(
                "INSERT INTO memory_links (source, target, kind, person, created_at) "
                "VALUES ($1, $2, 'distinct', $3, $4) ON CONFLICT DO NOTHING",
                row["id"],
                trace.existing,
                person,
                now,
            )
            generation = await conn.fetchval(
                "SELECT generation FROM memory_generations WHERE person = $1", person
            )
        return memory(row), memory(former), int(generation)

    async def set_recognition(
        self, person: str, memory_id: UUID, note: str, epoch: int | None = None
    ) -> None:
        """Add `note` to what the memory's `recognition` says of how it was decided (the
        judge's, for a memory said in a conversation: under its owner `epoch`)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await self._hold(conn, person, epoch)
            await conn.execute(
                "UPDATE cards SET recognition = concat_ws('; ', recognition, $3::text) "
                "WHERE id = $1 AND person = $2",
                memory_id,
                person,
                note,
            )

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

    def claim(self, job: str, person: str = "") -> AbstractAsyncContextManager[bool]:
        """Whether this node may run the background pass `job` for `person` now
        (`storage.passes`): held until the block ends, on one node at a time."""
        return claimed(self._pool, job, person)

    async def dirty(self, person: str) -> bool:
        """Whether the person's memories changed since their last consolidation."""
        return bool(
            await self._pool.fetchval(
                "SELECT generation > consolidated FROM memory_generations WHERE person = $1",
                person,
            )
        )

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
        *,
        decided_by: str = "consolidation",
        reason: str | None = None,
        epoch: int | None = None,
    ) -> Changed:
        """Mute each `(id, score, tier)` of `absorbed` into `reference`, in one transaction:
        status muted, a `merged_into` link, a trace row, and the reference takes their
        mentions and their first and last mention times. Returns the ids muted (those still
        active) and the generation the write produced. For a memory said in a
        conversation (the judge's merge), under the person's owner `epoch`."""
        muted: list[UUID] = []
        async with self._pool.acquire() as conn, conn.transaction():
            await self._hold(conn, person, epoch)
            ref = await conn.fetchrow(
                "SELECT id FROM cards WHERE id = $1 AND person = $2 AND status = 'active' "
                "FOR UPDATE",
                reference,
                person,
            )
            if ref is None:
                return Changed([], None)
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
                    "new_id, at, decided_by, reason) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    person,
                    f"consolidated:{tier}",
                    score,
                    row["text"],
                    reference,
                    other,
                    now,
                    decided_by,
                    reason,
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
            generation = await self._generation_after(conn, person, muted)
        return Changed(muted, generation)

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

    # -- gestures (the memories API) ------------------------------------------------------------

    async def listing(self, person: str, query: Listing) -> tuple[list[Memory], bool]:
        """One page of the person's memories, newest-mentioned first, and whether more
        follow."""
        rows = await self._pool.fetch(
            "SELECT * FROM cards WHERE person = $1 AND status = ANY($2::text[]) "
            "AND (cardinality($3::text[]) = 0 OR kind = ANY($3::text[])) "
            "AND ($4::text IS NULL OR strpos(lower(text), lower($4::text)) > 0) "
            "AND ($5::timestamptz IS NULL OR (last_mentioned, id) < ($5::timestamptz, $6::uuid)) "
            "ORDER BY last_mentioned DESC, id DESC LIMIT $7 OFFSET $8",
            person,
            list(query.statuses),
            list(query.types),
            query.text,
            query.after[0] if query.after else None,
            query.after[1] if query.after else None,
            query.limit + 1,
            query.offset,
        )
        return [memory(r) for r in rows[: query.limit]], len(rows) > query.limit

    async def set_status(
        self, person: str, ids: Sequence[UUID], to: str, *, only_from: str
    ) -> Changed:
        """Move the person's memories among `ids` from `only_from` to `to`, in one
        statement; the others keep theirs. Raises UnknownMemories (and changes nothing) if
        any id is not the person's. Memories merged by consolidation are skipped when
        unmuting."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_SET_STATUS, person, list(ids), to, only_from, to == "active")
            return await self._changed(conn, person, row)

    async def forget(self, person: str, ids: Sequence[UUID]) -> Changed:
        """Delete the person's memories `ids` for good, in one statement, with their links
        and their reinforcement trace (merges they went into too). Raises UnknownMemories
        (and deletes nothing) if any id is not the person's."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_FORGET, person, list(ids))
            return await self._changed(conn, person, row)

    async def _changed(self, conn: asyncpg.Connection, person: str, row: asyncpg.Record) -> Changed:
        if row["missing"]:
            raise UnknownMemories(row["missing"])
        changed = list(row["changed"])
        skipped = row.get("skipped")
        generation = await self._generation_after(conn, person, changed)
        return Changed(changed, generation, list(skipped) if skipped is not None else None)

    @staticmethod
    async def _generation_after(
        conn: asyncpg.Connection, person: str, changed: Sequence[UUID]
    ) -> int | None:
        """The generation this transaction's write produced (its trigger bumped it; the
        row stays locked until commit, so nobody else's bump is mixed in)."""
        if not changed:
            return None
        value = await conn.fetchval(
            "SELECT generation FROM memory_generations WHERE person = $1", person
        )
        return int(value)

    async def mark_erroneous(
        self, person: str, memory_id: UUID, corrected_by: UUID, now: datetime
    ) -> Changed:
        """`memory_id` is wrong and `corrected_by` is right: status erroneous, the
        `corrected_by` column, and a `corrects` link (replacing any earlier correction), so
        the wrong one stays reachable from the right one. Raises UnknownMemories, or
        ErroneousCorrector if the corrector is itself erroneous; then nothing changed."""
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT id, status FROM cards WHERE person = $1 AND id = ANY($2::uuid[]) "
                "ORDER BY id FOR UPDATE",
                person,
                [memory_id, corrected_by],
            )
            status = {r["id"]: r["status"] for r in rows}
            missing = [i for i in dict.fromkeys((memory_id, corrected_by)) if i not in status]
            if missing:
                raise UnknownMemories(missing)
            if status[corrected_by] == "erroneous":
                raise ErroneousCorrector(f"memory {corrected_by} is itself erroneous")
            await conn.execute(
                "UPDATE cards SET status = 'erroneous', corrected_by = $2 WHERE id = $1",
                memory_id,
                corrected_by,
            )
            await conn.execute(
                "DELETE FROM memory_links WHERE target = $1 AND kind = 'corrects' AND source <> $2",
                memory_id,
                corrected_by,
            )
            await conn.execute(
                "INSERT INTO memory_links (source, target, kind, person, created_at) "
                "VALUES ($1, $2, 'corrects', $3, $4) ON CONFLICT DO NOTHING",
                corrected_by,
                memory_id,
                person,
                now,
            )
            changed = [memory_id] if status[memory_id] != "erroneous" else []
            return Changed(changed, await self._generation_after(conn, person, changed))

    async def cleanup(self, person: str, sweep: Cleanup, *, dry_run: bool) -> Changed:
        """Forget for good, in one statement, what `sweep` takes (a dry run only reads
        it); the memories taken are in `taken`."""
        args = (
            person,
            sorted(sweep.categories - {"muted"}),
            "muted" in sweep.categories,
            sweep.everything,
            sweep.today,
            sweep.now,
        )
        if dry_run:
            rows = await self._pool.fetch(
                f"SELECT * FROM cards {_CLEANUP_WHERE} ORDER BY last_mentioned DESC, id DESC",
                *args,
            )
            return Changed([r["id"] for r in rows], None, taken=[memory(r) for r in rows])
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                f"WITH changed AS (DELETE FROM cards {_CLEANUP_WHERE} RETURNING *){_TRACES} "
                "SELECT * FROM changed",
                *args,
            )
            ids = [r["id"] for r in rows]
            generation = await self._generation_after(conn, person, ids)
        return Changed(ids, generation, taken=[memory(r) for r in rows])

    async def forget_persons(self, pattern: str) -> int:
        """Delete every memory of the persons whose key is LIKE `pattern`, with their
        links, traces and generations: for scratch persons (the eval), never real ones."""
        async with self._pool.acquire() as conn, conn.transaction():
            deleted = await conn.execute("DELETE FROM cards WHERE person LIKE $1", pattern)
            await conn.execute("DELETE FROM reinforcements WHERE person LIKE $1", pattern)
            await conn.execute("DELETE FROM memory_generations WHERE person LIKE $1", pattern)
        return int(deleted.split()[-1])
