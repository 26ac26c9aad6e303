"""`python -m bench.analysis` against the fake analysis model over HTTP: both tasks, the
old and the new requests side by side, and what each asks for."""

from __future__ import annotations

from bench import analysis as bench
from tests.fakes.analysis_server import FakeAnalysis


async def test_old_and_new_requests_side_by_side() -> None:
    async with FakeAnalysis() as fake:
        args = bench.parse_args(["--url", fake.url, "--model", "judge", "--requests", "2"])
        result = await bench.measure(args)
    assert set(result["tasks"]) == {"reply-matching", "loose-ends"}
    for figures in result["tasks"].values():
        assert figures["requests"] == 2
        assert figures["old"]["latency_s"]["n"] == figures["new"]["latency_s"]["n"] == 2
        assert figures["old"]["not_json"] == figures["new"]["not_json"] == 0
    # One untimed request of each first, then the old ones and the new ones in a block.
    formats = [r["response_format"]["type"] for r in fake.requests]
    task = ["json_object", "json_schema"] + ["json_object"] * 2 + ["json_schema"] * 2
    assert formats == task * 2
    matching = [a for a in fake.asked if a.task == "reply-matching"]
    assert all(sum(line.startswith("P") for line in a.lines) == 1 for a in matching)
    assert "reply-matching" in bench.table(result)
