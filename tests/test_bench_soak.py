"""The soak bench: a tiny run of `stillhere-bench soak`, and its verdict on drawn series.

The run's samples must be readings of the real server: its threads hold the actors' own,
its descriptors the attached links and its PostgreSQL connections, its tables the turns the
phones' says stored. No figure is compared with a time or a fixed value.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import soak

ROOT = Path(__file__).resolve().parent.parent
PHONES = 4


@pytest.mark.timeout(200)
def test_a_tiny_soak_reads_the_real_server(tmp_path: Path) -> None:
    report_path = tmp_path / "soak.json"
    command = [
        sys.executable, "-m", "bench", "soak", "--duration", "8s",
        "--sample-every", "1s", "--clients", str(PHONES), "--think", "1s",
        "--flap-every", "3s", "--rehearsal-latency", "50ms", "--settle-timeout", "60s",
        "--json", str(report_path),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(report_path.read_text())

    assert "slopes per hour" in done.stdout and "bounds:" in done.stdout
    assert report["clients"] == PHONES and report["says"] > PHONES
    assert report["server_stop"]["log_problems"] == 0
    samples = report["samples"]
    assert len(samples) >= 3 and report["judged_samples"] >= 2
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples)
    first, last = samples[0], samples[-1]
    # The first reading comes after every phone's hello and first say, before any link event.
    assert first["live_actors"] == PHONES, "one live conversation per phone"
    # Each link a socket; the pool's connections are read a moment apart (one may close or
    # open between the two reads), so they are not added in.
    assert first["fds_sockets"] > first["links"]
    assert first["links"] >= PHONES
    for s in samples:
        _is_a_reading_of_the_server(s)
    assert last["turns_stored"] > first["turns_stored"], "the says were stored as it ran"
    assert last["table_bytes"]["turns"] >= first["table_bytes"]["turns"]
    assert set(report["slopes_per_hour"]) == set(soak.SERIES)
    assert report["slopes_per_hour"]["turns_stored"] > 0
    assert report["last"]["threads_unexplained"] == last["threads"] - last["actor_threads"]
    names = {b["name"] for b in report["bounds"]}
    assert {"threads_unexplained_max", "fds_unexplained_growth", "table_bytes_per_turn"} <= names
    assert report["last"]["fds_unexplained"] == (
        last["fds"] - last["tcp_established"] - last["db_connections"]
    )
    assert report["within_bounds"] == all(b["within"] for b in report["bounds"])
    assert (done.returncode == 0) == report["within_bounds"]
    assert len(report["machine_at_start"]["load_average"]) == 3


def _is_a_reading_of_the_server(s: dict[str, Any]) -> None:
    assert s["live_actors"] >= 1
    assert 1 <= s["actor_threads"] < s["threads"], "the actors' threads, and the server's own"
    assert s["db_connections"] >= 1, "the server's pool"
    assert s["fds"] > s["fds_sockets"] > s["db_connections"]
    assert s["rss_mb"] > 0 and s["tcp_close_wait"] >= 0 and s["tcp_established"] >= 1
    assert s["tables_mb"] * 2**20 == pytest.approx(sum(s["table_bytes"].values()), abs=2**10)
    assert {"turns", "events", "conversations"} <= set(s["table_bytes"])


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    soak.add_options(parser)
    return parser.parse_args(["--duration", "30m", *extra])


def _steady(minutes: int, **grow: float) -> list[dict[str, Any]]:
    """A sample a minute of a server with 200 live conversations; `grow` adds, per
    minute, to the named readings (a leak)."""
    samples = []
    for m in range(minutes + 1):
        s = {
            "t": 60.0 * m, "rss_mb": 500.0, "threads": 14, "fds": 460, "fds_sockets": 440,
            "tcp_established": 425, "tcp_close_wait": 0, "db_connections": 12,
            "live_actors": 200, "actor_threads": 4, "links": 400,
            "turns_stored": 1000 + 4800 * m, "tables_mb": 10.0 + 4800 * m * 1500 / 2**20,
        }  # fmt: skip
        for key, per_minute in grow.items():
            s[key] += per_minute * m
        samples.append(s)
    return samples


def _over(report: dict[str, Any]) -> set[str]:
    return {b["name"] for b in report["bounds"] if not b["within"]}


def test_a_steady_server_is_within_every_bound() -> None:
    report = soak.figures(_steady(30), _args())

    assert report["within_bounds"] and _over(report) == set()
    assert report["judged_samples"] == 21  # minutes 10 to 30
    assert report["slopes_per_hour"]["threads"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    ("leak", "caught"),
    [
        ({"threads": 1.0}, "threads_unexplained_growth"),
        ({"fds": 1.0, "fds_sockets": 1.0}, "fds_unexplained_growth"),
        ({"fds": 1.0}, "fds_unexplained_growth"),
        ({"fds": 1.0, "fds_sockets": 1.0, "tcp_close_wait": 1.0}, "tcp_close_wait_max"),
        ({"fds": 20, "fds_sockets": 20, "tcp_established": 20}, "connections_unexplained_max"),
        ({"db_connections": 0.5, "fds": 0.5, "fds_sockets": 0.5}, "db_connections_growth"),
        ({"rss_mb": 1.0}, "rss_kb_per_conversation_hour"),
        ({"tables_mb": 5.0}, "table_bytes_per_turn"),
    ],
)
def test_a_leak_is_caught(leak: dict[str, float], caught: str) -> None:
    report = soak.figures(_steady(30, **leak), _args())

    assert not report["within_bounds"]
    assert caught in _over(report)


def test_threads_that_follow_the_live_conversations_are_explained() -> None:
    """Threads growing with live actors, one each (`--actor-threads 0`), are no leak."""
    report = soak.figures(_steady(30, threads=2.0, live_actors=2.0, actor_threads=2.0), _args())

    assert report["slopes_per_hour"]["threads"] == pytest.approx(120.0)
    assert report["slopes_per_hour"]["threads_unexplained"] == pytest.approx(0.0, abs=1e-6)
    assert "threads_unexplained_growth" not in _over(report)


@pytest.mark.parametrize(
    ("option", "value"), [("--sample-every", "0"), ("--duration", "0s"), ("--clients", "0")]
)
def test_a_run_that_could_measure_nothing_is_refused(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        _args(option, value)

    assert refused.value.code == 2
    assert f"argument {option}: needs" in capsys.readouterr().err
