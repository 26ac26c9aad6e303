"""The memory keeper's background pass runs once per person across nodes: two keepers on
one PostgreSQL (each with its own pool, as two nodes have), sweeping at the same time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from actors.clock import ManualClock
from actors.memory.consolidation import maintain
from actors.memory.keeper import MemoryKeeper
from storage.records import MemoryDraft
from tests.fakes.embeddings_server import FakeEmbeddings
from tests.memory_support import close_memory, open_memory

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
PERSONS = [f"p-pass-{i}" for i in range(6)]
FACTS = ("Owen likes tea.", "The car is blue.", "Mia plays the cello.")


@pytest.fixture
async def keepers(
    dsn: str, fake_embeddings: FakeEmbeddings, clock: ManualClock
) -> AsyncIterator[tuple[MemoryKeeper, MemoryKeeper]]:
    (one, a), (two, b) = [await open_memory(dsn, fake_embeddings.url, clock) for _ in "ab"]
    yield a, b
    await close_memory(one, a)
    await close_memory(two, b)


async def _dirty(db: asyncpg.Connection) -> list[str]:
    rows = await db.fetch(
        "SELECT person FROM memory_generations WHERE generation > consolidated ORDER BY person"
    )
    return [r["person"] for r in rows]


async def test_two_nodes_sweeping_at_once_consolidate_each_person_once(
    keepers: tuple[MemoryKeeper, MemoryKeeper], db: asyncpg.Connection
) -> None:
    a, b = keepers
    for person in PERSONS:
        for fact in FACTS:
            await a.remember(person, MemoryDraft(fact))
    assert await _dirty(db) == PERSONS

    reports = await asyncio.gather(maintain(a), maintain(b))

    assert sum(r.persons for r in reports) == len(PERSONS)
    assert await _dirty(db) == []


async def test_a_person_another_node_is_consolidating_is_skipped_until_it_is_done(
    keepers: tuple[MemoryKeeper, MemoryKeeper], db: asyncpg.Connection
) -> None:
    a, b = keepers
    busy, free = PERSONS[:2]
    for person in (busy, free):
        await a.remember(person, MemoryDraft(FACTS[0]))

    async with b.store.claim("consolidation", busy) as held:
        assert held
        report = await maintain(a)
        assert report.persons == 1 and await _dirty(db) == [busy]
        async with a.store.claim("consolidation", busy) as again:
            assert not again  # one node at a time

    assert (await maintain(a)).persons == 1
    assert await _dirty(db) == []


async def test_the_fingerprint_back_fill_runs_on_one_node_at_a_time(
    keepers: tuple[MemoryKeeper, MemoryKeeper], db: asyncpg.Connection
) -> None:
    a, b = keepers
    for fact in FACTS:
        await a.store.create(PERSONS[0], MemoryDraft(fact), NOW)  # no fingerprint
    missing = "SELECT count(*) FROM cards WHERE fingerprint IS NULL"

    async with b.store.claim("backfill") as held:
        assert held
        assert (await maintain(a)).fingerprints_filled == 0
        assert await db.fetchval(missing) == len(FACTS)

    assert (await maintain(a)).fingerprints_filled == len(FACTS)
    assert await db.fetchval(missing) == 0
