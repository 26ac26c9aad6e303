"""`stillhere-bench connections` at a small N: both servers measured, the deactivating one
holding fewer running actors than the one that never deactivates (and, with a thread per
actor, fewer threads)."""

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
    # A thread per running actor, so that deactivation shows in the threads too.
    command += ["--sample", "3", "--actor-threads", "0", "--json", str(path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(path.read_text())

    assert report["actor_threads"] == 0
    on, off = report["servers"]["deactivating"], report["servers"]["never"]
    for server in (on, off):
        assert server["phones_connected"] == server["links"] == 20
        assert server["rss_per_phone_kb"] is not None and server["threads_held"] > 0
        assert server["rss_per_added_phone_kb"] is not None
        for kind in ("quiet", "talking"):
            assert set(server["first_delta_ms"][kind]) == PERCENTILES
        assert server["errors"] == {}
        # The phones' own collector held off while the says were timed (bench/phones_gc.py).
        assert server["phones_gc"]["mode"] == "off"
        assert server["phones_gc"]["collections"] == [0, 0, 0]
    assert off["actors_running"] == 20 and off["deactivations"] == 0
    # One phone talks every second; the other 19 were quiet past --actor-idle.
    assert on["actors_running"] <= 1 and on["deactivations"] >= 19
    assert on["threads_held"] < off["threads_held"]
    assert on["activations_after_sample"] >= 3  # each quiet phone's say activated its actor
    assert off["activations_after_sample"] == 0
    assert report["threads_ratio"] < 1


@pytest.mark.timeout(240)
def test_connections_ramp_from_two_addresses(tmp_path: Path) -> None:
    """The ramp's phones spread over two loopback source addresses, as past 25,000 they
    must be: every link comes from one of them, and each step is measured whole."""
    path, png = tmp_path / "ramp.json", tmp_path / "ramp.png"
    command = [sys.executable, "-m", "bench.connections", "--steps", "6,12", "--sources", "2"]
    command += ["--hold", "3s", "--idle-window", "1s", "--actor-idle", "1s"]
    command += ["--say-every", "1s", "--ping-every", "1s", "--sample", "3", "--resume-sample", "4"]
    command += ["--phones-gc", "plain", "--json", str(path), "--plot", str(png)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(path.read_text())

    assert report["source_addresses"] == ["127.0.0.2", "127.0.0.3"]
    assert report["reached"] == 12 and report["stopped"] is None
    soft, hard = report["descriptor_limits"]["bench"]
    assert soft == hard == report["descriptor_limits"]["server"][0]
    for step, n in zip(report["steps"], (6, 12), strict=True):
        assert step["phones_connected"] == step["links"] == n
        assert step["from"] == {"127.0.0.2": n // 2, "127.0.0.3": n // 2}
        assert step["resumed"] == step["resume_sample"] == 4
        assert set(step["resume_ms"]) == PERCENTILES and step["resume_ms"]["p99"] is not None
        for kind in ("quiet", "talking"):
            assert step["first_delta_ms"][kind]["p99"] is not None
        lag = step["server_while_timed"]["server_loop_lag_ms"]
        assert lag["n"] >= 1 and lag["p100_le"] is not None  # the loop's timer ran meanwhile
        assert step["errors"] == {}
        assert step["phones_gc"]["mode"] == "plain" and step["phones_gc"]["pause_ms_max"] >= 0
        assert step["actors_running"] <= 1 and step["deactivations"] >= n - 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
