"""The uncertain band goes to the analysis model (a fake over real HTTP): its answer is
applied after the memory is stored; a judge that is down, slow or answers garbage leaves
the memory stored, and the memory says so. Real PostgreSQL, scripted cosines."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import orjson
import pytest

from actors.memory.keeper import MemoryKeeper
from actors.memory.recognition import Candidate, Judged, Thresholds
from actors.memory.same_memory import INSTRUCTIONS, OPENING, SameMemoryJudge
from providers.analysis import AnalysisModel
from storage.records import Memory, MemoryDraft
from tests.fakes.analysis_server import Answer, Asked, Down, FakeAnalysis
from tests.memory_support import Script

PERSON = "person-judged"
TOM = MemoryDraft("Tom doesn't drink alcohol.", "fact", ("tom",), ("drinks",))
TEETOTAL = MemoryDraft("Tom is teetotal.", "fact", ("tom",), ("drinks",))


def pairs_answer(verdict: str) -> Answer:
    return Answer({"pairs": [{"existing": "M1", "new": "M2", "verdict": verdict}]})


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnalysis]:
    async with FakeAnalysis() as server:
        yield server


@pytest.fixture
async def judge(keeper: MemoryKeeper, fake: FakeAnalysis) -> AsyncIterator[SameMemoryJudge]:
    analysis = AnalysisModel(fake.url, "fake-analysis", timeout=0.5)
    keeper.same_memory = judge = SameMemoryJudge(analysis, keeper)
    yield judge
    await analysis.close()


async def remember_pair(
    keeper: MemoryKeeper, script: Script, cosine: float = 0.6
) -> tuple[Memory, Memory]:
    """TOM, then TEETOTAL at `cosine`: below the tiers (0.70), inside the band (0.55)."""
    script.close_to(TOM.text, TEETOTAL.text, cosine)
    first = await keeper.remember(PERSON, TOM)
    second = await keeper.remember(PERSON, TEETOTAL)
    assert second.created  # stored at once, whatever the judge will say
    return first.memory, second.memory


async def test_the_band_goes_to_the_judge_and_same_merges(
    keeper: MemoryKeeper,
    judge: SameMemoryJudge,
    fake: FakeAnalysis,
    script: Script,
    db: asyncpg.Connection,
) -> None:
    fake.default = lambda asked: pairs_answer("same")  # a contract's model: same to all
    withdrawn: list[tuple[str, list]] = []
    keeper.on_withdrawn = lambda person, ids: withdrawn.append((person, ids))
    tom, teetotal = await remember_pair(keeper, script)
    await judge.drain()
    assert withdrawn == [(PERSON, [teetotal.id])]  # the live conversation drops it too

    # A server that gives no log-probabilities is asked the pair the other way round too.
    first, swapped = fake.tasks("same-memory")
    assert first.lines == [
        f"M1: {TOM.text}",
        "  meta: type=fact people=tom themes=drinks",
        f"M2: {TEETOTAL.text}",
        "  meta: type=fact people=tom themes=drinks",
    ]
    texts = [line.split(": ", 1)[-1] for line in first.lines]
    assert [line.split(": ", 1)[-1] for line in swapped.lines] == [*texts[2:], *texts[:2]]
    assert first.instructions == swapped.instructions == INSTRUCTIONS
    rows = {r["id"]: r for r in await db.fetch("SELECT * FROM cards")}
    assert rows[teetotal.id]["status"] == "muted" and rows[tom.id]["mention_count"] == 2
    assert rows[teetotal.id]["recognition"].startswith(f"judge: the same as {tom.id}")
    trace = await db.fetchrow("SELECT * FROM reinforcements")
    assert (trace["decided_by"], trace["new_id"], trace["new_text"]) == (
        "judge",
        teetotal.id,
        TEETOTAL.text,
    )

    # The merge is undone by splitting that mention back out: nothing was lost.
    (mention,) = await keeper.mentions(PERSON, tom.id)
    split = await keeper.split(PERSON, tom.id, mention.id)
    assert (split.memory.id, split.memory.status, split.former.mention_count) == (
        teetotal.id,
        "active",
        1,
    )


@pytest.mark.parametrize(
    ("verdict", "link"), [("distinct", None), ("contradiction", "contradicts")]
)
async def test_distinct_and_contradiction_keep_it(
    keeper: MemoryKeeper,
    judge: SameMemoryJudge,
    fake: FakeAnalysis,
    script: Script,
    db: asyncpg.Connection,
    verdict: str,
    link: str | None,
) -> None:
    fake.queue(pairs_answer(verdict), task="same-memory")
    tom, teetotal = await remember_pair(keeper, script)
    await judge.drain()
    row = await db.fetchrow("SELECT status, recognition FROM cards WHERE id = $1", teetotal.id)
    assert row["status"] == "active"
    assert row["recognition"] == f"judge: {verdict} from {tom.id} (cosine 0.600)"
    assert await db.fetchval("SELECT kind FROM memory_links") == link


@pytest.mark.parametrize(
    "failure",
    [
        Down(503),
        Answer({"pairs": []}, delay=2.0),  # slower than the 0.5 s timeout
        Answer("the same, I think"),
        Answer({"pairs": [{"existing": "M1", "new": "M2", "verdict": "maybe"}]}),
        Answer({"pairs": [{"existing": "M3", "new": "M4", "verdict": "same"}]}),
    ],
    ids=["down", "slow", "not-json", "bad-verdict", "unknown-pair"],
)
async def test_without_a_usable_answer_the_memory_is_stored_and_says_so(
    keeper: MemoryKeeper,
    judge: SameMemoryJudge,
    fake: FakeAnalysis,
    script: Script,
    db: asyncpg.Connection,
    failure: object,
) -> None:
    fake.queue(failure, task="same-memory")  # type: ignore[arg-type]
    tom, teetotal = await remember_pair(keeper, script)
    await judge.drain()
    row = await db.fetchrow("SELECT status, recognition FROM cards WHERE id = $1", teetotal.id)
    assert row["status"] == "active"
    assert row["recognition"] == f"no judge answered about {tom.id} (cosine 0.600): kept"
    assert await db.fetchval("SELECT count(*) FROM cards WHERE status = 'active'") == 2


async def test_a_pairs_request_is_the_same_whatever_else_waits(
    keeper: MemoryKeeper, judge: SameMemoryJudge, fake: FakeAnalysis
) -> None:
    """One pair, one request: asked alone or among others, a pair is asked in the same
    bytes, so its verdict cannot depend on the pairs queued beside it."""
    fake.default = lambda asked: Answer({"verdict": "distinct"})
    base = await keeper.remember(PERSON, TOM)
    news = [MemoryDraft(f"Tom skips the wine, take {i}.", "fact", ("tom",)) for i in range(3)]
    stored = [(await keeper.store.create(PERSON, d, keeper.clock.now()))[0] for d in news]

    def submit(memory: Memory) -> None:
        judge.submit(PERSON, memory, [Candidate(base.memory, Judged(0.6, "m", Thresholds()))])

    submit(stored[1])  # alone
    await judge.drain()
    for memory in stored:  # told within one turn of the loop, the same pair among others
        submit(memory)
    await judge.drain()
    requests = [a.body for a in fake.tasks("same-memory")]
    assert len(requests) == 4
    assert requests[0] == requests[2]
    assert [a.lines[2] for a in fake.tasks("same-memory")] == [
        "M2: Tom skips the wine, take 1.",
        "M2: Tom skips the wine, take 0.",
        "M2: Tom skips the wine, take 1.",
        "M2: Tom skips the wine, take 2.",
    ]
    # The instructions come first and are the same bytes in every request (a cached prefix).
    assert len({orjson.dumps(r["messages"][0]) for r in requests}) == 1


async def test_a_pair_a_guard_decides_never_reaches_the_judge(
    keeper: MemoryKeeper, judge: SameMemoryJudge, fake: FakeAnalysis, script: Script
) -> None:
    cats = MemoryDraft("I am allergic to cats.", "fact", (), ("health",))
    daughter = MemoryDraft("My daughter is allergic to cats.", "fact", (), ("health",))
    script.close_to(cats.text, daughter.text, 0.6)
    await keeper.remember(PERSON, cats)
    outcome = await keeper.remember(PERSON, daughter)
    await judge.drain()
    assert outcome.created and outcome.reason.startswith("guard subject")
    assert fake.tasks("same-memory") == []


async def test_closing_finishes_the_batch_in_flight_and_drops_the_rest(
    keeper: MemoryKeeper, fake: FakeAnalysis
) -> None:
    def distinct_slowly(asked: Asked) -> Answer:
        found = [{"existing": "M1", "new": "M2", "verdict": "distinct"}]
        return Answer({"pairs": found}, delay=0.2)

    fake.default = distinct_slowly
    analysis = AnalysisModel(fake.url, "fake-analysis", timeout=0.5)
    judge = SameMemoryJudge(analysis, keeper)
    base = await keeper.remember(PERSON, TOM)
    news = [MemoryDraft(f"Tom skips the wine, take {i}.", "fact", ("tom",)) for i in range(3)]
    stored = [(await keeper.store.create(PERSON, d, keeper.clock.now()))[0] for d in news]
    for memory in stored:
        judge.submit(PERSON, memory, [Candidate(base.memory, Judged(0.6, "m", Thresholds()))])
    while not fake.tasks("same-memory"):
        await asyncio.sleep(0.01)
    await judge.close()  # the first pair is in flight: it is answered, the others dropped
    await analysis.close()

    assert len(fake.tasks("same-memory")) == 1
    rows = await keeper.store.get(PERSON, [m.id for m in stored])
    assert [rows[m.id].status for m in stored] == ["active"] * 3
    assert [rows[m.id].recognition for m in stored] == [
        f"judge: distinct from {base.memory.id} (cosine 0.600)",
        None,
        None,
    ]


async def test_past_the_queue_bound_pairs_are_left_unjudged(
    keeper: MemoryKeeper, fake: FakeAnalysis
) -> None:
    fake.default = lambda asked: Answer({"pairs": []})
    analysis = AnalysisModel(fake.url, "fake-analysis", timeout=0.5)
    judge = SameMemoryJudge(analysis, keeper, queued_max=2)
    base = await keeper.remember(PERSON, TOM)
    news = [MemoryDraft(f"Tom skips the wine, take {i}.", "fact", ("tom",)) for i in range(3)]
    stored = [(await keeper.store.create(PERSON, d, keeper.clock.now()))[0] for d in news]
    for memory in stored:  # none taken yet: the third finds the queue full
        judge.submit(PERSON, memory, [Candidate(base.memory, Judged(0.6, "m", Thresholds()))])
    await judge.drain()
    await analysis.close()

    assert len(fake.tasks("same-memory")) == 2  # two pairs, one request each
    rows = await keeper.store.get(PERSON, [m.id for m in stored])
    assert [rows[m.id].status for m in stored] == ["active"] * 3
    assert rows[stored[2].id].recognition is None  # never asked


@pytest.mark.parametrize(
    ("existing", "new"),
    [
        (TOM, TEETOTAL),
        (
            MemoryDraft("Ma grand-mère est décédée.", "fact", (), ("famille",)),
            MemoryDraft("Mamie nous a quittés.", "fact", (), ("famille",)),
        ),
    ],
)
async def test_with_the_local_models_the_band_reaches_the_judge(
    local_keeper: MemoryKeeper,
    fake: FakeAnalysis,
    db: asyncpg.Connection,
    existing: MemoryDraft,
    new: MemoryDraft,
) -> None:
    """The embedding model in use puts a paraphrase that shares no word in the band, below
    its tiers: stored at once, then merged on the judge's word."""
    analysis = AnalysisModel(fake.url, "fake-analysis", timeout=5.0)
    local_keeper.same_memory = judge = SameMemoryJudge(analysis, local_keeper)
    fake.default = lambda asked: pairs_answer("same")
    try:
        first = await local_keeper.remember(PERSON, existing)
        second = await local_keeper.remember(PERSON, new)
        assert second.created and second.reason == ""  # no tier took it, no guard stopped it
        await judge.drain()
    finally:
        await analysis.close()
    asked = fake.tasks("same-memory")[0]
    assert asked.lines[0] == f"M1: {existing.text}" and asked.lines[2] == f"M2: {new.text}"
    status = await db.fetchval("SELECT status FROM cards WHERE id = $1", second.memory.id)
    assert status == "muted"
    trace = await db.fetchrow("SELECT decided_by, new_id FROM reinforcements")
    assert tuple(trace) == ("judge", second.memory.id)
    assert (await local_keeper.store.get(PERSON, [first.memory.id]))[
        first.memory.id
    ].mention_count == 2


