"""The guards keep apart what the fingerprint would merge: subject, negation, opposite and
slot, in English and French. As rules, through the keeper with the local embedding model
and a real PostgreSQL, and through the memories API."""

from __future__ import annotations

import asyncpg
import pytest

from actors.memory.guards import guard
from actors.memory.keeper import MemoryKeeper
from storage.fingerprints import encode
from storage.records import MemoryDraft
from tests.conftest import Harness
from tests.memory_support import MODEL, Script
from tests.test_memory_api import Api


def fact(text: str, *people: str, themes: tuple[str, ...] = ("life",)) -> MemoryDraft:
    return MemoryDraft(text, "fact", people, themes)


# (guard, existing, new): each pair scores 0.68 to 0.99 on the local models.
KEPT_APART = [
    ("subject", fact("I am allergic to cats."), fact("My daughter is allergic to cats.")),
    ("subject", fact("Léa is a pilot.", "léa"), fact("Léa is dating a pilot.", "léa")),
    ("subject", fact("Sam is afraid of flying.", "sam"), fact("I am afraid of flying.")),
    ("subject", fact("I'm vegetarian."), fact("Léa is vegetarian.", "Léa")),
    ("subject", fact("Priya is my boss.", "priya"), fact("Priya is my sister's boss.", "priya")),
    ("subject", fact("J'adore le jazz."), fact("Mon compagnon adore le jazz.")),
    ("subject", fact("Léa est pilote.", "léa"), fact("Léa sort avec un pilote.", "léa")),
    ("negation", fact("Sam still smokes.", "sam"), fact("Sam no longer smokes.", "sam")),
    ("negation", fact("Léa a une voiture.", "léa"), fact("Léa n'a pas de voiture.", "léa")),
    ("negation", fact("I drink coffee."), fact("Je ne bois pas de café.")),
    ("opposite", fact("I love coriander."), fact("I hate coriander.")),
    ("opposite", fact("I prefer a window seat."), fact("I prefer an aisle seat.")),
    ("opposite", fact("J'aime le thé vert."), fact("Je déteste le thé vert.")),
    ("opposite", fact("Je préfère le hublot."), fact("Je préfère le couloir.")),
    (
        "opposite",
        fact("I prefer the mountains to the beach."),
        fact("I prefer the beach to the mountains."),
    ),
    ("slot", fact("I am allergic to cats."), fact("I am allergic to dogs.")),
    ("slot", fact("Je suis allergique aux chats."), fact("Je suis allergique aux chiens.")),
    ("slot", fact("I am allergic to cats."), fact("Je suis allergique aux chiens.")),
    ("slot", fact("Ma sœur habite à Lyon."), fact("Ma sœur habite à Nantes.")),
    ("slot", fact("Owen is 34.", "owen"), fact("Owen is 43.", "owen")),
    ("slot", fact("Hannah is allergic to cats."), fact("Hannah is allergic to peanuts.")),
    ("slot", fact("Hannah a peur de l'avion."), fact("Hannah a peur des araignées.")),
    (
        "subject",
        fact("Grandma Rose knits scarves for the grandchildren.", "rose"),
        fact("The grandchildren knit scarves for Grandma Rose.", "rose"),
    ),
    (
        "subject",
        fact("Léa appelle sa mère le dimanche.", "léa"),
        fact("Sa mère appelle Léa le dimanche.", "léa"),
    ),
]

RESTATED = [
    (
        fact("My brother Owen lives in Bristol.", "owen"),
        fact("Owen, my brother, lives in Bristol.", "owen"),
    ),
    (fact("Hannah's parents live in York."), fact("Mum and Dad live in York.")),
    (fact("Owen's wife is called Nadia.", "owen"), fact("Nadia is married to Owen.", "owen")),
    (fact("Paul a arrêté de fumer.", "paul"), fact("Paul ne fume plus.", "paul")),
    (fact("I don't drink coffee."), fact("Je ne bois pas de café.")),
    (fact("Owen is a vegetarian.", "owen"), fact("Owen doesn't eat meat.", "owen")),
    (fact("I'm allergic to cats."), fact("I am allergic to cats.")),
    (fact("The wifi password is on the fridge."), fact("The wi-fi password is on the fridge.")),
    (fact("Mon frère s'est marié en juin."), fact("Mon frère a épousé sa compagne en juin.")),
    (fact("Owen has two kids and a dog.", "owen"), fact("Owen has 2 kids and a dog.", "owen")),
    (fact("Hannah drives a blue Fiat 500."), fact("Hannah's car is a blue Fiat 500.")),
    (fact("Owen's dog is called Biscuit.", "owen"), fact("Owen's dog's name is Biscuit.", "owen")),
    (fact("In August we go to Crete."), fact("We go to Crete in August.")),
    (fact("Owen loves Maya.", "owen", "maya"), fact("Maya is loved by Owen.", "owen", "maya")),
    (fact("My brother Owen lives in Bristol."), fact("Mon frère Owen habite Bristol.")),
]  # fmt: skip


@pytest.mark.parametrize(("which", "existing", "new"), KEPT_APART)
def test_each_guard_keeps_its_pair_apart(
    which: str, existing: MemoryDraft, new: MemoryDraft
) -> None:
    found = guard(existing, new)
    assert found is not None and found.guard == which, found
    assert guard(new, existing) is not None  # whichever came first


