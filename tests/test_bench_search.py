"""`bench.search` on a small base: the report's shape (the figures are in bench/README.md)."""

from __future__ import annotations

from bench.search import SUBJECTS, measure, parse_args, table


async def test_the_search_bench_reports_percentiles_per_size_and_subject(dsn: str) -> None:
    args = parse_args(["--sizes", "60,80", "--queries", "4", "--warmup", "1", "--db", dsn])
    report = await measure(args)
    assert [row["size"] for row in report["sizes"]] == [60, 80]
    for row in report["sizes"]:
        assert row["first_ms"] > 0 and row["partitioned"] is False
        for subject in [*SUBJECTS, *(f"{s}_cpu" for s in SUBJECTS)]:
            figures = row[f"{subject}_ms"]
            assert set(figures) == {"p50", "p95", "p99", "mean"}
            assert 0 <= figures["p50"] <= figures["p99"]
    assert report["targets"] == []  # 10,000 not measured
    assert "first search (builds the index)" in table(report)
