"""The label fake: an analysis model over HTTP that answers each say from the labelled
cases, the best any model asked one say at a time could do. With it, `stillhere eval turns`
measures the ceiling of reply matching as the server decides it (rules first):

    .venv/bin/python -m tests.fakes.label_analysis --cases tests/data/turn_cases.jsonl

runs that eval against it and prints its report (extra arguments go to the eval).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from cli.main import _parser
from evals.turns import read_cases
from tests.fakes.analysis_server import AnalysisResponse, Answer, Asked, FakeAnalysis


def from_the_labels(path: Path) -> Callable[[Asked], AnalysisResponse]:
    """Answers each say from the cases' labels: the A line whose text the case gives,
    "none" for something new, the likeliest of an unclear case's questions; a say no case
    ends with (one replayed before a case's last) answers the latest line."""
    labels: dict[tuple[str, ...], str | None] = {}
    for case in read_cases(path):
        if case.family == "match":
            turns = case.row["turns"]
            said = (*[t["text"] for t in turns if t["role"] == "assistant"], turns[-1]["text"])
            labels[said] = (case.row.get("unclear") or [case.row.get("answers")])[-1]

    def answer(request: Asked) -> AnalysisResponse:
        texts = [line.split(": ", 1)[1] for line in request.lines]
        key = next((k for k in labels if k[-len(texts) :] == tuple(texts)), None)
        expected = labels.get(key) if key is not None else texts[-2]
        return Answer({"answers": f"A{texts.index(expected) + 1}" if expected else "none"})

    return answer


async def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.label_analysis")
    parser.add_argument("--cases", type=Path, required=True)
    args, rest = parser.parse_known_args(argv)
    async with FakeAnalysis(default=from_the_labels(args.cases)) as fake:
        command = ["eval", "turns", "--cases", str(args.cases), "--analysis-url", fake.url]
        evaluation = _parser().parse_args([*command, *rest])
        return int(await evaluation.run(evaluation))


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
