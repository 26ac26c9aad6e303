"""`stillhere eval dedup` with the band judged by a fake analysis model that answers by the
labels: how much of the band a judge reaches, not how well any model judges.

    .venv/bin/python -m tests.fakes.label_judge tests/data/dedup_pairs.jsonl [EVAL OPTIONS]

The fake serves the `same-memory` task over real HTTP, as in the tests; each pair it is shown
gets `same` when the file labels it so, else `distinct`. The eval runs as its own process
with `--analysis-url` pointing at it; further options go to the eval (`--json`, `--embed-local`).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import orjson

from tests.fakes.analysis_server import Answer, Asked, FakeAnalysis

STILLHERE = Path(sys.executable).parent / "stillhere"


def labels(path: Path) -> dict[frozenset[str], bool]:
    """Each labelled pair's two texts, either way round, and whether they are one memory."""
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return {frozenset((r["existing"]["text"], r["new"]["text"])): r["same"] for r in rows}


def judge_by(labelled: dict[frozenset[str], bool]) -> Callable[[Asked], Answer]:
    def answer(asked: Asked) -> Answer:
        texts = dict(line.split(": ", 1) for line in asked.lines if line.startswith("M"))
        pairs = []
        for i in range(1, len(texts), 2):
            existing, new = f"M{i}", f"M{i + 1}"
            same = labelled.get(frozenset((texts[existing], texts[new])), False)
            verdict = "same" if same else "distinct"
            pairs.append({"existing": existing, "new": new, "verdict": verdict})
        return Answer({"pairs": pairs})

    return answer


async def main(pairs: Path, options: list[str]) -> int:
    async with FakeAnalysis(default=judge_by(labels(pairs))) as judge:
        command = [str(STILLHERE), "eval", "dedup", "--pairs", str(pairs)]
        process = await asyncio.create_subprocess_exec(
            *command, "--analysis-url", judge.url, *options
        )
        return await process.wait()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(Path(sys.argv[1]), sys.argv[2:])))
