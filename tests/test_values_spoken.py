"""One value said two ways is one value: times said in words or digits, in either half of
the day or none, numbers in words, weekdays and months in English and French. The guards
let such pairs through, as rules and through the keeper (a real PostgreSQL, scripted
cosines over HTTP); another value is still another."""

from __future__ import annotations

import asyncpg
import pytest

from actors.memory.guards import guard
from actors.memory.keeper import MemoryKeeper
from actors.memory.recognition import same_slot
from actors.memory.same_memory import SameMemoryJudge
from actors.memory.times import spoken_times
from providers.analysis import AnalysisModel
from storage.records import MemoryDraft
from tests.fakes.analysis_server import Answer, FakeAnalysis
from tests.memory_support import Script

PERSON = "person-values"


def fact(text: str, themes: tuple[str, ...] = ("home",)) -> MemoryDraft:
    return MemoryDraft(text, "fact", (), themes)


BEDTIME = "The kids' bedtime is 8 pm."
ONE_VALUE = [
    (BEDTIME, "The children go to bed at eight in the evening."),
    (BEDTIME, "The kids' bedtime is 20:00."),
    (BEDTIME, "Les enfants se couchent à 8 heures du soir."),
    ("The kids' bedtime is 20:00.", "The kids' bedtime is eight in the evening."),
    ("Dinner is at half past seven.", "Dinner is at 7:30."),
    ("Dinner is at half past seven.", "Dinner is at 7.30 pm."),
    ("Dinner is at a quarter to eight.", "Dinner is at 7:45."),
    ("Dinner is at 8 in the evening.", "Dinner is at 8 pm."),
    ("Le dîner est à vingt heures.", "Dinner is at 8 pm."),
    ("Le dîner est à 20h.", "Dinner is at eight pm."),
    ("Le cours finit à sept heures et demie du soir.", "The class ends at 7:30 pm."),
    ("Je me lève à six heures et demie.", "I get up at 6:30 in the morning."),
    ("The meeting is at 3 o'clock in the afternoon.", "The meeting is at 15:00."),
    ("The train leaves at noon.", "Le train part à midi."),
    ("Hannah bought a dozen eggs.", "Hannah bought 12 eggs."),
    ("Hannah has a dozen hens.", "Hannah a une douzaine de poules."),
    ("Choir practice is on Wednesdays.", "La chorale, c'est le mercredi."),
    ("Mardi, Owen vient dîner.", "Owen comes to dinner on Tuesday."),
    ("Owen arrives on Thursday 5 June.", "Owen arrive le jeudi 5 juin."),
    ("The exam is in September.", "L'examen est en septembre."),
    ("Maya's party is on May 1st.", "La fête de Maya est le premier mai."),
    ("Maya's party is on the first of May.", "Maya's party is on 1 May."),
]
OTHER_VALUE = [
    (BEDTIME, "The kids' bedtime is 9 pm.", "time"),
    (BEDTIME, "The kids' bedtime is eight in the morning.", "time"),
    ("Dinner is at half past seven.", "Dinner is at 8:30.", "time"),
    ("Le magasin ouvre à 9 heures.", "Le magasin ouvre à 10 heures.", "time"),
    ("Hannah has a dozen hens.", "Hannah has ten hens.", "number"),
    ("Yoga is on Mondays.", "Le yoga, c'est le mardi.", "weekday"),
    ("Owen arrives on 5 June.", "Owen arrive le 5 juillet.", "date"),
    ("Maya's party is on the first of May.", "Maya's party is on 2 May.", "date"),
]


@pytest.mark.parametrize(("existing", "new"), ONE_VALUE)
def test_one_value_said_two_ways_is_no_conflict(existing: str, new: str) -> None:
    assert guard(fact(existing), fact(new)) is None
    assert guard(fact(new), fact(existing)) is None


@pytest.mark.parametrize(("existing", "new", "kind"), OTHER_VALUE)
def test_another_value_is_still_kept_apart(existing: str, new: str, kind: str) -> None:
    for a, b in ((existing, new), (new, existing)):
        stopped = guard(fact(a), fact(b))
        assert stopped is not None and stopped.detail.startswith(kind), stopped


@pytest.mark.parametrize(
    ("said", "written"),
    [
        ("at eight in the evening", "at 20:00"),
        ("à 8 heures du soir", "à 20:00"),
        ("at half past seven", "at 7:30"),
        ("at a quarter to eight", "at 7:45"),
        ("à sept heures et demie", "à 7:30"),
        ("deux heures moins le quart", "1:45"),
        ("at seven thirty", "at 7:30"),
        ("at 6:30 in the morning", "at 06:30"),
        ("at 11 at night", "at 23:00"),
        # Not a time of day: a duration, an age.
        ("le trajet dure deux heures", "le trajet dure deux heures"),
        ("seven thirty-year-olds", "seven thirty-year-olds"),
        ("at 3:05 pm", "at 15:05"),
    ],
)
def test_times_said_in_words_are_written_as_a_clock_writes_them(said: str, written: str) -> None:
    assert spoken_times(said) == written


def test_one_appointment_slot_said_two_ways() -> None:
    dinner = MemoryDraft("Dinner at Léa's on Saturday at eight in the evening.", "appointment")
    diner = MemoryDraft("Dîner chez Léa samedi à 20 h.", "appointment")
    later = MemoryDraft("Dîner chez Léa samedi à 21 h.", "appointment")
    assert same_slot(dinner, diner)
    assert not same_slot(dinner, later)


async def test_the_keeper_recognises_a_time_said_in_words(
    keeper: MemoryKeeper, script: Script
) -> None:
    base = fact(BEDTIME, ("children", "bedtime"))
    again = fact("The kids' bedtime is eight in the evening.", ("children", "bedtime"))
    script.close_to(base.text, again.text, 0.8)
    first = await keeper.remember(PERSON, base)
    second = await keeper.remember(PERSON, again)
    assert not second.created, second.reason
    assert (second.memory.id, second.tier) == (first.memory.id, "shared")


async def test_the_issues_pair_reaches_the_judge_and_is_merged_on_its_word(
    keeper: MemoryKeeper, script: Script, db: asyncpg.Connection
) -> None:
    """Worded apart ("bedtime" / "go to bed"), so no tier takes it; no guard stops it
    either, so the judge (a fake over HTTP) is asked, and its `same` merges them."""
    base = fact(BEDTIME, ("children", "bedtime"))
    again = fact("The children go to bed at eight in the evening.", ("children", "bedtime"))
    script.close_to(base.text, again.text, 0.8)
    async with FakeAnalysis() as fake:
        fake.default = lambda asked: Answer(
            {"pairs": [{"existing": "M1", "new": "M2", "verdict": "same"}]}
        )
        analysis = AnalysisModel(fake.url, "fake-analysis", timeout=5.0)
        keeper.same_memory = judge = SameMemoryJudge(analysis, keeper)
        try:
            await keeper.remember(PERSON, base)
            second = await keeper.remember(PERSON, again)
            await judge.drain()
        finally:
            await analysis.close()
        assert not second.reason.startswith("guard"), second.reason
        assert fake.tasks("same-memory")[0].lines[2] == f"M2: {again.text}"
    status = await db.fetchval("SELECT status FROM cards WHERE id = $1", second.memory.id)
    assert status == "muted"
