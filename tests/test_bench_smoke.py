"""Every benchmark runs: each `python -m bench.X` of a tiny size, its JSON report's shape.

Each bench runs as its operators run it, a process of its own started by its module name
(the CPU benches pin threads and CPUs when they are `__main__`, which must not touch the test
process). The figures are never compared with anything: only that they are there.

The other benches have tests of their own: bench.flap and both baselines (started by
`flap.measure`) in test_bench_flap.py, bench.paced in test_bench_paced.py, bench.echo in
test_bench_echo.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evals.search_corpus import SMALLEST

ROOT = Path(__file__).resolve().parent.parent
PERCENTILES = {"p50", "p95", "p99"}


def run_bench(module: str, args: list[str], tmp_path: Path, verdicts: set[int]) -> dict[str, Any]:
    """Run `python -m bench.<module> ARGS --json PATH`, check its exit code is one of
    `verdicts` (a target met or not; 2 is a run that could not finish), read its report."""
    report = tmp_path / f"{module}.json"
    command = [sys.executable, "-m", f"bench.{module}", *args, "--json", str(report)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert done.returncode in verdicts, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(report.read_text())


@pytest.mark.timeout(100)
def test_context(tmp_path: Path) -> None:
    args = ["--sizes", "50,100", "--conversations", "5", "--rounds", "3", "--warmup", "1"]
    report = run_bench("context", args, tmp_path, {0})

    assert [row["memories"] for row in report["rows"]] == [50, 100]
    for row in report["rows"]:
        assert row["past_conversations"] == 5 and row["context_chars"] > 0
        assert "5 rules, failed sources: none" in row["handed"]
        for subject in ("assemble", "rules", "conversations", "recent", "sample"):
            assert set(row[subject]) == {"p50", "p99", "max", "n"}, subject
            assert row[subject]["n"] == 3, subject
    assert report["target"] == {"measured": False}, "10,000 memories were not among the sizes"


@pytest.mark.timeout(100)
def test_fingerprint(tmp_path: Path) -> None:
    args = ["--singles", "3", "--batches", "1", "--batch", "2", "--no-pin"]
    report = run_bench("fingerprint", args, tmp_path, {0, 1})  # 1: the target not met here

    assert report["dim"] > 0 and report["load_s"] > 0
    for mode, calls in (("single", 3), ("batch2", 1)):
        figures = report[mode]
        assert figures["calls"] == calls, mode
        for timing in ("cpu_ms_per_memory", "wall_ms_per_memory"):
            subjects = figures[timing]
            assert set(subjects) == {"paired", "minilm", "use", "tokenizer", "hashing"}, timing
            assert all(set(p) >= PERCENTILES for p in subjects.values()), timing
        assert set(figures["under_target"]) == PERCENTILES
    assert sum(row["memories"] for row in report["single_by_tokens"]) == 3


@pytest.mark.timeout(100)
def test_live(tmp_path: Path) -> None:
    args = ["--conversations", "4", "--sample", "2", "--concurrency", "4", "--settle", "0.2"]
    report = run_bench("live", [*args, "--timeout", "60"], tmp_path, {0})

    assert report["conversations_live"] == 4 and report["resumed_ok"] == 2
    assert report["ramp_errors"] == {} and report["latency_errors"] == {}
    assert report["rss_mb_live"] > 0 and report["server_threads"] > 0
    for latency in ("resume_ms", "new_ms"):
        assert set(report[latency]) == PERCENTILES, latency
    assert set(report["resume_over_new"]) == {"p50", "p99"}
    assert report["server_stop"]["exit_code"] == 0 and report["server_log_problems"] == 0


@pytest.mark.timeout(100)
def test_memory_lookup(tmp_path: Path) -> None:
    args = ["--sizes", "50,100", "--dims", "384", "--keeper-sizes", "100"]
    args += ["--queries", "4", "--warmup", "1", "--builds", "1"]
    report = run_bench("memory_lookup", args, tmp_path, {0})

    assert [(r["dim"], r["size"]) for r in report["results"]] == [(384, 50), (384, 100)]
    for result, keeper in zip(report["results"], (False, True), strict=True):
        subjects = {"faiss", "numpy", "index"} | ({"keeper", "verbatim"} if keeper else set())
        assert set(result["lookup_ms"]) == subjects
        assert all(figures["n"] == 4 for figures in result["lookup_ms"].values())
        assert result["build"]["builds_counted"] == 1
    outcomes = report["results"][1]["keeper"]["outcomes"]
    assert sum(outcomes.values()) == 4, "every look-up of the keeper's pass was judged"
    assert report["targets"] == [], "10,000 memories were not among the sizes"


@pytest.mark.timeout(100)
def test_search(tmp_path: Path) -> None:
    args = ["--sizes", str(SMALLEST), "--queries", "2", "--warmup", "0"]
    report = run_bench("search", args, tmp_path, {0})

    (size,) = report["sizes"]
    assert size["size"] == SMALLEST and size["first_ms"] > 0
    for subject in ("search", "given_fingerprint", "embed"):
        for clock in ("ms", "cpu_ms"):
            assert set(size[f"{subject}_{clock}"]) >= PERCENTILES, (subject, clock)
    assert report["queries"] == 2 and report["targets"] == []


@pytest.mark.timeout(100)
def test_slow_readers(tmp_path: Path) -> None:
    args = ["--phones", "3", "--says", "2", "--pause", "0.1", "--link-buffer", "64KB"]
    report = run_bench("slow_readers", args, tmp_path, {0})

    assert (report["phones"], report["link_buffer_bytes"]) == (3, 65536)
    assert report["reading"]["ends"] == {"read": 3, "open": 0, "error": 0, "cut": 0, "refused": 0}
    assert report["reading"]["error_codes"] == {}
    stalled = report["stalled"]
    assert sum(stalled["ends"].values()) == 3 and stalled["ends"]["read"] == 0
    assert set(stalled["server_closed"]) == {"slow_reader", "hello_timeout"}
    assert report["reading"]["replies_cut"] == stalled["replies_cut"] == 0  # stories told whole
    assert stalled["errors"] == 0
    for fleet in (report["reading"], stalled):
        assert fleet["peak_rss_mb"] >= fleet["idle_rss_mb"] > 0
    assert "held_over_baseline" in report and report["server_stop"]["log_problems"] == 0


@pytest.mark.timeout(180)
def test_hello_flood(tmp_path: Path) -> None:
    args = ["--phones", "4", "--resumes", "2", "--flooders", "3"]
    args += ["--address-limit", "2", "--address-rate", "1", "--address-burst", "2"]
    report = run_bench("hello_flood", args, tmp_path, {0})

    for limits in ("off", "on"):
        for phase in ("alone", "flooded"):
            assert report[limits][phase]["errors"] == 0, report[limits][phase]
            assert set(report[limits][phase]["resume_ms"]) >= PERCENTILES
            assert report[limits][phase]["resume_ms"]["n"] == 8
        assert report[limits]["p99_over_baseline"] is not None
        assert report[limits]["server_stop"]["log_problems"] == 0
    assert report["off"]["options"] == []
    assert "--links-per-s-per-address" in report["on"]["options"]
    off, on = report["off"]["flooded"], report["on"]["flooded"]
    assert off["flood_hellos_per_s"] > 0 and off["flood_refused_per_s"] == 0
    assert on["flood_hellos_per_s"] > 0 and on["flood_refused_per_s"] > 0
    assert on["flood_hellos_per_s"] < off["flood_hellos_per_s"]
    assert report["flooded_p99_on_over_off"] is not None
