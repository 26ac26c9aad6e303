"""`stillhere-bench cluster-kill`, small: a real cluster of two nodes behind Debian's HAProxy,
the node owning the most of its phones' people killed with SIGKILL while they flap. What
must hold at any size is asserted (its people all resumed, nothing acked lost, nothing
stored twice, no seq repeated); the timings are the bench's to report (bench/README.md),
never asserted."""

from __future__ import annotations

import argparse

import pytest

from bench import cluster_kill
from tests.test_deploy import needs_haproxy


@needs_haproxy
@pytest.mark.timeout(300)
async def test_the_kill_bench_resumes_the_killed_nodes_people_and_loses_nothing() -> None:
    parser = argparse.ArgumentParser()
    cluster_kill.add_options(parser)
    args = parser.parse_args(
        ["--clients", "6", "--window", "10s", "--after", "8s", "--flap-every", "2s",
         "--rehearsal-latency", "100ms", "--settle-timeout", "60s"]
    )  # fmt: skip
    report = await cluster_kill.measure(args)

    kill, ledger = report["kill"], report["ledger"]
    assert kill["victims"] > 0  # the killed node owned someone
    assert kill["victims_not_resumed"] == 0
    assert kill["resume_s"]["n"] == kill["victims_up"]
    assert ledger["says"] > 0
    assert ledger["acked_says_lost"] == ledger["stored_twice"] == 0
    assert ledger["seq_repeated"] == ledger["stored_wrong_person"] == 0
    assert report["unsettled"] == 0
    stable = report["stable"]
    assert stable["resume_ms_haproxy"]["n"] > 0 and stable["resume_ms_direct"]["n"] > 0
    assert "kill -> resumed" in cluster_kill.table(report)
