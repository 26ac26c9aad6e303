"""`bench.same_memory` against the fake analysis model over real HTTP: each way is asked
as it says (the batched request once per chunk, the judge's questions per pair, twice),
and the verdicts are scored against the labels."""

from __future__ import annotations

from pathlib import Path

import orjson

from actors.memory.same_memory import VERDICT
from bench import same_memory as bench
from tests.fakes.analysis_server import Answer, Asked, FakeAnalysis

PAIRS = [
    {"existing": {"text": "Tom doesn't drink alcohol."}, "new": {"text": "Tom is teetotal."},
     "same": True},
    {"existing": {"text": "I work as a nurse."}, "new": {"text": "I work night shifts."},
     "same": False},
]  # fmt: skip


def says_same(asked: Asked) -> Answer:
    """`same` to everything, in the shape each request asks for."""
    if "pairs" in asked.instructions:
        count = sum(line.startswith("M") for line in asked.lines) // 2
        found = [{"existing": f"M{2 * i + 1}", "new": f"M{2 * i + 2}", "verdict": "same"}
                 for i in range(count)]  # fmt: skip
        return Answer({"pairs": found})
    return Answer({"verdict": "same"} if asked.instructions == VERDICT else {"new": False})


async def test_both_ways_are_asked_and_scored(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(p) for p in PAIRS))
    async with FakeAnalysis(default=says_same) as fake:
        args = bench.parse_args(["--url", fake.url, "--pairs", str(path), "--limit", "2"])
        report = await bench.measure(args)
        asked = fake.tasks("same-memory")
    # One batched request of both pairs, then each pair judged twice: three questions each.
    assert len(asked) == 1 + 2 * 2 * 3
    assert sum(line.startswith("M") for line in asked[0].lines) == 4
    assert all(a.body["max_tokens"] == 12 for a in asked[1:])
    for way in ("batched", "current"):
        figures = report["ways"][way]
        assert (figures["merged_right"], figures["false_merges"]) == (1, 1), way
    assert report["ways"]["current"]["requests"] == 3
    assert report["ways"]["current"]["stable"] == 2