@pytest.mark.parametrize("cosine", [0.6, 0.95])
async def test_a_fact_and_a_reminder_are_never_judged_nor_merged(
    keeper: MemoryKeeper,
    judge: SameMemoryJudge,
    fake: FakeAnalysis,
    script: Script,
    db: asyncpg.Connection,
    cosine: float,
) -> None:
    """Seed 001: one memory needs one type. Whatever cosine, and a judge that would say
    `same` to anything, a fact and a reminder stay two memories, and the judge is not asked."""
    fake.default = lambda asked: pairs_answer("same")
    stay = MemoryDraft("Owen is staying with us for two nights.", "fact", ("owen",), ("family",))
    bed = MemoryDraft(
        "Remind me to get the spare bed out on Thursday for Owen.",
        "reminder",
        ("owen",),
        ("family",),
    )
    script.close_to(stay.text, bed.text, cosine)
    await keeper.remember(PERSON, stay)
    second = await keeper.remember(PERSON, bed)
    await judge.drain()
    assert second.created
    assert fake.tasks("same-memory") == []
    assert await db.fetchval("SELECT count(*) FROM cards WHERE status = 'active'") == 2


async def test_the_judge_never_merges_two_types_handed_to_it(
    keeper: MemoryKeeper, judge: SameMemoryJudge, fake: FakeAnalysis, db: asyncpg.Connection
) -> None:
    fake.default = lambda asked: pairs_answer("same")
    base = await keeper.remember(PERSON, TOM)
    task = MemoryDraft("Buy Tom a bottle of juice instead of wine.", "task", ("tom",))
    (stored, _) = await keeper.store.create(PERSON, task, keeper.clock.now())
    judge.submit(PERSON, stored, [Candidate(base.memory, Judged(0.6, "m", Thresholds()))])
    await judge.drain()
    assert fake.tasks("same-memory") == []
    assert await db.fetchval("SELECT status FROM cards WHERE id = $1", stored.id) == "active"


