"""bench.live_view runs: a tiny size, its JSON report's shape (never its figures' values)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.test_bench_smoke import run_bench

SIZES = ("load_ms", "update_ms", "list_fetch_ms")


@pytest.mark.skipif(shutil.which("/usr/bin/chromium") is None, reason="no chromium package")
@pytest.mark.timeout(100)
def test_live_view(tmp_path: Path) -> None:
    args = ["--actors", "6", "--baseline", "3", "--runs", "2", "--concurrency", "3"]
    report = run_bench("live_view", [*args, "--timeout", "80"], tmp_path, {0})

    assert [size["actors"] for size in report["sizes"]] == [3, 6]
    for size in report["sizes"]:
        for figure in SIZES:
            assert set(size[figure]) == {"p50", "p95", "p99"}, figure
        assert size["list_fetches"] >= 1
    assert set(report["ratios"]) == set(SIZES)
    assert report["ramp_errors"] == {} and report["page_errors"] == []
    assert report["server_stop"]["exit_code"] == 0
