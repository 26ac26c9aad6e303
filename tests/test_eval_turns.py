"""`stillhere eval turns` on the shipped labelled cases: the report's shape, the echo guard's
targets (no wrong cut, at least 95% of echoes caught), which are correctness figures, not
timings, and reply matching scored as the turn would go on, with the rehearsal analysis or
a fake analysis model over HTTP."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from cli.main import _parser
from evals import turns as eval_turns
from evals.cases import Case
from tests.fakes.analysis_server import Answer, Down, FakeAnalysis
from tests.fakes.label_analysis import from_the_labels

CASES = Path(__file__).parent / "data" / "turn_cases.jsonl"
HOLDOUT = Path(__file__).parent / "data" / "turn_cases_holdout.jsonl"
HELD_OUT = Path(__file__).parent / "data" / "reply_cases_heldout.jsonl"
ECHO_KINDS = {
    "echo/person_exact",
    "echo/person_near",
    "echo/assistant",
    "echo/partial",
    "echo/short_phrase",
    "echo/quote",
}
FIGURES = {"cases", "echoes", "cuts", "right", "wrong", "missed", "caught", "asked_again"}
MATCH_KINDS = {"match/latest", "match/earlier", "match/new", "match/unclear"}
MATCH_FIGURES = {
    "cases",
    "right",
    "accuracy",
    "skipped",
    "skipped_share",
    "asked",
    "asked_accuracy",
    "failed",
}


async def evaluate(*argv: str) -> int:
    args = _parser().parse_args(["eval", "turns", *argv])
    return await args.run(args)


async def test_the_shipped_cases_meet_the_echo_targets(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert await evaluate("--cases", str(CASES), "--json", str(out)) == 0
    report = orjson.loads(out.read_bytes())
    echo = report["echo"]
    assert report["cases"] == echo["cases"] + report["match"]["cases"]
    assert echo["cases"] >= 100
    assert set(echo["kinds"]) == ECHO_KINDS
    assert all(set(figures) >= FIGURES for figures in echo["kinds"].values())
    assert set(echo) >= FIGURES and echo["targets"] == {"wrong": 0, "caught": 0.95}
    assert echo["wrong"] == 0, echo["failures"]
    assert echo["caught"] >= 0.95 and echo["targets_met"] is True
    assert echo["right"] + echo["missed"] == echo["echoes"]
    assert all(f["verdict"] == "missed" for f in echo["failures"])


async def test_the_held_out_french_cases_are_read_and_scored(tmp_path: Path) -> None:
    out = tmp_path / "holdout.json"
    assert await evaluate("--cases", str(HOLDOUT), "--json", str(out)) == 0
    match = orjson.loads(out.read_bytes())["match"]
    assert match["cases"] >= 30 and set(match["languages"]) == {"fr"}
    assert set(match["kinds"]) == MATCH_KINDS and match["failed"] == 0


def test_how_a_reply_is_split_does_not_change_any_outcome() -> None:
    cases = [c for c in eval_turns.read_cases(CASES) if c.family == "echo"]
    for case in cases:
        shown = {eval_turns.run_echo_case(case, size).shown for size in (0, 1, 2, 5)}
        assert len(shown) == 1, case.where


async def test_json_alone_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert await evaluate("--cases", str(CASES), "--json") == 0
    assert orjson.loads(capsys.readouterr().out)["echo"]["targets_met"] is True


async def test_the_table_shows_each_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert await evaluate("--cases", str(CASES)) == 0
    printed = capsys.readouterr().out
    assert all(kind in printed for kind in ECHO_KINDS) and "targets" in printed


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"kind": "turn/latest"}', "no evaluator for 'turn/latest'"),
        (
            '{"kind": "match/sideways", "turns": [{"role": "user", "text": "hi"}]}',
            "match kinds are latest, earlier, new, unclear",
        ),
        (
            '{"kind": "match/latest", "turns": [{"role": "user", "text": "hi"}, '
            '{"role": "assistant", "text": "Hello!"}], "answers": "Hello!"}',
            "turns must end with the say",
        ),
        (
            '{"kind": "match/latest", "turns": [{"role": "assistant", "text": "Hello!"}, '
            '{"role": "user", "text": "hi"}], "answers": "Goodbye!"}',
            "answers needs an assistant text of the case",
        ),
        (
            '{"kind": "match/unclear", "turns": [{"role": "assistant", "text": "Tea?"}, '
            '{"role": "user", "text": "yes"}], "unclear": ["Tea?"]}',
            "unclear needs two or more assistant texts",
        ),
        ('{"reply": "hi"}', 'needs a "kind"'),
        ("not json", "not JSON"),
        ('{"kind": "echo/quote", "turns": [], "reply": "hi"}', "needs reply and shown"),
    ],
)
async def test_a_bad_line_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, error: str
) -> None:
    await bad_line_named("turns", tmp_path, capsys, line, error)


async def bad_line_named(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, error: str
) -> None:
    """`stillhere eval COMMAND` refuses a cases file of one bad `line`, naming it."""
    cases = tmp_path / "cases.jsonl"
    cases.write_text(line + "\n", encoding="utf-8")
    args = _parser().parse_args(["eval", command, "--cases", str(cases)])
    assert await args.run(args) == 2
    printed = capsys.readouterr().out
    assert error in printed and f"{cases}:1" in printed


# -- reply matching --------------------------------------------------------------------------


def match_cases() -> list[Case]:
    return [c for c in eval_turns.read_cases(CASES) if c.family == "match"]


async def test_the_shipped_match_cases_are_scored_by_kind_and_language(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert await evaluate("--cases", str(CASES), "--json", str(out)) == 0
    match = orjson.loads(out.read_bytes())["match"]
    assert match["cases"] >= 150 and match["analysis"].startswith("rehearsal")
    assert set(match["kinds"]) == MATCH_KINDS and set(match["languages"]) == {"en", "fr"}
    for figures in [match, *match["kinds"].values(), *match["languages"].values()]:
        assert set(figures) >= MATCH_FIGURES
        assert figures["accuracy"] == round(figures["right"] / figures["cases"], 4)
        assert figures["skipped"] + figures["asked"] == figures["cases"]
    assert sum(k["cases"] for k in match["kinds"].values()) == match["cases"]
    assert len(match["failures"]) == match["cases"] - match["right"]
    assert match["failed"] == 0  # the rehearsal analysis always answers
    # One candidate just before the say, or rules sure of it: decided without asking.
    assert match["kinds"]["match/latest"]["skipped"] > 0
    assert match["skipped_share"] > 0.5 and match["asked"] > 0


async def test_an_analysis_that_always_says_latest_is_right_only_on_latest_cases(
    tmp_path: Path,
) -> None:
    """The fake's neutral answer: every say answers the latest message. It is asked only
    where the rules are unsure, so of the cases asked, exactly the `latest` ones are right."""
    out = tmp_path / "report.json"
    async with FakeAnalysis() as fake:
        code = await evaluate("--cases", str(CASES), "--analysis-url", fake.url, "--json", str(out))
        asked = fake.tasks("reply-matching")
    assert code == 0
    match = orjson.loads(out.read_bytes())["match"]
    kinds = match["kinds"]
    assert match["analysis"].startswith("openai-compatible") and match["failed"] == 0
    assert len(asked) == match["asked"] > 0
    assert all(sum(line.startswith("P") for line in a.lines) == 1 for a in asked)
    narrowed = 0
    for request in asked:  # offered: the questions, the latest message, or none
        said = [line.split(": ", 1) for line in request.lines if line.startswith("A")]
        offered = [ref for ref, text in said if "?" in text or ref == said[-1][0]]
        schema = request.body["response_format"]["json_schema"]["schema"]
        assert schema["properties"]["answers"]["enum"] == [*offered, "none"]
        narrowed += len(offered) < len(said)
    assert narrowed > 0  # an earlier message that asks nothing is not offered
    assert kinds["match/latest"]["asked_accuracy"] == 1.0
    for kind in ("match/earlier", "match/new", "match/unclear"):
        assert kinds[kind]["asked_accuracy"] in (0.0, None)
    assert match["analysis_failures"] == {}


@pytest.mark.parametrize("cases", [CASES, HOLDOUT, HELD_OUT])
async def test_an_analysis_answering_from_the_labels_is_right_wherever_asked(
    tmp_path: Path, cases: Path
) -> None:
    """The ceiling of rules first: every say the model is asked about is right (but an
    unclear one: asked one say at a time, a model names one message), so what else is
    wrong is what the rules were sure of, and wrongly."""
    out = tmp_path / "report.json"
    async with FakeAnalysis(default=from_the_labels(cases)) as fake:
        assert (
            await evaluate("--cases", str(cases), "--analysis-url", fake.url, "--json", str(out))
            == 0
        )
    match = orjson.loads(out.read_bytes())["match"]
    assert match["asked"] > 0 and match["failed"] == 0
    for kind, figures in match["kinds"].items():
        if kind != "match/unclear":
            assert figures["asked_accuracy"] in (1.0, None), match["failures"]


async def test_an_analysis_that_fails_leaves_the_rules_reading_and_is_counted(
    tmp_path: Path,
) -> None:
    rules, failing = tmp_path / "rules.json", tmp_path / "failing.json"
    assert await evaluate("--cases", str(CASES), "--json", str(rules)) == 0
    async with FakeAnalysis(default=lambda _: Down()) as fake:
        code = await evaluate(
            "--cases", str(CASES), "--analysis-url", fake.url, "--json", str(failing)
        )
    assert code == 0
    alone, match = (orjson.loads(f.read_bytes())["match"] for f in (rules, failing))
    assert match["failed"] == match["asked"] == alone["asked"] > 0
    assert match["right"] == alone["right"] and match["failures"] == alone["failures"]
    assert match["analysis_failures"] == {"reply-matching": {"http": match["asked"]}}


async def test_answers_of_the_wrong_shape_are_counted_in_the_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    async with FakeAnalysis(default=lambda _: Answer({"answer": "A1"})) as fake:
        code = await evaluate("--cases", str(CASES), "--analysis-url", fake.url, "--json", str(out))
    assert code == 0
    match = orjson.loads(out.read_bytes())["match"]
    assert match["analysis_failures"] == {"reply-matching": {"bad_shape": match["asked"]}}


async def test_the_table_shows_the_analysis_and_each_match_kind(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await evaluate("--cases", str(CASES)) == 0
    printed = capsys.readouterr().out
    assert "reply matching by rehearsal" in printed
    assert all(kind in printed for kind in MATCH_KINDS)
