"""Recognising a memory that is already there: the two tiers and the contradiction guard,
as rules and through the keeper against a real PostgreSQL and embeddings over HTTP."""

from __future__ import annotations

import asyncpg
import pytest

from actors.clock import ManualClock
from actors.memory.keeper import MemoryKeeper
from actors.memory.recognition import THRESHOLDS, Thresholds, shares_subject, thresholds_for
from actors.memory.setup import parse_thresholds
from actors.memory.values import conflict, values
from storage.records import MemoryDraft
from storage.store import Store
from tests.conftest import own
from tests.fakes.embeddings_server import FakeEmbeddings
from tests.memory_support import MODEL, Script

PERSON = "person-hannah"


def fact(text: str, people: tuple[str, ...] = (), themes: tuple[str, ...] = ()) -> MemoryDraft:
    return MemoryDraft(text, "fact", people, themes)


# -- the guard, as a rule ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "kind"),
    [
        (fact("The trip is to Lisbon.", themes=("trip",)), fact("The trip is to Porto."), "name"),
        (
            fact("Owen arrives Friday", ("owen",)),
            fact("Owen arrives Saturday", ("owen",)),
            "weekday",
        ),
        (fact("Dentist on Tuesday at 3pm"), fact("Dentist on Tuesday at 4 pm"), "time"),
        (fact("Maya's birthday is on 12 June"), fact("Maya's birthday is on 21 June"), "date"),
        (fact("Owen has two kids"), fact("Owen has 3 kids"), "number"),
        (fact("The permit expires on 30 April"), fact("The permit expires on 30 June"), "date"),
        (fact("Rent is £950 a month"), fact("Rent is £1,050 a month"), "number"),
        (fact("Le vol part à 7 h 40"), fact("Le vol part à 9 h 15"), "time"),
        (fact("Call Mum", ("mum",)), fact("Call Owen", ("owen",)), "people"),
        (fact("Owen lives in Bristol."), fact("Owen's dog lives in Bristol."), "relation"),
        (fact("Le frère de Léa vit à Lyon."), fact("La sœur de Léa vit à Lyon."), "relation"),
        (fact("Hannah drives a blue Fiat"), fact("Hannah drives a red Fiat"), "colour"),
    ],
)
def test_the_guard_sees_a_different_value(a: MemoryDraft, b: MemoryDraft, kind: str) -> None:
    found = conflict(a, b)
    assert found is not None and found.kind == kind, found
    assert conflict(b, a) is not None  # symmetric


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (fact("Owen arrives Friday", ("owen",)), fact("Owen arrives Friday at 6pm", ("owen",))),
        (fact("My brother Owen lives in Bristol.", ("owen",)), fact("Owen lives in Bristol.")),
        (
            fact("My brother Owen lives in Bristol.", ("owen",)),
            fact("Owen, that's my brother, he works in a lab.", ("owen",)),
        ),
        (fact("Dîner chez Léa samedi à 20 h."), fact("Dinner at Léa's on Saturday at 8pm.")),
        (fact("Hannah's cat is called Biscuit."), fact("Biscuit is the name of Hannah's cat.")),
        (fact("Call Mum on Sunday evening."), fact("call mum on sunday evening")),
        (fact("Water the plants every Thursday."), fact("Thursdays: water the plants.")),
    ],
)
def test_the_guard_lets_restatements_through(a: MemoryDraft, b: MemoryDraft) -> None:
    assert conflict(a, b) is None


def test_the_shared_subject_is_not_a_value() -> None:
    """ "Owen" is what both are about; the cities are the values."""
    a, b = fact("Owen lives in Bristol", ("owen",)), fact("Owen lives in Leeds", ("owen",))
    assert values(a, {"owen"})["name"] == {"bristol"}
    assert conflict(a, b) is not None and conflict(a, b).kind == "name"  # type: ignore[union-attr]


def test_subjects_are_compared_case_folded() -> None:
    assert shares_subject(fact("x", ("Owen",)), fact("y", themes=("owen",)))
    assert not shares_subject(fact("x", ("owen",)), fact("y", ("maya",), ("family",)))


def test_thresholds_are_per_model() -> None:
    assert thresholds_for("text-embedding-3-small") == Thresholds(0.85, 0.70)
    assert thresholds_for("all-MiniLM-L6-v2") == THRESHOLDS["all-MiniLM-L6-v2"]
    mine = {"x": Thresholds(0.9, 0.8)}
    assert thresholds_for("x", mine) == Thresholds(0.9, 0.8)
    with pytest.raises(ValueError):
        Thresholds(0.6, 0.7)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.85,0.70", Thresholds(0.85, 0.70)), ("0.87,0.73,0.55", Thresholds(0.87, 0.73, 0.55))],
)
def test_thresholds_on_the_command_line_keep_the_worded_floor(
    text: str, expected: Thresholds
) -> None:
    assert parse_thresholds(text) == expected


@pytest.mark.parametrize(
    "text", ["0.85", "0.85,0.70,0.55,0.5", "high,low", "0.7,0.8", "0.9,0.7,0.8"]
)
def test_wrong_thresholds_on_the_command_line_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="HIGH,LOW"):
        parse_thresholds(text)


# -- through the keeper --------------------------------------------------------------------


OWEN = MemoryDraft("My brother Owen lives in Bristol.", "fact", ("owen",), ("family", "bristol"))


