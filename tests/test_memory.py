"""The memory keeper against a real PostgreSQL: fingerprint failures and their back-fill,
the index's consistency with the database, search by meaning, consolidation and unmerge."""

from __future__ import annotations

import asyncio
import os
import threading
from uuid import UUID

import asyncpg
import pytest

from actors.clock import ManualClock
from actors.memory.consolidation import consolidate, maintain, unmerge
from actors.memory.keeper import MemoryKeeper
from providers.compute import limit_compute_threads
from storage.fingerprints import encode
from storage.records import Memory, MemoryDraft
from tests.fakes.embeddings_server import Fail, FakeEmbeddings
from tests.memory_support import MODEL, Script, close_memory, open_memory

PERSON = "person-hannah"
OWEN = MemoryDraft("My brother Owen lives in Bristol.", "fact", ("owen",), ("family", "bristol"))
LISBON = MemoryDraft("The trip is to Lisbon.", "fact", (), ("trip",))
PORTO = MemoryDraft("The trip is to Porto.", "fact", (), ("trip",))
TEA = MemoryDraft("Hannah prefers tea to coffee.", "preference", ("hannah",), ("drinks",))


async def another_keeper(dsn: str, fake: FakeEmbeddings, clock: ManualClock) -> MemoryKeeper:
    """A second keeper on the same database: a restarted server, or the CLI beside one."""
    _, keeper = await open_memory(dsn, fake.url, clock)
    return keeper


# -- fingerprints that fail ----------------------------------------------------------------


