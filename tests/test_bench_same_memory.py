"""`bench.same_memory` against the fake analysis model over real HTTP: each way is asked
as it says (the whole answer written by its schema; the answer's opening sent to go on
from), each pair twice, and the verdicts are scored against the labels."""

from __future__ import annotations

from pathlib import Path

import orjson

from actors.memory.same_memory import OPENING
from bench import same_memory as bench
from tests.fakes.analysis_server import Answer, Asked, FakeAnalysis, opening

PAIRS = [
    {"existing": {"text": "Tom doesn't drink alcohol."}, "new": {"text": "Tom is teetotal."},
     "same": True},
    {"existing": {"text": "I work as a nurse."}, "new": {"text": "I work night shifts."},
     "same": False},
]  # fmt: skip


def says_same(asked: Asked) -> Answer:
    """`same` to everything, sure of it: what follows the opening where the request ends
    with one, else the whole answer."""
    chances = {"same": 0.9, "distinct": 0.1}
    if opening(asked.body) is not None:
        return Answer('same"}', chances=chances)
    return Answer({"verdict": "same"}, chances=chances)


async def test_both_ways_are_asked_and_scored(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(p) for p in PAIRS))
    async with FakeAnalysis(default=says_same, echoes=True) as fake:
        args = bench.parse_args(["--url", fake.url, "--pairs", str(path), "--limit", "2"])
        report = await bench.measure(args)
        asked = fake.tasks("same-memory")
    # Each pair judged twice each way, after one to warm the cache: one request each.
    assert len(asked) == (1 + 2 * 2) * 2
    written, current = asked[:5], asked[5:]
    assert all(a.body["response_format"]["type"] == "json_schema" for a in written)
    assert all(opening(a.body) == OPENING and "response_format" not in a.body for a in current)
    assert all(a.body["max_tokens"] == 12 and a.body["logprobs"] for a in asked)
    for way in bench.WAYS:
        figures = report["ways"][way]
        assert (figures["merged_right"], figures["false_merges"]) == (1, 1), way
        assert (figures["stable"], figures["requests"], figures["no_verdict"]) == (2, 1, 0)
