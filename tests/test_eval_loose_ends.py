"""`stillhere eval loose-ends` on the shipped labelled exchanges: the report's figures with
the rehearsal analysis, with a fake analysis model over HTTP that reads each say it is asked
about as the labels have it, and with one that answers out of shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from cli.main import _parser
from tests.fakes.analysis_server import AnalysisResponse, Answer, Asked, FakeAnalysis
from tests.test_eval_turns import bad_line_named

CASES = Path(__file__).parent / "data" / "loose_end_cases.jsonl"
HELD_OUT = Path(__file__).parent / "data" / "loose_end_cases_holdout.jsonl"
ROWS = [orjson.loads(line) for line in CASES.read_text("utf-8").splitlines()]


async def evaluate(*argv: str) -> dict[str, Any]:
    args = _parser().parse_args(["eval", "loose-ends", *argv])
    assert await args.run(args) == 0
    return orjson.loads(Path(args.json_out).read_bytes())


def labelled(request: Asked) -> AnalysisResponse:
    """A say answers the question before it unless the case labels that question open."""
    said = dict(line.split(": ", 1) for line in request.lines)
    row = next(r for r in ROWS if said["P1"] in r["says"] and r["assistant"][0] == said["A1"])
    return Answer({"answers": "none" if "A1" in row["open"] else "A1"})


@pytest.mark.parametrize("cases", [CASES, HELD_OUT])
async def test_the_shipped_exchanges_with_the_rules(tmp_path: Path, cases: Path) -> None:
    report = await evaluate("--cases", str(cases), "--json", str(tmp_path / "report.json"))
    assert report["cases"] >= 40 and set(report["languages"]) == {"en", "fr"}
    assert report["analysis"].startswith("rehearsal") and report["analysis_failures"] == {}
    assert report["precision"] == round(report["right"] / report["noted"], 4)
    assert report["recall"] == round(report["right"] / report["labelled"], 4)
    assert sum(f["cases"] for f in report["languages"].values()) == report["cases"]


async def test_a_model_reading_as_the_labels_do_never_costs_a_right_note(tmp_path: Path) -> None:
    """Asked only where a turn would ask, one say at a time by `reply-matching`."""
    rules = await evaluate("--cases", str(CASES), "--json", str(tmp_path / "rules.json"))
    async with FakeAnalysis(default=labelled) as fake:
        out = str(tmp_path / "model.json")
        report = await evaluate("--cases", str(CASES), "--analysis-url", fake.url, "--json", out)
    wrong = report["noted"] - report["right"]
    assert report["right"] >= rules["right"] and wrong <= rules["noted"] - rules["right"]
    assert {a.task for a in fake.asked} == {"reply-matching"} and fake.asked
    assert all(sum(line.startswith("P") for line in a.lines) == 1 for a in fake.asked)
    assert all(a.body["response_format"]["type"] == "json_schema" for a in fake.asked)
    assert report["analysis_failures"] == {}


ASKED_BACK = "can you believe they played for three hours?"
UNSURE = [
    # A question back to our question: the rules cannot tell, a turn asks the model.
    {"assistant": ["How was the concert?", "Three hours, what a show!"], "says": [ASKED_BACK]},
    # One message just before, no question back: a turn asks nothing, the rules' reading
    # stands (they read the bank question as left open).
    {"assistant": ["Did you call the bank?", "Okay."], "says": ["tomorrow morning maybe"]},
]


async def test_the_model_is_asked_what_a_turn_asks_and_mends_it(tmp_path: Path) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_bytes(b"\n".join(orjson.dumps({**row, "open": []}) for row in UNSURE))
    rules = await evaluate("--cases", str(cases), "--json", str(tmp_path / "rules.json"))
    async with FakeAnalysis(default=lambda _: Answer({"answers": "A1"})) as fake:
        out = str(tmp_path / "model.json")
        report = await evaluate("--cases", str(cases), "--analysis-url", fake.url, "--json", out)
    assert [m["noted"] for m in rules["misses"]] == [["A1"], ["A1"]]
    assert report["misses"] == [{"case": f"{cases}:2", "noted": ["A1"], "open": []}]
    assert [a.lines for a in fake.asked] == [["A1: How was the concert?", f"P1: {ASKED_BACK}"]]


async def test_answers_out_of_shape_leave_the_rules_reading(tmp_path: Path) -> None:
    rules = await evaluate("--cases", str(CASES), "--json", str(tmp_path / "rules.json"))
    async with FakeAnalysis(default=lambda _: Answer({"answers": "A9"})) as fake:
        out = str(tmp_path / "model.json")
        report = await evaluate("--cases", str(CASES), "--analysis-url", fake.url, "--json", out)
    assert (report["noted"], report["right"]) == (rules["noted"], rules["right"])
    failures = report["analysis_failures"]
    assert failures == {"reply-matching": {"bad_shape": len(fake.asked)}} and fake.asked


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"assistant": ["Hi"], "says": [], "open": []}', "needs assistant and says"),
        ('{"assistant": ["Hi"], "says": ["yo"], "open": ["P2"]}', "open names a line"),
        ("[1]", "needs assistant and says"),
    ],
)
async def test_a_bad_line_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, error: str
) -> None:
    await bad_line_named("loose-ends", tmp_path, capsys, line, error)