ALLERGY = MemoryDraft("Je suis allergique à la pénicilline.", "fact", (), ("santé",))
ASTHMA = MemoryDraft("Je suis asthmatique depuis l'enfance.", "fact", (), ("santé",))


@pytest.mark.parametrize(
    ("chance", "status", "note"),
    [
        (0.55, "active", "judge: unsure it is the same as {id} (p(same) 0.55, cosine 0.600)"),
        (0.95, "muted", "judge: the same as {id} (p(same) 0.95, cosine 0.600); merged"),
    ],
)
async def test_same_is_merged_only_when_the_model_is_sure_of_it(
    keeper: MemoryKeeper,
    judge: SameMemoryJudge,
    fake: FakeAnalysis,
    script: Script,
    db: asyncpg.Connection,
    chance: float,
    status: str,
    note: str,
) -> None:
    """A small model answers `same` for two health facts, but its tokens say how sure it
    was: one request, and a merge only from `SURE` up."""
    fake.default = lambda asked: Answer(
        {"verdict": "same"}, chances={"same": chance, "distinct": 1 - chance}
    )
    script.close_to(ALLERGY.text, ASTHMA.text, 0.6)
    first = await keeper.remember(PERSON, ALLERGY)
    second = await keeper.remember(PERSON, ASTHMA)
    await judge.drain()
    (asked,) = fake.tasks("same-memory")
    assert asked.body["logprobs"] is True
    row = await db.fetchrow("SELECT status, recognition FROM cards WHERE id = $1", second.memory.id)
    assert row["status"] == status
    assert row["recognition"].startswith(note.format(id=first.memory.id))