async def test_above_the_high_threshold_the_memory_is_reinforced(
    keeper: MemoryKeeper,
    script: Script,
    db: asyncpg.Connection,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    again = MemoryDraft("Owen, my brother, lives in Bristol.", "fact", (), ("family",))
    script.close_to(OWEN.text, again.text, 0.9)
    first = await keeper.remember(PERSON, OWEN)
    clock.advance(3600)
    second = await keeper.remember(PERSON, again)

    assert first.created and not second.created
    assert second.memory.id == first.memory.id
    assert (second.tier, round(second.score or 0, 3)) == ("close", 0.9)
    assert second.memory.mention_count == 2
    assert second.memory.last_mentioned == clock.now() != second.memory.first_mentioned
    assert await db.fetchval("SELECT count(*) FROM cards") == 1
    trace = await db.fetchrow("SELECT * FROM reinforcements")
    assert (trace["tier"], trace["new_text"], trace["existing"], trace["new_id"]) == (
        "close",
        again.text,
        first.memory.id,
        None,
    )
    assert trace["score"] == pytest.approx(0.9, abs=1e-4)
    said = f"memory recognised (tier close, score 0.900 by {MODEL}): reinforced {first.memory.id}"
    assert said in caplog.text


async def test_between_the_thresholds_it_takes_the_same_type_and_a_shared_subject(
    keeper: MemoryKeeper, script: Script
) -> None:
    same = MemoryDraft("Owen has lived in Bristol for years.", "fact", ("owen",))
    other_type = MemoryDraft("Go to Owen's in Bristol.", "reminder", ("owen",))
    no_subject = MemoryDraft("Someone lives in Bristol.", "fact", (), ("cities",))
    too_far = MemoryDraft("Owen is somewhere in England.", "fact", ("owen",))
    for draft, cosine in ((same, 0.78), (other_type, 0.78), (no_subject, 0.78), (too_far, 0.6)):
        script.close_to(OWEN.text, draft.text, cosine)
    base = await keeper.remember(PERSON, OWEN)

    reinforced = await keeper.remember(PERSON, same)
    assert (reinforced.created, reinforced.tier) == (False, "shared")
    assert reinforced.memory.id == base.memory.id
    for draft in (other_type, no_subject, too_far):
        outcome = await keeper.remember(PERSON, draft)
        assert outcome.created, draft


async def test_different_values_are_never_merged_but_linked(
    keeper: MemoryKeeper, script: Script, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    lisbon = MemoryDraft("The trip is to Lisbon.", "fact", (), ("trip",))
    porto = MemoryDraft("The trip is to Porto.", "fact", (), ("trip",))
    script.close_to(lisbon.text, porto.text, 0.97)
    first = await keeper.remember(PERSON, lisbon)
    second = await keeper.remember(PERSON, porto)

    assert second.created and second.memory.id != first.memory.id
    assert [m.id for m in second.contradicts] == [first.memory.id]
    link = await db.fetchrow("SELECT source, target, kind FROM memory_links")
    assert tuple(link) == (second.memory.id, first.memory.id, "contradicts")
    assert await db.fetchval("SELECT count(*) FROM reinforcements") == 0
    said = "linked as a possible contradiction: guard slot: name ['lisbon'] vs ['porto']"
    assert said in caplog.text

    # The other side of an old contradiction is still recognised when restated.
    again = MemoryDraft("The trip is to Porto!", "fact", (), ("trip",))
    script.close_to(porto.text, again.text, 0.99)
    third = await keeper.remember(PERSON, again)
    assert not third.created and third.memory.id == second.memory.id


async def test_a_verbatim_copy_is_recognised_without_any_fingerprint(
    keeper: MemoryKeeper, fake_embeddings: FakeEmbeddings, db: asyncpg.Connection
) -> None:
    from tests.fakes.embeddings_server import Fail

    fake_embeddings.queue(Fail(503), Fail(503))
    first = await keeper.remember(PERSON, OWEN)
    second = await keeper.remember(PERSON, OWEN)
    assert not (first.fingerprinted or second.fingerprinted)
    assert (second.created, second.tier) == (False, "exact")
    assert await db.fetchval("SELECT mention_count FROM cards") == 2


async def test_another_persons_memories_are_never_candidates(keeper: MemoryKeeper) -> None:
    await keeper.remember("someone-else", OWEN)
    outcome = await keeper.remember(PERSON, OWEN)
    assert outcome.created


async def test_two_mentions_at_once_make_one_memory(keeper: MemoryKeeper, script: Script) -> None:
    import asyncio

    outcomes = await asyncio.gather(*(keeper.remember(PERSON, OWEN) for _ in range(5)))
    assert sum(o.created for o in outcomes) == 1
    assert outcomes[-1].memory.mention_count == 5


async def test_the_store_is_the_first_migration_plus_memory(dsn: str) -> None:
    """Cards written with the first migration's columns only are memories with sensible
    defaults."""
    from datetime import UTC, datetime
    from uuid import uuid4

    store = await Store.open(dsn)
    try:
        now = datetime(2026, 5, 19, tzinfo=UTC)
        conversation = await store.create_conversation(PERSON, now, await own(store, PERSON))
        conn = await asyncpg.connect(dsn)
        card = uuid4()
        await conn.execute(
            "INSERT INTO cards (id, person, conversation, kind, text, created_at) "
            "VALUES ($1, $2, $3, 'fact', 'Owen likes tea', $4)",
            card,
            PERSON,
            conversation,
            now,
        )
        row = await conn.fetchrow("SELECT * FROM cards WHERE id = $1", card)
        await conn.close()
        assert (row["status"], row["mention_count"], row["first_mentioned"]) == ("active", 1, now)
        assert row["fingerprint"] is None and row["people"] == []
    finally:
        await store.close()
