"""`bench.same_memory` against the fake analysis model over real HTTP: each way is asked
as it says (the checked judge's questions, the current judge's weighed verdict, each pair
twice), and the verdicts are scored against the labels."""

from __future__ import annotations

from pathlib import Path

import orjson

from bench import same_memory as bench
from bench.same_memory import CHECKED_NEWS
from tests.fakes.analysis_server import Answer, Asked, FakeAnalysis

PAIRS = [
    {"existing": {"text": "Tom doesn't drink alcohol."}, "new": {"text": "Tom is teetotal."},
     "same": True},
    {"existing": {"text": "I work as a nurse."}, "new": {"text": "I work night shifts."},
     "same": False},
]  # fmt: skip


def says_same(asked: Asked) -> Answer:
    """`same` to everything, in the shape each request asks for; sure of it."""
    if asked.instructions == CHECKED_NEWS:
        return Answer({"new": False})
    return Answer({"verdict": "same"}, chances={"same": 0.9, "distinct": 0.1})


async def test_both_ways_are_asked_and_scored(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(p) for p in PAIRS))
    async with FakeAnalysis(default=says_same) as fake:
        args = bench.parse_args(["--url", fake.url, "--pairs", str(path), "--limit", "2"])
        report = await bench.measure(args)
        asked = fake.tasks("same-memory")
    # Each pair judged twice each way, after one to warm the cache: three questions
    # checked, one weighed.
    assert len(asked) == (1 + 2 * 2) * (3 + 1)
    assert all(a.body["max_tokens"] == 12 for a in asked)
    assert sum("logprobs" in a.body for a in asked) == 1 + 2 * 2
    for way in ("checked", "current"):
        figures = report["ways"][way]
        assert (figures["merged_right"], figures["false_merges"]) == (1, 1), way
        assert figures["stable"] == 2
    assert report["ways"]["checked"]["requests"] == 3
    assert report["ways"]["current"]["requests"] == 1
