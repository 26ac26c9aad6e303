"""Search by meaning on the local embedding model (MiniLM and USE multilingual), against a
real PostgreSQL: paraphrases, names, both languages, links, and what never appears."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from actors.memory.keeper import MemoryKeeper
from actors.memory.search import Found, name_words
from storage.records import MemoryDraft

HANNAH = "person-hannah"
STRANGER = "person-stranger"

OWEN_BRISTOL = MemoryDraft("My brother Owen lives in Bristol.", "fact", ("owen",), ("family",))
OWEN_LAB = MemoryDraft("Owen works in a lab.", "fact", ("owen",), ("work",))
OWEN_CLIMBS = MemoryDraft("He goes climbing every Sunday morning.", "fact", ("owen",), ("sport",))
TEA = MemoryDraft("Hannah prefers tea to coffee.", "preference", ("hannah",), ("drinks",))
DENTIST = MemoryDraft("Dentist appointment on Tuesday at 3pm.", "appointment", (), ("health",))
PIANO = MemoryDraft("I take piano lessons on Thursdays.", "fact", ("hannah",), ("music",))
GARDEN = MemoryDraft("The tomatoes in the garden need watering daily.", "task", (), ("garden",))
LISBON = MemoryDraft("The summer trip is to Lisbon.", "fact", (), ("trip",))
PORTO = MemoryDraft("The summer trip is to Porto.", "fact", (), ("trip",))


async def remember_all(keeper: MemoryKeeper, person: str, *drafts: MemoryDraft) -> list[str]:
    ids = []
    for draft in drafts:
        outcome = await keeper.remember(person, draft)
        assert outcome.created, draft.text
        ids.append(str(outcome.memory.id))
    return ids


def texts(found: list[Found]) -> list[str]:
    return [f.memory.text for f in found]


async def test_a_paraphrase_with_no_shared_word_finds_its_memory(
    local_keeper: MemoryKeeper,
) -> None:
    await remember_all(local_keeper, HANNAH, OWEN_LAB, TEA, DENTIST, PIANO, GARDEN)
    found = await local_keeper.search(HANNAH, "sibling job", limit=3)
    assert texts(found)[0] == OWEN_LAB.text
    assert found[0].why.startswith("meaning ") and found[0].via is None
    found = await local_keeper.search(HANNAH, "what do I drink in the morning?", limit=1)
    assert texts(found) == [TEA.text]


async def test_a_name_finds_all_its_memories_however_far_the_wording(
    local_keeper: MemoryKeeper,
) -> None:
    await remember_all(local_keeper, HANNAH, TEA, DENTIST, OWEN_BRISTOL, PIANO, OWEN_LAB)
    await remember_all(local_keeper, HANNAH, GARDEN, OWEN_CLIMBS)
    found = await local_keeper.search(HANNAH, "What do you know about Owen?", limit=3)
    assert set(texts(found)) == {OWEN_BRISTOL.text, OWEN_LAB.text, OWEN_CLIMBS.text}
    climbing = next(f for f in found if f.memory.text == OWEN_CLIMBS.text)
    assert "person owen" in climbing.why and climbing.why.startswith("meaning ")


async def test_a_french_query_finds_an_english_memory_and_the_reverse(
    local_keeper: MemoryKeeper,
) -> None:
    labo = MemoryDraft("Ma sœur joue du violoncelle dans un orchestre.", "fact", (), ("musique",))
    await remember_all(local_keeper, HANNAH, OWEN_LAB, TEA, DENTIST, PIANO, GARDEN, labo)
    found = await local_keeper.search(HANNAH, "Où travaille mon frère ?", limit=1)
    assert texts(found) == [OWEN_LAB.text]
    found = await local_keeper.search(HANNAH, "Which instrument does my sister play?", limit=1)
    assert texts(found) == [labo.text]


async def test_a_link_brings_its_neighbour_and_an_erroneous_memory_only_its_correction(
    local_keeper: MemoryKeeper, db: asyncpg.Connection
) -> None:
    keeper = local_keeper
    await remember_all(keeper, HANNAH, LISBON, TEA, DENTIST)
    porto = await keeper.remember(HANNAH, PORTO)
    assert porto.created and [m.text for m in porto.contradicts] == [LISBON.text]
    lisbon = porto.contradicts[0]

    found = await keeper.search(HANNAH, "Where does the summer trip go?", limit=1)
    assert len(found) == 2 and found[1].via is not None
    assert found[1].via.link.kind == "contradicts" and found[1].via.through == found[0].memory.id
    assert found[1].why.startswith('linked to "') and found[1].score == found[0].score

    # Settled: Lisbon was wrong. It comes only with Porto, marked erroneous.
    await keeper.mark_erroneous(HANNAH, lisbon.id, porto.memory.id)
    found = await keeper.search(HANNAH, "Where does the summer trip go?", limit=1)
    assert [(f.memory.text, f.memory.status) for f in found] == [
        (PORTO.text, "active"),
        (LISBON.text, "erroneous"),
    ]
    assert found[1].why == f'erroneous, corrected by "{PORTO.text}"'
    # Reached from anything but its correction, it does not come.
    await db.execute(
        "INSERT INTO memory_links (source, target, kind, person, created_at) "
        "SELECT id, $1, 'related', person, now() FROM cards WHERE text = $2",
        lisbon.id,
        TEA.text,
    )
    found = await keeper.search(HANNAH, "Does Hannah prefer tea or coffee?", limit=1)
    assert texts(found) == [TEA.text]


async def test_muted_and_other_persons_memories_never_appear(local_keeper: MemoryKeeper) -> None:
    keeper = local_keeper
    _, lab = await remember_all(keeper, HANNAH, OWEN_BRISTOL, OWEN_LAB)
    await remember_all(keeper, STRANGER, OWEN_CLIMBS, TEA)
    await keeper.mute(HANNAH, [UUID(lab)])
    for query in ("Owen works in a lab.", "What do you know about Owen?"):
        found = await keeper.search(HANNAH, query, limit=10)
        assert texts(found) == [OWEN_BRISTOL.text], query
    assert texts(await keeper.search(HANNAH, "tea or coffee?", limit=10)) == []  # the floor
    found = await keeper.search(STRANGER, "Where does Owen live?", limit=10)
    assert texts(found) == [OWEN_CLIMBS.text]


def test_names_are_the_words_their_singulars_and_two_word_phrases() -> None:
    assert name_words("Owen's trips to New York") == [
        "owen",
        "trips",
        "to",
        "new",
        "york",
        "trip",
        "owen trips",
        "trips to",
        "to new",
        "new york",
    ]
