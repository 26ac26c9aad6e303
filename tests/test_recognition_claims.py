"""The shared tier takes a pair only when neither memory says more than the other (a word
traded aside): where one carries a claim the other lacks, the pair goes to the judge, and
with no judge the memory is stored apart. English and French; the rule alone, then through
the keeper on a real PostgreSQL with scripted cosines and a fake analysis model over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from actors.memory.keeper import MemoryKeeper
from actors.memory.recognition import SEED, Candidate, Judged, reach, recognise, wording
from actors.memory.same_memory import SameMemoryJudge
from providers.analysis import AnalysisModel
from storage.records import MemoryDraft
from tests.fakes.analysis_server import Answer, FakeAnalysis
from tests.memory_support import Script
from tests.test_recognition_wording import stored

PERSON = "person-claims"


def fact(text: str, *people: str) -> MemoryDraft:
    return MemoryDraft(text, "fact", people, ("life",))


# Same subject and topic, but another verb, another place, or a claim of its own.
SAYS_MORE = [
    (fact("Owen teaches chemistry at a college.", "owen"),
     fact("Owen studies chemistry at university.", "owen")),
    (fact("Dr Patel is Hannah's dentist.", "dr patel"),
     fact("Dr Patel thinks Hannah's wisdom tooth should come out.", "dr patel")),
    (fact("Léa enseigne l'anglais au lycée.", "léa"),
     fact("Léa étudie l'anglais à la fac.", "léa")),
    (fact("Le docteur Martin est mon médecin.", "martin"),
     fact("Le docteur Martin trouve ma tension trop haute.", "martin")),
]  # fmt: skip

# One word traded for another: the same fact, which the shared tier still takes.
TRADED = [
    (fact("Hannah drives a blue Fiat 500."), fact("Hannah's car is a blue Fiat 500.")),
    (fact("Léa is a nurse.", "léa"), fact("Léa works as a nurse.", "léa")),
    (fact("Ma sœur vit à Lyon."), fact("Ma sœur habite à Lyon.")),
    (fact("Mon frère vit à Bristol."), fact("Mon frère est installé à Bristol.")),
]

LANGUAGES = ["en-verb", "en-claim", "fr-verb", "fr-claim"]


@pytest.mark.parametrize(("existing", "new"), SAYS_MORE, ids=LANGUAGES)
def test_a_pair_that_says_more_is_no_shared_tier_match(
    existing: MemoryDraft, new: MemoryDraft
) -> None:
    words = wording(new, existing)
    assert words.says_more, words
    assert reach(0.80, True, True, words, SEED) is None
    assert reach(0.90, True, True, words, SEED) == "close"  # the close tier is not its


@pytest.mark.parametrize(("existing", "new"), TRADED, ids=["en", "en-verb", "fr", "fr-verb"])
def test_a_word_traded_is_still_a_shared_tier_match(
    existing: MemoryDraft, new: MemoryDraft
) -> None:
    words = wording(new, existing)
    assert not words.says_more, words
    assert reach(0.80, True, True, words, SEED) == "shared"


def test_two_languages_leave_the_words_no_say() -> None:
    words = wording(fact("Owen studies chemistry."), fact("Owen enseigne la chimie au lycée."))
    assert words.unsaid == ((), ()) and not words.says_more


def test_the_persons_own_name_is_no_word_said() -> None:
    mine, hers = fact("My brother lives in Bristol."), fact("Hannah's brother lives in Bristol.")
    assert wording(hers, mine).unsaid == (("hannah",), ())
    assert wording(hers, mine, frozenset({"hannah"})).unsaid == ((), ())


async def remember(
    keeper: MemoryKeeper, script: Script, existing: MemoryDraft, new: MemoryDraft
) -> tuple:
    """`existing`, then `new` at 0.80: in the fake model's shared tier (0.70 to 0.85)."""
    script.close_to(existing.text, new.text, 0.80)
    first = await keeper.remember(PERSON, existing)
    second = await keeper.remember(PERSON, new)
    return first, second


@pytest.mark.parametrize(("existing", "new"), SAYS_MORE, ids=LANGUAGES)
async def test_without_a_judge_it_is_stored_apart_and_says_why(
    keeper: MemoryKeeper,
    script: Script,
    db: asyncpg.Connection,
    existing: MemoryDraft,
    new: MemoryDraft,
) -> None:
    first, second = await remember(keeper, script, existing, new)
    assert second.created and second.memory.id != first.memory.id
    assert second.reason.startswith("band: one says what the other does not ("), second.reason
    assert "cosine 0.800" in second.reason
    stored = await db.fetchval("SELECT recognition FROM cards WHERE id = $1", second.memory.id)
    assert stored == second.reason and stored.endswith(f"({first.memory.id})")
    assert await db.fetchval("SELECT count(*) FROM reinforcements") == 0
    assert await db.fetchval("SELECT count(*) FROM cards WHERE status = 'active'") == 2


