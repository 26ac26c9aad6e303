"""The person's own name is "I": learned from the memory in which they said it, taken by
the guards for the first person where they ask whose fact it is, and a name like any other
everywhere else. As rules, and through the keeper with the local embedding models and a real
PostgreSQL."""

from __future__ import annotations

import asyncpg
import pytest

from actors.memory.guards import guard
from actors.memory.keeper import MemoryKeeper
from actors.memory.owner import own_names
from storage.fingerprints import encode
from storage.records import MemoryDraft
from tests.memory_support import MODEL, Script


def fact(text: str, *people: str, themes: tuple[str, ...] = ("life",)) -> MemoryDraft:
    return MemoryDraft(text, "fact", people, themes)


HANNAH = frozenset({"hannah"})

# (existing, new): one of the person's facts, once in the first person or none, once by name
# (hers, or a relation of hers: "Hannah's colleague" is "my colleague").
HERS = [
    (
        fact("The Lisbon trip is with Maya.", "maya"),
        fact("Hannah is going to Lisbon with Maya.", "maya", "hannah"),
    ),
    (fact("I'm vegetarian."), fact("Hannah is vegetarian.", "hannah")),
    (
        fact("Le voyage à Lisbonne, c'est avec Maya.", "maya"),
        fact("Hannah part à Lisbonne avec Maya.", "maya", "hannah"),
    ),
    (fact("Je suis végétarienne."), fact("Hannah est végétarienne.", "hannah")),
    (
        fact("Ines from work is vegan.", "ines"),
        fact("Ines, Hannah's colleague, doesn't eat any animal products.", "ines"),
    ),
    (
        fact("Inès, du travail, est végane.", "inès"),
        fact("Inès, la collègue de Hannah, ne mange aucun produit animal.", "inès"),
    ),
]

# Still another person's fact, or someone doing something to someone else, with her name.
STILL_APART = [
    ("subject", fact("Hannah is vegetarian.", "hannah"), fact("Léa is vegetarian.", "léa")),
    ("subject", fact("Maya owes Hannah £50.", "maya"), fact("Hannah owes Maya £50.", "maya")),
    ("subject", fact("I'm vegetarian."), fact("Léa is vegetarian.", "léa")),
    ("subject", fact("Hannah est végétarienne.", "hannah"), fact("Léa est végétarienne.", "léa")),
    (
        "subject",
        fact("Hannah a prêté son vélo à Farid.", "farid"),
        fact("Farid a prêté son vélo à Hannah.", "farid"),
    ),
    ("subject", fact("Je suis végétarienne."), fact("Ma sœur est végétarienne.")),
    ("subject", fact("I am vegan."), fact("Hannah's colleague is vegan.")),
    ("subject", fact("Je suis végane."), fact("La collègue de Hannah est végane.")),
    (
        "subject",
        fact("Hannah's cat is called Biscuit.", "biscuit"),
        fact("Hannah's neighbour's cat is called Biscuit.", "biscuit"),
    ),
    (
        "subject",
        fact("Le chat de Hannah s'appelle Biscuit.", "biscuit"),
        fact("Le chat de la voisine de Hannah s'appelle Biscuit.", "biscuit"),
    ),
]


@pytest.mark.parametrize(
    ("texts", "names"),
    [
        (["My name is Hannah."], {"hannah"}),
        (["Call me Hannah, please.", "I'm called Jo."], {"hannah", "jo"}),
        (["The user's name is Hannah."], {"hannah"}),
        (["Je m'appelle Léa."], {"lea"}),
        (["Mon prénom est Hannah.", "Appelle-moi Jo."], {"hannah", "jo"}),
        (["My brother is called Owen.", "Owen est le frère de Hannah."], set()),
        (["Owen will call me tomorrow.", "Call me back, Maya."], set()),
        (["my name is hannah"], {"hannah"}),
    ],
)
def test_the_own_name_is_what_the_person_said_it_was(texts: list[str], names: set[str]) -> None:
    assert own_names(texts) == names


