"""The rules beyond cosine: who does what to whom, negation, who a named person is, the
one-word swap, the worded floor and the same appointment slot. Pure rules, no storage."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

import pytest

from actors.memory.recognition import (
    THRESHOLDS,
    Candidate,
    Judged,
    Thresholds,
    Wording,
    reach,
    recognise,
    wording,
)
from actors.memory.values import conflict, content_words, plain, spells_value
from storage.records import Memory, MemoryDraft


def fact(text: str, people: tuple[str, ...] = (), themes: tuple[str, ...] = ()) -> MemoryDraft:
    return MemoryDraft(text, "fact", people, themes)


def appointment(text: str, people: tuple[str, ...] = ("léa",)) -> MemoryDraft:
    return MemoryDraft(text, "appointment", people, ("friends",))


def stored(draft: MemoryDraft) -> Memory:
    """`draft` as a stored memory, for `recognise`."""
    now = datetime(2026, 5, 22, tzinfo=UTC)
    return Memory(
        uuid4(), "p", None, draft.type, draft.text, draft.people, draft.themes, "active",
        None, 1, now, now, now,
    )  # fmt: skip


# -- the guard: roles, negation, named relations -------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Maya owes Hannah £50.", "Hannah owes Maya £50."),
        (
            "Mr Okafor has a spare key to Hannah's flat.",
            "Hannah has a spare key to Mr Okafor's flat.",
        ),
        ("Farid lent Hannah his tent.", "Hannah lent Farid her tent."),
        ("Hannah a prêté son vélo à Farid.", "Farid a prêté son vélo à Hannah."),
    ],
)
def test_swapped_roles_are_a_conflict(a: str, b: str) -> None:
    found = conflict(fact(a), fact(b))
    assert found is not None and found.kind == "roles", found
    assert conflict(fact(b), fact(a)) is not None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Owen is Hannah's brother.", "Hannah's brother is Owen."),  # a copula, not a deed
        ("Maya and Hannah met at university.", "Hannah and Maya met at university."),
        ("Owen has two kids, Ella and Sam.", "Owen has two kids, Sam and Ella."),
        ("Maya owes Hannah £50.", "Maya owes Hannah £50!"),
    ],
)
def test_the_same_roles_in_other_words_are_no_conflict(a: str, b: str) -> None:
    assert conflict(fact(a), fact(b)) is None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Hannah's flat has a balcony.", "Hannah's flat has no balcony."),
        ("Hannah likes coffee.", "Hannah doesn't like coffee."),
        ("Hannah sings in the choir.", "Hannah no longer sings in the choir."),
        ("Hannah aime le café.", "Hannah n'aime pas le café."),
        ("Owen drinks.", "Owen never drinks."),
    ],
)
def test_a_negation_of_the_same_words_is_a_conflict(a: str, b: str) -> None:
    found = conflict(fact(a), fact(b))
    assert found is not None and found.kind == "negation", found


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Hannah is vegetarian.", "Hannah doesn't eat meat."),  # a negation, other words
        ("Hannah est végétarienne.", "Hannah ne mange pas de viande."),
        ("Hannah doesn't like coriander.", "Hannah does not like coriander."),  # both deny
    ],
)
def test_a_negation_in_other_words_is_no_conflict(a: str, b: str) -> None:
    assert conflict(fact(a), fact(b)) is None


def test_who_a_named_person_is_must_agree() -> None:
    brother = fact("Hannah's brother Owen works in a lab.", ("owen",))
    friend = fact("Hannah's friend Owen works in a lab.", ("owen",))
    found = conflict(brother, friend)
    assert found is not None and found.kind == "relation", found
    manager = fact("Hannah's manager is called Priya.", ("priya",))
    assert conflict(manager, fact("Priya is Hannah's boss at work.", ("priya",))) is None


def test_words_are_compared_plain() -> None:
    assert plain("L\u00e9a\u2019s CAN'T") == "lea's can not"
    assert content_words("Hannah doesn't like the cats") == ["hannah", "lik", "cat"]


# -- wording ----------------------------------------------------------------------------------


def test_a_one_word_swap_is_never_the_same_memory_and_not_a_contradiction() -> None:
    cats = fact("Hannah is allergic to cats.", themes=("health",))
    peanuts = fact("Hannah is allergic to peanuts.", themes=("health",))
    t = Thresholds(0.85, 0.70)
    verdict = recognise(peanuts, [Candidate(stored(cats), Judged(0.95, "m", t))])
    assert verdict.match is None and verdict.contradicts == ()
    # The swapped one is passed over; a lower candidate may still be the memory.
    restated = fact("Peanuts: Hannah is allergic to them.", themes=("health",))
    candidates = [
        Candidate(stored(cats), Judged(0.95, "m", t)),
        Candidate(stored(restated), Judged(0.9, "m", t)),
    ]
    verdict = recognise(peanuts, candidates)
    assert verdict.match is not None and verdict.match.existing.text == restated.text


def test_the_share_of_words_in_common() -> None:
    mine = fact("My brother Owen lives in Bristol.", ("owen",))
    hers = fact("Hannah's brother lives in Bristol.", ("owen",))
    assert wording(mine, hers).share == 1.0
    lab = fact("Owen works in a lab.", ("owen",))
    assert wording(lab, fact("Owen is researching antibiotic resistance.", ("owen",))).share == 0.0


def todo(text: str, kind: str = "task") -> MemoryDraft:
    return MemoryDraft(text, kind, (), ("chores",))


def test_a_weekday_is_a_value_once_or_every_week() -> None:
    """A plural weekday (each one) is the weekday the guard compares, not a word the other lacks;
    "every" states no fact; "thus" is no Thursday."""
    plants = todo("Water the plants every Thursday.", "reminder")
    assert wording(plants, todo("Thursdays: water the plants.", "reminder")).unsaid == ((), ())
    assert conflict(plants, todo("Water the plants on Fridays.", "reminder")) is not None
    assert spells_value("thursdays") and spells_value("jeudis") and not spells_value("thus")


def test_a_to_do_is_compared_past_the_words_that_frame_it() -> None:
    """In a task or reminder, "need to", "remember to" only frame the action; in a fact,
    "needs to" is what it says."""
    tickets = todo("Book the train tickets to Bristol.")
    framed = todo("Need to buy the train tickets for Bristol.")
    assert wording(tickets, framed).unsaid == (("book",), ("buy",))
    assert not wording(todo("Call the bank."), todo("Remember to call the bank.")).says_more
    goal, done = fact("Hannah needs to lose weight."), fact("Hannah lost weight.")
    assert "need" in wording(goal, done).unsaid[0]


def test_a_number_in_words_is_a_value() -> None:
    ninety = fact("Rose will be ninety in May.", ("rose",))
    assert wording(ninety, fact("Rose turns 90 in May.", ("rose",))).unsaid == ((), ("turn",))
    assert conflict(ninety, fact("Rose will be eighty in May.", ("rose",))) is not None


def test_the_worded_floor_takes_only_pairs_worded_alike() -> None:
    t = Thresholds(0.87, 0.73, worded=0.55)
    alike, unlike = Wording(1.0, False), Wording(0.5, False)
    assert reach(0.60, True, True, alike, t) == "shared"
    assert reach(0.60, True, True, unlike, t) is None
    assert reach(0.50, True, True, alike, t) is None
    assert reach(0.60, False, True, alike, t) is None  # another type
    assert reach(0.60, True, False, alike, t) is None  # no shared subject
    assert reach(0.60, True, True, alike, Thresholds(0.87, 0.73)) is None  # no floor set
    with pytest.raises(ValueError):
        Thresholds(0.87, 0.73, worded=0.8)


def test_two_appointments_in_one_slot_are_one() -> None:
    french = appointment("Dîner chez Léa samedi à 20 h.")
    english = appointment("Dinner at Léa's on Saturday at 8pm.")
    assert wording(french, english).same_slot
    assert reach(0.2, True, True, wording(french, english), Thresholds(0.87, 0.73)) == "shared"
    assert not wording(french, appointment("Dinner at Léa's on Saturday.")).same_slot
    assert not wording(french, appointment("Dinner at Léa's on Sunday at 8pm.")).same_slot
    facts = fact("Dîner chez Léa samedi à 20 h."), fact("Dinner at Léa's on Saturday at 8pm.")
    assert not wording(*facts).same_slot  # only appointments


def test_the_local_model_has_a_worded_floor() -> None:
    assert THRESHOLDS["all-MiniLM-L6-v2"].worded is not None
