"""`stillhere-bench connections` at a small N: both servers measured, the deactivating one
holding fewer threads and running actors than the one that never deactivates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bench_smoke import PERCENTILES, ROOT


@pytest.mark.timeout(240)
def test_connections(tmp_path: Path) -> None:
    """Two servers each start an embedded PostgreSQL and load the embedding models: on a
    busy machine that alone may take a minute."""
    path = tmp_path / "connections.json"
    command = [sys.executable, "-m", "bench.connections", "--phones", "20", "--hold", "3s"]
    command += ["--actor-idle", "2s", "--say-every", "1s", "--ping-every", "1s"]
    command += ["--sample", "3", "--json", str(path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(path.read_text())

    on, off = report["servers"]["deactivating"], report["servers"]["never"]
    for server in (on, off):
        assert server["phones_connected"] == server["links"] == 20
        assert server["rss_per_phone_kb"] is not None and server["threads_held"] > 0
        assert server["rss_per_added_phone_kb"] is not None
        for kind in ("quiet", "talking"):
            assert set(server["first_delta_ms"][kind]) == PERCENTILES
        assert server["errors"] == {}
    assert off["actors_running"] == 20 and off["deactivations"] == 0
    # One phone talks every second; the other 19 were quiet past --actor-idle.
    assert on["actors_running"] <= 1 and on["deactivations"] >= 19
    assert on["threads_held"] < off["threads_held"]
    assert on["activations_after_sample"] >= 3  # each quiet phone's say activated its actor
    assert off["activations_after_sample"] == 0
    assert report["threads_ratio"] < 1