async def test_a_failed_fingerprint_is_logged_stored_and_filled_in_later(
    keeper: MemoryKeeper,
    fake_embeddings: FakeEmbeddings,
    script: Script,
    db: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    again = MemoryDraft("Owen, my brother, lives in Bristol.", "fact", ("owen",))
    script.close_to(OWEN.text, again.text, 0.9)
    fake_embeddings.queue(Fail(503, "overloaded"))
    first = await keeper.remember(PERSON, OWEN)

    assert first.created and not first.fingerprinted
    assert "fingerprint failed (http_503)" in caplog.text
    row = await db.fetchrow("SELECT fingerprint, fingerprint_model FROM cards")
    assert tuple(row) == (None, None)

    assert await keeper.backfill() == 1
    row = await db.fetchrow("SELECT fingerprint, fingerprint_model FROM cards")
    assert row["fingerprint_model"] == MODEL and len(row["fingerprint"]) == 64 * 4
    assert "fingerprint back-fill: 1 memories fingerprinted" in caplog.text
    assert await keeper.backfill() == 0  # nothing left

    outcome = await keeper.remember(PERSON, again)  # now the rewording is recognised
    assert (outcome.created, outcome.tier, outcome.memory.id) == (False, "close", first.memory.id)


async def test_a_failing_back_fill_changes_nothing(
    keeper: MemoryKeeper, fake_embeddings: FakeEmbeddings, db: asyncpg.Connection
) -> None:
    fake_embeddings.queue(Fail(500), Fail(500))
    await keeper.remember(PERSON, OWEN)
    assert await keeper.backfill() == 0
    assert await db.fetchval("SELECT count(*) FROM cards WHERE fingerprint IS NULL") == 1


async def test_fingerprints_of_another_model_are_made_again(
    keeper: MemoryKeeper, db: asyncpg.Connection
) -> None:
    made = await keeper.remember(PERSON, OWEN)
    await db.execute(
        "UPDATE cards SET fingerprint = $1, fingerprint_model = 'old-model'",
        encode([1.0, 0.0, 0.0]),
    )
    assert await keeper.index.search(PERSON, (await keeper.fingerprint([OWEN.text]))[0], 3) == []
    assert await keeper.backfill() == 1
    hits = await keeper.index.search(PERSON, (await keeper.fingerprint([OWEN.text]))[0], 3)
    assert [h[0] for h in hits] == [made.memory.id]


# -- the index and the database --------------------------------------------------------------


async def test_a_restarted_index_gives_the_same_answers(
    dsn: str, keeper: MemoryKeeper, fake_embeddings: FakeEmbeddings, clock: ManualClock
) -> None:
    drafts = [OWEN, LISBON, PORTO, TEA] + [
        MemoryDraft(f"Memory number {i} about the garden.", "memo", (), ("garden",))
        for i in range(20)
    ]
    for draft in drafts:
        await keeper.remember(PERSON, draft)
    queries = await keeper.fingerprint([d.text for d in drafts[:6]])
    before = [await keeper.index.search(PERSON, q, 5) for q in queries]

    restarted = await another_keeper(dsn, fake_embeddings, clock)
    try:
        after = [await (await restarted.ready()).search(PERSON, q, 5) for q in queries]
        assert [[i for i, _ in hits] for hits in after] == [[i for i, _ in b] for b in before]
        assert [[round(s, 5) for _, s in hits] for hits in after] == [
            [round(s, 5) for _, s in b] for b in before
        ]
        assert restarted.index.builds == 1
    finally:
        await restarted.store.close()
        await restarted.embedder.close()


async def test_the_index_follows_writes_made_elsewhere(
    keeper: MemoryKeeper, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """A mute by SQL (a gesture, the CLI) is seen at the next look-up: never stale."""
    owen = await keeper.remember(PERSON, OWEN)
    await keeper.remember(PERSON, TEA)
    builds = keeper.index.builds
    query = (await keeper.fingerprint([OWEN.text]))[0]
    assert (await keeper.index.search(PERSON, query, 1))[0][0] == owen.memory.id
    assert keeper.index.builds == builds  # own writes were applied, not rebuilt

    await db.execute("UPDATE cards SET status = 'muted' WHERE id = $1", owen.memory.id)
    hits = await keeper.index.search(PERSON, query, 5)
    assert owen.memory.id not in {i for i, _ in hits}
    assert keeper.index.builds == builds + 1

    # Bumping mentions does not move the generation: no rebuild for a reinforcement.
    await db.execute("UPDATE cards SET mention_count = 7")
    await keeper.index.search(PERSON, query, 5)
    assert keeper.index.builds == builds + 1


async def test_a_search_that_reads_its_rows_notices_a_stale_index(
    keeper: MemoryKeeper, db: asyncpg.Connection
) -> None:
    """`search_then` reads the generation with the rows: a write made elsewhere since the
    index was built is noticed there, and the index is rebuilt before anything is decided."""
    owen = await keeper.remember(PERSON, OWEN)
    await keeper.remember(PERSON, TEA)
    query = (await keeper.fingerprint([OWEN.text]))[0]
    reads: list[list[UUID]] = []

    async def read(ids: list[UUID]) -> tuple[dict[UUID, Memory], int]:
        reads.append(ids)
        found, _, generation = await keeper.store.candidates(PERSON, ids, "")
        return found, generation

    builds = keeper.index.builds
    hits, rows = await keeper.index.search_then(PERSON, query, 1, read)
    assert [i for i, _ in hits] == [owen.memory.id] == list(rows)
    assert (keeper.index.builds, len(reads)) == (builds, 1)  # current: one read, no rebuild

    await db.execute("UPDATE cards SET status = 'muted' WHERE id = $1", owen.memory.id)
    hits, rows = await keeper.index.search_then(PERSON, query, 5, read)
    assert owen.memory.id not in {i for i, _ in hits} and owen.memory.id not in rows
    assert (keeper.index.builds, len(reads)) == (builds + 1, 3)  # stale: rebuilt, read again


async def test_indexes_are_dropped_and_capped(
    dsn: str, fake_embeddings: FakeEmbeddings, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    store, keeper = await open_memory(dsn, fake_embeddings.url, clock, max_persons=2)
    try:
        for person in ("p-one", "p-two", "p-three"):
            await keeper.remember(person, OWEN)
        index = keeper.index
        assert "p-one" not in index and {"p-two", "p-three"} <= {
            p for p in ("p-two", "p-three") if p in index
        }
        assert "evicted (over 2 persons)" in caplog.text
        keeper.drop("p-two")
        assert "p-two" not in index and len(index) == 1
        again = await keeper.remember("p-one", OWEN)  # rebuilt from the database
        assert not again.created
    finally:
        await close_memory(store, keeper)


async def test_index_work_in_worker_threads_starts_no_openmp_threads(
    dsn: str, fake_embeddings: FakeEmbeddings, clock: ManualClock
) -> None:
    """With the numeric libraries at one thread, as the server sets them on its loop, a
    search in a worker thread runs on that thread alone: OpenMP keeps its size per thread,
    and a worker left at the default kept a team of its own (a thread for each core beyond
    the first) for as long as it lived. (On a machine of one core there is no team to
    start, and nothing to tell.)"""
    limit_compute_threads(1)
    store, keeper = await open_memory(dsn, fake_embeddings.url, clock, offload_above=0)
    persons = [f"p-{n}" for n in range(4)]
    try:
        before = _native_threads()
        for person in persons:
            await keeper.remember(person, OWEN)
        query = (await keeper.fingerprint([OWEN.text]))[0]
        for _ in range(3):  # at once, so several of the executor's threads take a search
            await asyncio.gather(*(keeper.index.search(p, query, 1) for p in persons))
        assert _native_threads() == before
    finally:
        await close_memory(store, keeper)


def _native_threads() -> int:
    """The process's threads that Python did not start."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


async def test_an_unreadable_fingerprint_is_an_error_never_a_silent_skip(
    keeper: MemoryKeeper, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    made = await keeper.remember(PERSON, OWEN)
    keeper.drop(PERSON)
    await db.execute("UPDATE cards SET fingerprint = '\\x0102'::bytea")
    query = (await keeper.fingerprint([OWEN.text]))[0]
    assert await keeper.index.search(PERSON, query, 3) == []
    assert f"fingerprint of memory {made.memory.id} is unreadable (wrong_length" in caplog.text
    assert await db.fetchval("SELECT fingerprint FROM cards") is None  # queued for back-fill
    assert await keeper.backfill() == 1
    assert (await keeper.index.search(PERSON, query, 3))[0][0] == made.memory.id


# -- consolidation ---------------------------------------------------------------------------


async def store_as_is(keeper: MemoryKeeper, draft: MemoryDraft) -> MemoryDraft:
    """Store without recognition, as duplicates were stored before it worked."""
    vector = (await keeper.fingerprint([draft.text]))[0]
    memory, _ = await keeper.store.create(
        PERSON, draft, keeper.clock.now(), fingerprint=encode(vector), model=keeper.model
    )
    return memory  # type: ignore[return-value]


async def one_merge_of_three(
    keeper: MemoryKeeper, drafts: tuple[MemoryDraft, ...], db: asyncpg.Connection
) -> dict[str, str]:
    """Store `drafts` as is, run the pass, check it muted exactly one of the three into
    another; the statuses by text."""
    for draft in drafts:
        await store_as_is(keeper, draft)
    merges = await consolidate(keeper, PERSON)
    assert len(merges) == 1 and len(merges[0].muted) == 1
    statuses = {r["text"]: r["status"] for r in await db.fetch("SELECT text, status FROM cards")}
    assert sorted(statuses.values()) == ["active", "active", "muted"]
    return statuses


async def test_consolidation_mutes_duplicates_into_the_most_complete(
    keeper: MemoryKeeper,
    script: Script,
    db: asyncpg.Connection,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # In the shared tier from the longest, which says no more than a word traded ("brother"):
    # one that said more would be left to the judge.
    short = MemoryDraft("Owen lives near the harbour in Bristol.", "fact", ("owen",))
    longest = MemoryDraft(
        "My brother Owen lives in Bristol, near the harbour.", "fact", ("owen",), ("family",)
    )
    script.close_to(OWEN.text, short.text, 0.9)
    script.close_to(OWEN.text, longest.text, 0.92)
    script.close_to(LISBON.text, PORTO.text, 0.97)
    first = await store_as_is(keeper, OWEN)
    await keeper.store.reinforce(
        PERSON, first.id, tier="close", score=1.0, said=OWEN, now=clock.now()
    )
    clock.advance(60)
    second = await store_as_is(keeper, short)
    clock.advance(60)
    reference = await store_as_is(keeper, longest)
    lisbon = await store_as_is(keeper, LISBON)
    porto = await store_as_is(keeper, PORTO)

    report = await maintain(keeper)
    assert report.persons == 1 and report.muted == 2
    assert [(m.reference, set(m.muted)) for m in report.merges] == [
        (reference.id, {first.id, second.id})
    ]
    rows = {r["id"]: r for r in await db.fetch("SELECT * FROM cards")}
    assert rows[reference.id]["status"] == "active"
    assert rows[reference.id]["mention_count"] == 1 + 2 + 1
    assert rows[reference.id]["first_mentioned"] == first.first_mentioned
    assert {rows[i]["status"] for i in (first.id, second.id)} == {"muted"}
    assert {rows[i]["status"] for i in (lisbon.id, porto.id)} == {"active"}  # never merged
    links = await db.fetch("SELECT source, target FROM memory_links WHERE kind = 'merged_into'")
    assert {(r["source"], r["target"]) for r in links} == {
        (first.id, reference.id),
        (second.id, reference.id),
    }
    traces = await db.fetch(
        "SELECT tier, new_id, existing FROM reinforcements WHERE new_id IS NOT NULL"
    )
    assert {(t["tier"], t["new_id"]) for t in traces} == {
        ("consolidated:close", first.id),
        ("consolidated:shared", second.id),  # 0.9 x 0.92 from the reference
    }
    assert f"consolidation: memory {first.id} muted into {reference.id}" in caplog.text
    assert (await maintain(keeper)).muted == 0  # nothing left; the next pass is a no-op

    # Undone: active again, mentions given back, and never merged again.
    assert await unmerge(keeper, PERSON, first.id) == reference.id
    rows = {r["id"]: r for r in await db.fetch("SELECT * FROM cards")}
    assert rows[first.id]["status"] == "active" and rows[first.id]["mention_count"] == 2
    assert rows[reference.id]["mention_count"] == 2
    assert rows[reference.id]["first_mentioned"] == second.first_mentioned
    assert await unmerge(keeper, PERSON, first.id) is None
    assert await unmerge(keeper, "someone-else", second.id) is None
    assert (await maintain(keeper)).muted == 0
    assert rows[first.id]["status"] == "active"


async def test_consolidation_never_chains_a_contradiction_in(
    keeper: MemoryKeeper, script: Script, db: asyncpg.Connection
) -> None:
    """ "trip in August" is close to both; Lisbon and Porto still never share a group."""
    hub = MemoryDraft("The trip is in August, to Lisbon or Porto.", "fact", (), ("trip",))
    script.close_to(hub.text, LISBON.text, 0.9)
    script.close_to(hub.text, PORTO.text, 0.9)
    statuses = await one_merge_of_three(keeper, (hub, LISBON, PORTO), db)
    assert statuses[hub.text] == "active"


# -- the real local model ----------------------------------------------------------------------


async def test_the_local_model_recognises_a_restatement(local_keeper: MemoryKeeper) -> None:
    keeper = local_keeper
    first = await keeper.remember(PERSON, OWEN)
    again = MemoryDraft("my brother Owen lives in Bristol", "fact", ("owen",), ("family",))
    second = await keeper.remember(PERSON, again)
    assert not second.created and second.memory.id == first.memory.id
    assert second.score is not None and second.score > 0.95
    other = await keeper.remember(PERSON, TEA)
    assert other.created
    found = await keeper.search(PERSON, "Where does my brother live?", limit=1)
    assert [f.memory.id for f in found] == [first.memory.id]


async def test_the_local_pair_recognises_a_translation_not_a_french_false_twin(
    local_keeper: MemoryKeeper,
) -> None:
    """MiniLM alone scores this translation 0.34; across languages USE judges."""
    keeper = local_keeper
    lab = MemoryDraft("Owen works in a lab.", "fact", ("owen",), ("work",))
    labo = MemoryDraft("Owen travaille dans un laboratoire.", "fact", ("owen",), ("work",))
    first = await keeper.remember(PERSON, lab)
    second = await keeper.remember(PERSON, labo)
    assert not second.created and second.memory.id == first.memory.id
    assert second.score is not None and second.score > 0.8
    cats = MemoryDraft("Hannah est allergique aux chats.", "fact", ("hannah",), ("health",))
    peanuts = MemoryDraft("Hannah est allergique aux arachides.", "fact", ("hannah",), ("health",))
    assert (await keeper.remember(PERSON, cats)).created
    assert (await keeper.remember(PERSON, peanuts)).created
    # Which model judged: MiniLM between English memories, USE for the others.
    vectors = await keeper.fingerprint([lab.text, labo.text, OWEN.text])
    across = keeper.judge.judge(lab.text, vectors[0], labo.text, vectors[1])
    english = keeper.judge.judge(lab.text, vectors[0], OWEN.text, vectors[2])
    assert (across.model, english.model) == ("use-multilingual-v3", "all-MiniLM-L6-v2")


async def test_consolidation_merges_a_translation_with_the_local_pair(
    local_keeper: MemoryKeeper, db: asyncpg.Connection
) -> None:
    """Stored apart (as before recognition knew French), a memory and its translation are
    found by the pass: the index ranks by both models, the multilingual one judges."""
    lab = MemoryDraft("Owen works in a lab.", "fact", ("owen",), ("work",))
    labo = MemoryDraft("Owen travaille dans un laboratoire.", "fact", ("owen",), ("work",))
    tea = MemoryDraft("Hannah prefers tea to coffee.", "preference", ("hannah",), ("drinks",))
    statuses = await one_merge_of_three(local_keeper, (lab, labo, tea), db)
    assert statuses[tea.text] == "active"


async def test_a_memory_of_the_same_length_is_no_restatement(
    keeper: MemoryKeeper, script: Script
) -> None:
    """Beyond the closest fingerprints, only a verbatim copy may be recognised: a memory
    merely as long as the new one is never taken for it."""
    olds = [MemoryDraft(f"Errand number {i:02d} is about the garden.", "task") for i in range(12)]
    for draft in olds:
        script.base(draft.text)
        assert (await keeper.remember(PERSON, draft)).created
    new = MemoryDraft("Hannah's library books go back Monday.", "task")
    script.base(new.text)  # orthogonal to every one of them
    outcome = await keeper.remember(PERSON, new)
    assert outcome.created and outcome.tier is None
    copy = await keeper.remember(
        PERSON, MemoryDraft("errand number 11 is about the GARDEN", "task")
    )
    assert (copy.created, copy.tier) == (False, "exact")
