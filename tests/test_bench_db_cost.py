"""`stillhere-bench db-cost`, small: a real server's turns read from its PostgreSQL's own
counters. What is checked is that the readings are of the turns (each stores its say and its
reply, goes through the say log's fenced write, and writes WAL), never how large a figure is
against a fixed value: the figures are the bench's to report (bench/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PHONES, SAYS = 3, 4


@pytest.mark.timeout(240)
def test_a_tiny_db_cost_run_reads_the_turns_from_postgresql(tmp_path: Path) -> None:
    report_path = tmp_path / "db-cost.json"
    command = [
        sys.executable, "-m", "bench", "db-cost", "--phones", str(PHONES),
        "--says", str(SAYS), "--serial-says", str(SAYS), "--idle", "2s", "--json", str(report_path),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(report_path.read_text())

    assert "PostgreSQL's cost per hello or turn" in done.stdout
    assert report["server_stop"]["log_problems"] == 0
    phases = report["phases"]
    assert list(phases) == ["hello", "turns", "serial", "memory"]
    assert [phases[p]["units"] for p in phases] == [PHONES, PHONES * SAYS, SAYS, PHONES * 2]
    for name, got in phases.items():
        per = got["per_unit"]
        assert per["statements"] > 0 and per["wal_bytes"] > 0, name
    # Phones talking at once share the say log's batched writes, so a loaded turn may cost
    # less than one statement; one phone's says, each awaited, cannot share theirs.
    assert phases["serial"]["per_unit"]["statements"] >= 1
    for name in ("turns", "serial", "memory"):
        per = phases[name]["per_unit"]
        # A turn stores its say and its reply at least (rows of the server's own tables).
        assert per["rows_inserted"] >= 2, name
        assert per["statement_wal_bytes"] > 0, name
        queries = " ".join(row["query"] for row in phases[name]["top_statements"])
        assert "owners" in queries, f"{name}: the fenced write is among the statements"
    memory = " ".join(row["query"] for row in phases["memory"]["top_statements"])
    assert "INSERT INTO cards" in memory, "each remembering turn stored a memory"
    assert "INSERT INTO cards" not in " ".join(
        row["query"] for row in phases["turns"]["top_statements"]
    )