async def judged_by(
    fake: FakeAnalysis, keeper: MemoryKeeper, script: Script
) -> tuple[Memory, Memory]:
    """TOM and TEETOTAL remembered, with `fake` judging the pair, and judged."""
    analysis = AnalysisModel(fake.url, "fake-analysis", timeout=0.5)
    keeper.same_memory = judge = SameMemoryJudge(analysis, keeper)
    try:
        pair = await remember_pair(keeper, script)
        await judge.drain()
    finally:
        await analysis.close()
    return pair


@pytest.mark.parametrize("echoes", [True, False], ids=["echoed", "continuation-alone"])
@pytest.mark.parametrize(
    ("chance", "status"), [(0.95, "muted"), (0.55, "active")], ids=["sure", "unsure"]
)
async def test_the_model_goes_on_from_the_answers_opening_and_writes_the_verdict_first(
    keeper: MemoryKeeper,
    script: Script,
    db: asyncpg.Connection,
    echoes: bool,
    chance: float,
    status: str,
) -> None:
    """The request ends with the answer's opening, for the model to go on from: the first
    token it writes is the verdict, weighed there, whether the server answers the opening
    with it (llama.cpp) or only what follows."""
    weighed = Answer('same"}', chances={"same": chance, "distinct": 1 - chance})
    async with FakeAnalysis(default=lambda asked: weighed, echoes=echoes) as fake:
        _, second = await judged_by(fake, keeper, script)
    (asked,) = fake.tasks("same-memory")
    assert asked.body["messages"][-1] == {"role": "assistant", "content": OPENING}
    assert [m["role"] for m in asked.body["messages"]] == ["system", "user", "assistant"]
    assert "response_format" not in asked.body  # a schema would be decoded from "{" again
    assert (asked.body["logprobs"], asked.body["max_tokens"]) == (True, 12)
    row = await db.fetchrow("SELECT status, recognition FROM cards WHERE id = $1", second.id)
    assert row["status"] == status
    assert f"p(same) {chance:.2f}, cosine 0.600" in row["recognition"]