@pytest.mark.parametrize(("existing", "new"), TRADED[1::2], ids=["en", "fr"])
async def test_a_word_traded_is_reinforced_by_the_shared_tier(
    keeper: MemoryKeeper,
    script: Script,
    db: asyncpg.Connection,
    existing: MemoryDraft,
    new: MemoryDraft,
) -> None:
    first, second = await remember(keeper, script, existing, new)
    assert (second.created, second.tier) == (False, "shared")
    assert second.memory.id == first.memory.id
    assert await db.fetchval("SELECT decided_by FROM reinforcements") == "tier"


@pytest.fixture
async def judge(keeper: MemoryKeeper) -> AsyncIterator[tuple[SameMemoryJudge, FakeAnalysis]]:
    async with FakeAnalysis() as fake:
        analysis = AnalysisModel(fake.url, "fake-analysis", timeout=0.5)
        keeper.same_memory = same = SameMemoryJudge(analysis, keeper)
        yield same, fake
        await analysis.close()


@pytest.mark.parametrize(
    ("existing", "new", "verdict", "status"),
    [(*SAYS_MORE[0], "distinct", "active"), (*SAYS_MORE[3], "distinct", "active"),
     (*SAYS_MORE[2], "same", "muted")],
    ids=["en-distinct", "fr-distinct", "fr-same"],
)  # fmt: skip
async def test_with_a_judge_its_answer_decides(
    keeper: MemoryKeeper,
    judge: tuple[SameMemoryJudge, FakeAnalysis],
    script: Script,
    db: asyncpg.Connection,
    existing: MemoryDraft,
    new: MemoryDraft,
    verdict: str,
    status: str,
) -> None:
    same, fake = judge
    pair = {"existing": "M1", "new": "M2", "verdict": verdict}
    fake.default = lambda asked: Answer({"pairs": [pair]})  # to each question it asks
    _, second = await remember(keeper, script, existing, new)
    assert second.created  # stored at once, whatever the judge will say
    await same.drain()
    asked = fake.tasks("same-memory")[0]
    assert asked.lines[0] == f"M1: {existing.text}" and asked.lines[2] == f"M2: {new.text}"
    row = await db.fetchrow("SELECT status, recognition FROM cards WHERE id = $1", second.memory.id)
    assert row["status"] == status
    # Why it went to the judge, then what the judge said.
    said = "the same as" if verdict == "same" else verdict
    assert row["recognition"].startswith("band: one says what the other does not (")
    assert f"; judge: {said} " in row["recognition"]
    merged = await db.fetchval("SELECT count(*) FROM reinforcements WHERE decided_by = 'judge'")
    assert merged == (verdict == "same")


async def test_with_the_local_models_a_claim_of_its_own_is_kept(
    local_keeper: MemoryKeeper, db: asyncpg.Connection
) -> None:
    """MiniLM scores this pair 0.76, in its shared tier (0.73 to 0.87): one topic, two facts."""
    dentist, tooth = SAYS_MORE[1]
    first = await local_keeper.remember(PERSON, dentist)
    second = await local_keeper.remember(PERSON, tooth)
    assert second.created and second.memory.id != first.memory.id
    assert second.reason.startswith("band: one says what the other does not (")
    assert "by all-MiniLM-L6-v2" in second.reason
    assert await db.fetchval("SELECT count(*) FROM reinforcements") == 0


@pytest.mark.parametrize(("vouched", "found"), [(True, "shared"), (False, None)])
def test_a_second_model_finding_it_close_vouches_for_it(vouched: bool, found: str | None) -> None:
    existing, new = SAYS_MORE[0]
    judged = Judged(0.80, "fake", SEED, vouched)
    verdict = recognise(new, [Candidate(stored(existing), judged)])
    assert (verdict.match.tier if verdict.match else None) == found
    path = "tier" if vouched else "band"
    assert [d.path for d in verdict.decisions] == [path]
    if vouched:
        assert verdict.reason.endswith(", the other model finding it close")
    else:
        assert verdict.uncertain and verdict.reason.startswith("band: one says what")
