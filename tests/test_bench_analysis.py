"""`python -m bench.analysis` against the fake analysis model over HTTP: the old and the new
reply-matching requests side by side, and the new ones after a loose-ends request."""

from __future__ import annotations

from bench import analysis as bench
from tests.fakes.analysis_server import FakeAnalysis


async def test_old_new_and_evicted_requests_side_by_side() -> None:
    async with FakeAnalysis() as fake:
        args = bench.parse_args(["--url", fake.url, "--model", "judge", "--requests", "2"])
        result = await bench.measure(args)
    figures = result["tasks"]["reply-matching"]
    assert figures["requests"] == 2
    for kind in ("old", "new", "evicted"):
        assert figures[kind]["latency_s"]["n"] == 2 and figures[kind]["not_json"] == 0
    # One untimed request of each, then a block of each kind; each evicted one follows a
    # loose-ends request with other instructions.
    tasks = [a.task for a in fake.asked]
    assert tasks == ["reply-matching"] * 6 + ["loose-ends", "reply-matching"] * 2
    formats = [r["response_format"]["type"] for r in fake.requests]
    assert formats[:6] == ["json_object", "json_schema", *["json_object"] * 2, *["json_schema"] * 2]
    instructions = {a.body["messages"][0]["content"] for a in fake.asked[-2:]}
    assert len(instructions) == 2  # the loose-ends request's and the matching's differ
    matching = [a for a in fake.asked if a.task == "reply-matching"]
    assert all(sum(line.startswith("P") for line in a.lines) == 1 for a in matching[2:])
    assert "evicted" in bench.table(result)
