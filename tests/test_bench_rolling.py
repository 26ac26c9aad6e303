"""A rolling restart through HAProxy: the rolling bench, small, as the cluster test it is.

Real processes: `stillhere cluster` with two nodes (the embedded PostgreSQL, Debian's
HAProxy), reference clients on flapping links through HAProxy, each node stopped with
SIGTERM in turn and started again. The phones' ledger and the database must show nothing
acked lost, nothing stored twice, no seq repeated, every say answered and every phone
moved and resumed. Timings are reported by the bench, never asserted.
"""

from __future__ import annotations

import argparse

import pytest

from bench import rolling
from tests.test_deploy import needs_haproxy


@needs_haproxy
@pytest.mark.timeout(240)
async def test_a_rolling_restart_under_flapping_phones_loses_nothing() -> None:
    parser = argparse.ArgumentParser()
    rolling.add_options(parser)
    args = parser.parse_args(
        ["--nodes", "2", "--clients", "8", "--seed", "5", "--before", "2s", "--between", "1s",
         "--think", "1s", "--flap-every", "3s", "--transport", "mixed",
         "--rehearsal-latency", "100ms", "--rehearsal-rate", "20", "--settle-timeout", "60s",
         "--event-loop", "asyncio"]
    )  # fmt: skip
    report = await rolling.measure(args)

    assert report["restarts"] == 2
    assert report["says"] > 8 and report["reconnects"] > 0, "the phones talked and came back"
    assert rolling.problems(report) == [], report["examples"]
    for key in rolling.MUST_BE_ZERO:
        assert report[key] == 0, key
    assert report["resumed"] == report["reconnects"]
    assert report["phones_moved"] == report["phones"] == 8
    assert report["longest_interruption_s"]["n"] == 8
    assert "longest interruption/phone" in rolling.table(report)