async def test_a_server_refusing_the_answers_opening_is_asked_plainly(
    keeper: MemoryKeeper, script: Script, db: asyncpg.Connection
) -> None:
    """A server that answers an opening with a 400 is asked the contract's plain request
    from then on (any JSON object, no log-probabilities): a `same` must hold both ways."""
    whole = Answer({"verdict": "same"})
    async with FakeAnalysis(default=lambda asked: whole, refuse_opening=True) as fake:
        first, second = await judged_by(fake, keeper, script)
    bodies = fake.requests
    assert [b["messages"][-1]["role"] for b in bodies] == ["assistant", "user", "user"]
    assert [b.get("response_format") for b in bodies[1:]] == [{"type": "json_object"}] * 2
    assert not any("logprobs" in b for b in bodies[1:])
    assert len(fake.tasks("same-memory")) == 2  # answered: the pair, then the other way round
    row = await db.fetchrow("SELECT status, recognition FROM cards WHERE id = $1", second.id)
    assert row["status"] == "muted"
    assert row["recognition"] == f"judge: the same as {first.id} (cosine 0.600); merged into it"


async def test_without_log_probabilities_same_must_hold_the_other_way_round(
    keeper: MemoryKeeper,
    judge: SameMemoryJudge,
    fake: FakeAnalysis,
    script: Script,
    db: asyncpg.Connection,
) -> None:
    """A model that says `same` only with the allergy first is unsure: kept apart."""
    fake.default = lambda asked: pairs_answer(
        "same" if asked.lines[0] == f"M1: {ALLERGY.text}" else "distinct"
    )
    script.close_to(ALLERGY.text, ASTHMA.text, 0.6)
    first = await keeper.remember(PERSON, ALLERGY)
    second = await keeper.remember(PERSON, ASTHMA)
    await judge.drain()
    assert len(fake.tasks("same-memory")) == 2
    row = await db.fetchrow("SELECT status, recognition FROM cards WHERE id = $1", second.memory.id)
    assert row["status"] == "active"
    assert (
        row["recognition"]
        == f"judge: unsure it is the same as {first.memory.id} (cosine 0.600): kept"
    )


