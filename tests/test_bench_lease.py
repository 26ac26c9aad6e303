"""`stillhere-bench lease` at a small size: its report, read for what a renewal writes (never
its timings), on its own embedded PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import orjson

from bench.__main__ import main


def test_the_node_lease_writes_one_row_whatever_the_people(tmp_path: Path) -> None:
    report_path = tmp_path / "lease.json"
    argv = ["lease", "--people", "30,300", "--rounds", "2", "--json", str(report_path)]
    assert main(argv) == 0
    report = orjson.loads(report_path.read_bytes())
    assert [size["people"] for size in report["sizes"]] == [30, 300]
    for size in report["sizes"]:
        people = size["people"]
        assert size["per_node"]["rows_written"] == 1 and size["per_node"]["statements"] == 1
        for per_person in ("per_person", "joined"):
            assert size[per_person]["rows_written"] == people + 1
            assert size[per_person]["statements"] == 2
        assert size["held_read"]["rows_written"] == 0
    small, large = (size["per_person"]["wal_bytes"] for size in report["sizes"])
    assert large > small  # the per-person renewal's WAL grows with the people
