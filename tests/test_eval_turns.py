"""`stillhere eval turns` on the shipped labelled cases: the report's shape and the echo
guard's targets (no wrong cut, at least 95% of echoes caught), which are correctness
figures, not timings."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from transport import eval_turns
from transport.cli import _parser

CASES = Path(__file__).parent / "data" / "turn_cases.jsonl"
ECHO_KINDS = {
    "echo/person_exact",
    "echo/person_near",
    "echo/assistant",
    "echo/partial",
    "echo/short_phrase",
    "echo/quote",
}
FIGURES = {"cases", "echoes", "cuts", "right", "wrong", "missed", "caught", "asked_again"}


async def evaluate(*argv: str) -> int:
    args = _parser().parse_args(["eval", "turns", *argv])
    return await args.run(args)


async def test_the_shipped_cases_meet_the_echo_targets(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert await evaluate("--cases", str(CASES), "--json", str(out)) == 0
    report = orjson.loads(out.read_bytes())
    echo = report["echo"]
    assert report["cases"] == echo["cases"] >= 100
    assert set(echo["kinds"]) == ECHO_KINDS
    assert all(set(figures) >= FIGURES for figures in echo["kinds"].values())
    assert set(echo) >= FIGURES and echo["targets"] == {"wrong": 0, "caught": 0.95}
    assert echo["wrong"] == 0, echo["failures"]
    assert echo["caught"] >= 0.95 and echo["targets_met"] is True
    assert echo["right"] + echo["missed"] == echo["echoes"]
    assert all(f["verdict"] == "missed" for f in echo["failures"])


def test_how_a_reply_is_split_does_not_change_any_outcome() -> None:
    cases = eval_turns.read_cases(CASES)
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
        ('{"kind": "match/answers_latest"}', "no evaluator for 'match/answers_latest'"),
        ('{"reply": "hi"}', 'needs a "kind"'),
        ("not json", "not JSON"),
        ('{"kind": "echo/quote", "turns": [], "reply": "hi"}', "needs reply and shown"),
    ],
)
async def test_a_bad_line_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, error: str
) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text(line + "\n", encoding="utf-8")
    assert await evaluate("--cases", str(cases)) == 2
    printed = capsys.readouterr().out
    assert error in printed and f"{cases}:1" in printed
