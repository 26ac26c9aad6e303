"""AnalysisModel against a fake analysis model over real HTTP (PROTOCOL 1.1 contract)."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator

import pytest

from providers.analysis import AnalysisModel, Shape, chances
from tests.fakes.analysis_server import Answer, Down, FakeAnalysis, Stall
from tests.test_openai_client import closed_port

KEY = "sk-analysis-secret-0123"
LINES = ["A1: How was your weekend?", "A2: Did you finish that book?", "P1: yes, loved it!"]


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnalysis]:
    async with FakeAnalysis() as server:
        yield server


class Failures:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, task: str, reason: str) -> None:
        self.seen.append((task, reason))


async def ask(url: str, failures: Failures, timeout: float = 2.0) -> dict | None:
    model = AnalysisModel(url, "judge", KEY, timeout=timeout, on_failure=failures)
    try:
        return await model.ask("reply-matching", LINES, "Match each P line.")
    finally:
        await model.close()


async def test_request_follows_the_contract(fake: FakeAnalysis) -> None:
    answer = {"answers": [{"message": "P1", "answers": "A2"}], "open": ["A1"], "lull": False}
    fake.queue(Answer(answer))
    failures = Failures()
    assert await ask(fake.url, failures) == answer
    body = fake.requests[0]
    assert body["stream"] is False
    assert body["response_format"] == {"type": "json_object"}
    assert body["model"] == "judge"
    assert body["messages"][-1]["content"] == "\n".join(["reply-matching", *LINES])
    assert fake.asked[0].task == "reply-matching" and fake.asked[0].lines == LINES
    assert fake.headers[0]["Authorization"] == f"Bearer {KEY}"
    assert failures.seen == []


async def test_fenced_json_is_read(fake: FakeAnalysis) -> None:
    fake.queue(Answer('```json\n{"open": []}\n```'))
    assert await ask(fake.url, Failures()) == {"open": []}


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (Down(503), "http"),
        (Answer("the weekend, I think"), "not_json"),
        (Answer("[1, 2]"), "not_json"),
    ],
)
async def test_broken_answers_are_none_and_counted(
    fake: FakeAnalysis, response: object, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake.queue(response)  # type: ignore[arg-type]
    failures = Failures()
    assert await ask(fake.url, failures) is None
    assert failures.seen == [("reply-matching", reason)]
    line = next(r.getMessage() for r in caplog.records if "analysis" in r.getMessage())
    assert line.startswith(f"analysis reply-matching failed ({reason})")
    assert KEY not in caplog.text


async def test_a_slow_answer_is_dropped_at_the_total_timeout(fake: FakeAnalysis) -> None:
    fake.queue(Answer({"open": []}, delay=1.0))
    failures = Failures()
    started = time.monotonic()
    assert await ask(fake.url, failures, timeout=0.2) is None
    assert time.monotonic() - started < 0.8
    assert failures.seen == [("reply-matching", "timeout")]


async def test_a_stalled_model_is_dropped(fake: FakeAnalysis) -> None:
    fake.queue(Stall())
    failures = Failures()
    assert await ask(fake.url, failures, timeout=0.2) is None
    assert failures.seen == [("reply-matching", "timeout")]


async def test_an_unreachable_model_is_none() -> None:
    failures = Failures()
    assert await ask(f"http://127.0.0.1:{closed_port()}/v1", failures) is None
    assert failures.seen == [("reply-matching", "connect")]


async def test_unknown_task_is_a_programming_error(fake: FakeAnalysis) -> None:
    model = AnalysisModel(fake.url, "judge")
    with pytest.raises(ValueError, match="unknown analysis task"):
        await model.ask("mood", [], "")
    await model.close()


SHAPE = Shape(
    "reply-matching",
    {"type": "object", "properties": {"answers": {"enum": ["A1", "A2", "none"]}}},
    max_tokens=16,
)


async def test_a_shape_is_asked_for_by_json_schema(fake: FakeAnalysis) -> None:
    fake.queue(Answer({"answers": "A2"}))
    model = AnalysisModel(fake.url, "judge")
    try:
        assert await model.ask("reply-matching", LINES, "Match P1.", SHAPE) == {"answers": "A2"}
    finally:
        await model.close()
    body = fake.requests[0]
    assert body["max_tokens"] == 16
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "reply-matching", "strict": True, "schema": SHAPE.schema},
    }
    # The fixed instructions come first, the request's own lines last.
    assert [m["role"] for m in body["messages"]] == ["system", "user"]


async def test_a_server_refusing_json_schema_is_asked_for_json_object_from_then_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = Failures()
    async with FakeAnalysis(refuse_schema=True) as fake:
        fake.queue(Answer({"answers": "A1"}), Answer({"answers": "A2"}))
        model = AnalysisModel(fake.url, "judge", on_failure=failures)
        try:
            first = await model.ask("reply-matching", LINES, "Match P1.", SHAPE)
            second = await model.ask("reply-matching", LINES, "Match P1.", SHAPE)
        finally:
            await model.close()
    assert (first, second) == ({"answers": "A1"}, {"answers": "A2"})
    formats = [body["response_format"]["type"] for body in fake.requests]
    assert formats == ["json_schema", "json_object", "json_object"]
    assert all(body["max_tokens"] == 16 for body in fake.requests)
    assert failures.seen == []
    assert caplog.text.count("refuses json_schema") == 1


WEIGHED = Shape.of(
    "same-memory", {"verdict": {"enum": ["same", "distinct"]}}, max_tokens=12, weighed="verdict"
)


async def test_a_server_refusing_an_opening_still_gets_json_schema_elsewhere(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refusing an answer's opening says nothing of json_schema: the weighed request goes
    plain from then on, reply matching keeps its schema."""
    opened = Shape.of(
        "same-memory",
        {"verdict": {"enum": ["same", "distinct"]}},
        max_tokens=12,
        weighed="verdict",
        opening='{"verdict": "',
    )
    async with FakeAnalysis(refuse_opening=True) as fake:
        fake.queue(Answer({"verdict": "same"}), Answer({"verdict": "distinct"}), task="same-memory")
        fake.queue(Answer({"answers": "A1"}))
        model = AnalysisModel(fake.url, "judge")
        try:
            first = await model.ask("same-memory", ["M1: a", "M2: b"], "Compare.", opened)
            matched = await model.ask("reply-matching", LINES, "Match P1.", SHAPE)
            second = await model.ask("same-memory", ["M1: a", "M2: b"], "Compare.", opened)
        finally:
            await model.close()
    assert (first, matched, second) == (
        {"verdict": "same"},
        {"answers": "A1"},
        {"verdict": "distinct"},
    )
    kinds = [
        "opening" if b["messages"][-1]["role"] == "assistant" else b["response_format"]["type"]
        for b in fake.requests
    ]
    assert kinds == ["opening", "json_object", "json_schema", "json_object"]
    assert caplog.text.count("refuses an answer's opening") == 1