@pytest.mark.parametrize(("existing", "new"), RESTATED)
def test_the_guards_let_restatements_through(existing: MemoryDraft, new: MemoryDraft) -> None:
    assert guard(existing, new) is None


@pytest.mark.parametrize(("which", "existing", "new"), KEPT_APART)
async def test_the_keeper_stores_what_a_guard_keeps_apart(
    local_keeper: MemoryKeeper,
    db: asyncpg.Connection,
    which: str,
    existing: MemoryDraft,
    new: MemoryDraft,
) -> None:
    first = await local_keeper.remember("person-guards", existing)
    second = await local_keeper.remember("person-guards", new)
    assert second.created and second.memory.id != first.memory.id
    # Close enough for a tier or the judge: the guard decided, and the memory says so.
    assert f"guard {which}" in second.reason
    stored = await db.fetchval("SELECT recognition FROM cards WHERE id = $1", second.memory.id)
    assert stored == second.reason
    assert await db.fetchval("SELECT count(*) FROM reinforcements") == 0


async def test_the_keeper_still_recognises_a_restatement_and_says_why(
    local_keeper: MemoryKeeper, db: asyncpg.Connection
) -> None:
    owen = fact("My brother Owen lives in Bristol.", "owen", themes=("family",))
    again = fact("Owen, my brother, lives in Bristol.", "owen", themes=("family",))
    await local_keeper.remember("person-guards", owen)
    outcome = await local_keeper.remember("person-guards", again)
    assert not outcome.created and outcome.reason.startswith("tier close: cosine")
    trace = await db.fetchrow("SELECT decided_by, reason, draft FROM reinforcements")
    assert (trace["decided_by"], trace["reason"]) == ("tier", outcome.reason)


async def test_allergic_to_dogs_is_stored_not_reinforced_through_the_api(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start()  # the local embedding models
    api = Api(harness)
    cats = {"text": "I am allergic to cats.", "themes": ["health", "allergy"]}
    dogs = {"text": "I am allergic to dogs.", "themes": ["health", "allergy"]}
    await api.create(cats)
    status, answer = await api.call("POST", "/v1/memories", dogs)
    assert (status, answer["result"]) == (201, "created"), answer
    assert answer["memory"]["recognition"].startswith("guard slot:")
    status, again = await api.call("POST", "/v1/memories", dogs)
    assert (status, again["result"], again["reinforced"]) == (
        200,
        "reinforced",
        answer["memory"]["id"],
    )
    assert again["reason"] == "tier exact: same words"
    texts = await db.fetch("SELECT text, mention_count FROM cards ORDER BY created_at")
    assert [tuple(r) for r in texts] == [(cats["text"], 1), (dogs["text"], 2)]


def test_the_local_embedder_is_selectable() -> None:
    """The pair is the default; either of its models alone stays selectable."""
    from actors.memory.setup import make_embedder

    assert make_embedder(local="use").name == "use-multilingual-v3"
    assert make_embedder(local="minilm").name == "all-MiniLM-L6-v2"
    assert make_embedder().name == "all-MiniLM-L6-v2+use-multilingual-v3"
    with pytest.raises(ValueError, match="pair"):
        make_embedder(local="bert")


async def test_consolidation_never_merges_what_a_guard_keeps_apart(
    keeper: MemoryKeeper, script: Script
) -> None:
    """Two memories stored before the guards existed, 0.95 apart, stay two."""
    from actors.memory.consolidation import consolidate

    cats, daughter = KEPT_APART[0][1], KEPT_APART[0][2]
    script.close_to(cats.text, daughter.text, 0.95)
    for draft in (cats, daughter):
        vector = (await keeper.fingerprint([draft.text]))[0]
        await keeper.store.create(
            "person-old", draft, keeper.clock.now(), fingerprint=encode(vector), model=MODEL
        )
    assert await consolidate(keeper, "person-old") == []


@pytest.mark.parametrize(
    ("existing", "new"),
    [
        (fact("My sister Lea is allergic to cats."), fact("The cat sitter is called Mira.")),
        (fact("Lea is allergic to cats.", "lea"), fact("The cat sitter is Mira.", "mira")),
    ],
    ids=["names", "people"],
)
async def test_two_people_are_no_contradiction(
    local_keeper: MemoryKeeper, db: asyncpg.Connection, existing: MemoryDraft, new: MemoryDraft
) -> None:
    """A contradiction is a new value for the same slot of the same subject: the cat sitter
    is not the sister (the model was handed `possible_contradiction`, name lea vs mira)."""
    await local_keeper.remember("person-guards", existing)
    second = await local_keeper.remember("person-guards", new)
    assert second.created and second.contradicts == (), second.reason
    assert await db.fetchval("SELECT count(*) FROM memory_links") == 0


@pytest.mark.parametrize(
    ("existing", "new"),
    [
        (fact("The trip is to Lisbon."), fact("The trip is to Porto.")),
        (fact("Owen is 34.", "owen"), fact("Owen is 43.", "owen")),
        (fact("Ma sœur habite à Lyon."), fact("Ma sœur habite à Nantes.")),
    ],
)
def test_a_new_value_for_one_slot_of_one_subject_is_a_contradiction(
    existing: MemoryDraft, new: MemoryDraft
) -> None:
    found = guard(existing, new)
    assert found is not None and found.verdict == "contradiction", found
