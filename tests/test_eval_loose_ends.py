"""`stillhere eval loose-ends` on the shipped labelled exchanges: the report's figures with
the rehearsal analysis and with a fake analysis model over HTTP that lists exactly the
labelled lines (by bare labels, read leniently), or nothing."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from cli.main import _parser
from tests.fakes.analysis_server import AnalysisResponse, Answer, Asked, FakeAnalysis
from tests.test_eval_turns import bad_line_named

CASES = Path(__file__).parent / "data" / "loose_end_cases.jsonl"
LABELLED = {
    tuple(row["says"]): row["open"]
    for row in map(orjson.loads, CASES.read_text("utf-8").splitlines())
}


async def evaluate(*argv: str) -> int:
    args = _parser().parse_args(["eval", "loose-ends", *argv])
    return await args.run(args)


def labelled(request: Asked) -> AnalysisResponse:
    says = tuple(line.split(": ", 1)[1] for line in request.lines if line.startswith("P"))
    return Answer({"loose_ends": LABELLED[says]})


async def test_the_shipped_exchanges_with_the_rules(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert await evaluate("--cases", str(CASES), "--json", str(out)) == 0
    report = orjson.loads(out.read_bytes())
    assert report["cases"] >= 60 and set(report["languages"]) == {"en", "fr"}
    assert report["analysis"].startswith("rehearsal") and report["failed"] == 0
    assert report["precision"] == round(report["right"] / report["noted"], 4)
    assert report["recall"] == round(report["right"] / report["labelled"], 4)
    assert sum(f["cases"] for f in report["languages"].values()) == report["cases"]


async def test_a_model_listing_the_labelled_lines_scores_one(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    async with FakeAnalysis(default=labelled) as fake:
        code = await evaluate("--cases", str(CASES), "--analysis-url", fake.url, "--json", str(out))
    assert code == 0
    report = orjson.loads(out.read_bytes())
    assert (report["precision"], report["recall"], report["targets_met"]) == (1.0, 1.0, True)
    assert report["misses"] == [] and report["analysis_failures"] == {}
    assert all(a.body["response_format"]["type"] == "json_schema" for a in fake.asked)


async def test_a_model_noting_nothing_has_no_recall(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    async with FakeAnalysis() as fake:  # the neutral answer: no loose ends
        assert (
            await evaluate("--cases", str(CASES), "--analysis-url", fake.url, "--json", str(out))
            == 0
        )
    report = orjson.loads(out.read_bytes())
    assert (report["noted"], report["recall"], report["precision"]) == (0, 0.0, None)
    assert report["targets_met"] is False


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