@pytest.mark.parametrize(
    ("existing", "new"),
    [
        ("I work as a nurse at the General Hospital.", "I work night shifts on Tuesdays."),
        ("I play the cello in an orchestra.", "The orchestra rehearses on Tuesday evenings."),
        ("My cat Biscuit is nine years old.", "Biscuit is on a special kidney diet."),
    ],
    ids=["each-a-value", "a-weekday-one-way", "a-number-one-way"],
)
async def test_related_facts_one_stating_a_value_never_reach_the_judge(
    keeper: MemoryKeeper,
    judge: SameMemoryJudge,
    fake: FakeAnalysis,
    script: Script,
    existing: str,
    new: str,
) -> None:
    """A kind of value one states and the other does not (a place one way and days the
    other, days, an age): it tells something the other does not."""
    fake.default = lambda asked: pairs_answer("same")
    first = MemoryDraft(existing, "fact", (), ("work",))
    second = MemoryDraft(new, "fact", (), ("work",))
    script.close_to(first.text, second.text, 0.6)
    await keeper.remember(PERSON, first)
    outcome = await keeper.remember(PERSON, second)
    await judge.drain()
    assert outcome.created and fake.tasks("same-memory") == []


async def test_the_persons_name_is_never_judged_the_same_as_another_fact(
    keeper: MemoryKeeper, judge: SameMemoryJudge, fake: FakeAnalysis, script: Script
) -> None:
    fake.default = lambda asked: pairs_answer("same")
    name = MemoryDraft("My name is Hannah.", "fact", (), ("name",))
    vegetarian = MemoryDraft("Hannah is vegetarian.", "fact", (), ("name", "food"))
    script.close_to(name.text, vegetarian.text, 0.6)
    await keeper.remember(PERSON, name)
    second = await keeper.remember(PERSON, vegetarian)
    await judge.drain()
    assert second.created and fake.tasks("same-memory") == []


def test_the_instructions_teach_on_no_memory_of_the_evals() -> None:
    """The examples are the judge's own: no memory in them is one the evals measure it on,
    so the figures of `stillhere eval dedup` are not read off the instructions."""
    said = {
        text.strip()
        for pair in re.findall(r"^M1: (.+?) / M2: (.+?) ->", INSTRUCTIONS, re.MULTILINE)
        for text in pair
    }
    measured: set[str] = set()
    for path in (Path(__file__).parent / "data").glob("dedup_pairs*.jsonl"):
        for line in filter(str.strip, path.read_text(encoding="utf-8").splitlines()):
            pair = orjson.loads(line)
            measured |= {pair["existing"]["text"], pair["new"]["text"]}
    assert len(said) >= 20 and len(measured) > 300
    assert not said & measured
