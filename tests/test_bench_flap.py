"""The flap bench, small: real server, reference phones on flapping links, no baselines.

It asserts what must hold at any size (nothing lost or duplicated, every reconnect within
the window resumed), never timings: those are the bench's to report (bench/README.md).
"""

from __future__ import annotations

import pytest

from bench import flap


@pytest.mark.timeout(110)
@pytest.mark.parametrize("transport", ["ws", "mixed"])
async def test_flapping_phones_lose_and_duplicate_nothing(transport: str) -> None:
    args = flap.parse_args(
        [
            "--clients", "20", "--duration", "10s", "--transport", transport,
            "--rss-settle", "0.5s", "--seed", "7", "--think", "2s", "--flap-every", "3s",
            "--rehearsal-latency", "100ms", "--rehearsal-rate", "40",
            "--no-baselines", "--no-progress", "--settle-timeout", "60s", "--timeout", "100s",
        ]
    )  # fmt: skip
    report = await flap.measure(args)

    assert report["ramp_failed"] == 0
    assert report["live_conversations"] == 20
    assert report["says"] > 20 and report["link_events"], "the phones talked and flapped"
    assert report["reconnects"] > 0
    assert report["resumed"] == report["reconnects"], report["examples"]
    for key in flap.CORRECTNESS_KEYS:
        assert report[key] == 0, (key, report["examples"])
    assert report["unsettled"] == 0
    assert report["phone_failures"] == {}
    assert report["frames_tapped_before_dedup"], "the bench sees frames before the client"
    stop = report["server_stop"]
    assert stop["exit_code"] == 0 and not stop["killed"] and stop["log_problems"] == 0