@pytest.mark.parametrize(("existing", "new"), HERS)
def test_the_own_name_is_the_first_person(existing: MemoryDraft, new: MemoryDraft) -> None:
    found = guard(existing, new)
    assert found is not None and found.guard == "subject", found  # not knowing her name
    assert guard(existing, new, HANNAH) is None
    assert guard(new, existing, HANNAH) is None


@pytest.mark.parametrize(("which", "existing", "new"), STILL_APART)
def test_the_own_name_keeps_others_apart(
    which: str, existing: MemoryDraft, new: MemoryDraft
) -> None:
    found = guard(existing, new, HANNAH)
    assert found is not None and found.guard == which, found
    assert guard(new, existing, HANNAH) is not None


@pytest.mark.parametrize(
    ("name", "existing", "new"),
    [
        ("My name is Hannah.", *HERS[0]),
        ("Je m'appelle Hannah.", *HERS[3]),
    ],
)
async def test_the_keeper_knows_the_name_the_person_gave(
    local_keeper: MemoryKeeper,
    db: asyncpg.Connection,
    name: str,
    existing: MemoryDraft,
    new: MemoryDraft,
) -> None:
    # Not knowing it, the keeper keeps her own fact apart, as someone else's.
    await local_keeper.remember("person-unnamed", existing)
    apart = await local_keeper.remember("person-unnamed", new)
    assert apart.created and "guard subject" in apart.reason, apart.reason
    # Told it, it hears a restatement, and says which tier took it.
    await local_keeper.remember("person-named", fact(name, themes=("name",)))
    first = await local_keeper.remember("person-named", existing)
    again = await local_keeper.remember("person-named", new)
    assert not again.created and again.memory.id == first.memory.id, again.reason
    assert again.reason.startswith("tier ")
    count = "SELECT count(*) FROM cards WHERE person = $1"
    assert await db.fetchval(count, "person-named") == 2  # the name and the fact
    assert await db.fetchval(count, "person-unnamed") == 2  # the fact, twice


async def test_a_name_muted_is_forgotten_as_hers(local_keeper: MemoryKeeper) -> None:
    """Only what the person's active memories say counts: a muted one is out of reach."""
    said = await local_keeper.remember("person-renamed", fact("My name is Hannah."))
    assert await local_keeper.own_names("person-renamed") == HANNAH
    await local_keeper.mute("person-renamed", [said.memory.id])
    assert await local_keeper.own_names("person-renamed") == frozenset()


async def test_consolidation_merges_her_fact_told_both_ways_once_it_knows_her_name(
    keeper: MemoryKeeper, script: Script
) -> None:
    """Two memories stored before the name was known, 0.8 apart: the pass merges them only
    once the person has said their name."""
    from actors.memory.consolidation import consolidate

    trip, hers = HERS[0]
    script.close_to(trip.text, hers.text, 0.8)
    for draft in (trip, hers):
        vector = (await keeper.fingerprint([draft.text]))[0]
        await keeper.store.create(
            "person-old", draft, keeper.clock.now(), fingerprint=encode(vector), model=MODEL
        )
    assert await consolidate(keeper, "person-old") == []
    await keeper.remember("person-old", fact("My name is Hannah.", themes=("name",)))
    [merge] = await consolidate(keeper, "person-old")
    assert len(merge.muted) == 1


async def test_the_keeper_leaves_her_name_out_of_the_words_compared(
    local_keeper: MemoryKeeper,
) -> None:
    """Her parents told two ways trade one word once her name is known, so the
    shared tier takes them; without it, her name is a second word one says and the pair is
    left to a judge."""
    parents = fact("Hannah's parents live in York.", "mum", "dad", themes=("family",))
    mum_and_dad = fact("Mum and Dad live in York.", "mum", "dad", themes=("family",))
    await local_keeper.remember("person-unnamed", parents)
    apart = await local_keeper.remember("person-unnamed", mum_and_dad)
    assert apart.created and "band: one says" in apart.reason, apart.reason
    await local_keeper.remember("person-named", fact("My name is Hannah.", themes=("name",)))
    first = await local_keeper.remember("person-named", parents)
    again = await local_keeper.remember("person-named", mum_and_dad)
    assert not again.created and again.memory.id == first.memory.id, again.reason
    assert again.reason.startswith("tier shared"), again.reason