async def test_a_weighed_answer_carries_each_values_chance(fake: FakeAnalysis) -> None:
    """The server is asked for log-probabilities, and the answer says how likely the model
    found each value where it wrote it: its alternatives there, as shares."""
    fake.queue(
        Answer({"verdict": "same"}, chances={"same": 0.6, "distinct": 0.2}), task="same-memory"
    )
    model = AnalysisModel(fake.url, "judge")
    try:
        answer = await model.ask("same-memory", ["M1: a", "M2: b"], "Compare.", WEIGHED)
    finally:
        await model.close()
    assert answer is not None
    assert answer["verdict"] == "same"
    assert answer["chances"] == pytest.approx({"same": 0.75, "distinct": 0.25})
    body = fake.requests[0]
    assert (body["logprobs"], body["top_logprobs"]) == (True, 10)


@pytest.mark.parametrize(
    "answer",
    [Answer({"verdict": "same"}), Answer({"verdict": "same", "chances": {"same": 1.0}})],
    ids=["no-logprobs", "its-own-chances"],
)
async def test_without_log_probabilities_an_answer_has_no_chances(
    fake: FakeAnalysis, answer: Answer
) -> None:
    """A server that gives none, or a model that writes its own, leaves chances unknown."""
    fake.queue(answer, task="same-memory")
    model = AnalysisModel(fake.url, "judge")
    try:
        got = await model.ask("same-memory", ["M1: a", "M2: b"], "Compare.", WEIGHED)
    finally:
        await model.close()
    assert got == {"verdict": "same"}


def token(text: str, *alternatives: tuple[str, float]) -> dict:
    """A token as llama.cpp lists it: its alternatives are the model's own, before any
    schema, the written one first."""
    top = [{"token": t, "logprob": math.log(p)} for t, p in alternatives]
    return {"token": text, "logprob": top[0]["logprob"] if top else 0.0, "top_logprobs": top}


def test_chances_are_read_where_the_value_begins() -> None:
    """As llama.cpp answers (its alternatives are the model's own, before the schema)."""

    tokens = [
        token('{"', ('{"', 0.7), ("distinct", 0.1), ("same", 0.05)),
        token("ver", ("ver", 0.99)),
        token("dict", ("dict", 0.99)),
        token('":', ('":', 0.99)),
        token(' "', (' "', 0.99), (" same", 0.001)),
        token("same", ("same", 0.7), ("distinct", 0.2), ("dist", 0.05), ("different", 0.04)),
        token('"}', ('"}', 0.99)),
    ]
    found = chances(tokens, '{"verdict": "same"}', "verdict", ("same", "distinct"))
    assert found == pytest.approx({"same": 0.7 / 0.95, "distinct": 0.25 / 0.95})


def test_a_value_of_several_tokens_is_weighed_along_what_was_written() -> None:
    """`A` then `1`: A1 and A2 share the chance of `A`; an alternative that leads to
    several values, not written, counts in the whole without being split."""
    labels = ("A1", "A2", "none")
    written_a = [
        token(' "', (' "', 0.99)),
        token("A", ("A", 0.5), ("none", 0.45), ("P", 0.05)),
        token("1", ("1", 0.6), ("2", 0.4)),
        token('"}', ('"}', 0.99)),
    ]
    found = chances(written_a, '{"answers": "A1"}', "answers", labels)
    assert found == pytest.approx({"A1": 0.3 / 0.95, "A2": 0.2 / 0.95, "none": 0.45 / 0.95})
    written_none = [token("none", ("none", 0.7), ("A", 0.3)), token('"}', ('"}', 0.99))]
    found = chances(written_none, '{"answers": "none"}', "answers", labels)
    assert found == pytest.approx({"A1": 0.0, "A2": 0.0, "none": 0.7})


async def test_a_server_refusing_json_schema_is_asked_plainly_for_a_weighed_answer() -> None:
    """A server that refuses the schema may not know log-probabilities either: the retry,
    and every request after it, asks for neither; the answer then has no chances."""
    async with FakeAnalysis(refuse_schema=True) as fake:
        fake.queue(*[Answer({"verdict": "same"})] * 2, task="same-memory")
        model = AnalysisModel(fake.url, "judge")
        try:
            for _ in range(2):
                answer = await model.ask("same-memory", ["M1: a", "M2: b"], "Compare.", WEIGHED)
                assert answer == {"verdict": "same"}
        finally:
            await model.close()
    asked = [("logprobs" in b, b["response_format"]["type"]) for b in fake.requests]
    assert asked == [(True, "json_schema"), (False, "json_object"), (False, "json_object")]
