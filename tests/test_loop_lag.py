"""The loop lag probe: a loop held by blocking work is seen late, and the probe ends cleanly.

No timing is asserted as fast: only that a block of known length is seen (a timer cannot
fire while a callback holds the loop) and that stopping and failing leave nothing behind.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from providers.loop_lag import loop_lag_probe

INTERVAL_S = 0.01


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


def _probes() -> list[asyncio.Task[object]]:
    """The probe tasks alive on this loop."""
    return [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__name__", "") == "_probe"]


async def test_a_blocked_loop_is_seen_late() -> None:
    block_s = 0.2
    lags: list[float] = []
    async with loop_lag_probe(lags.append, interval=INTERVAL_S):
        await _until(lambda: len(lags) >= 2)  # the probe is running
        seen = len(lags)
        # The probe's timer is due at most one interval from now: holding the loop for
        # block_s makes it fire at least block_s - interval late.
        asyncio.get_running_loop().call_soon(time.sleep, block_s)
        await _until(lambda: len(lags) >= seen + 2)
    assert min(lags) >= 0.0
    assert max(lags[seen:]) >= block_s * 0.8


async def test_leaving_the_block_stops_the_probe() -> None:
    lags: list[float] = []
    async with loop_lag_probe(lags.append, interval=INTERVAL_S):
        assert len(_probes()) == 1
        await _until(lambda: len(lags) >= 1)
    assert _probes() == []
    seen = len(lags)
    await asyncio.sleep(INTERVAL_S * 5)
    assert len(lags) == seen, "nothing observed after the block"


async def test_cancelling_the_task_in_the_block_stops_the_probe() -> None:
    lags: list[float] = []

    async def measured() -> None:
        async with loop_lag_probe(lags.append, interval=INTERVAL_S):
            await asyncio.sleep(3600)

    task = asyncio.get_running_loop().create_task(measured())
    await _until(lambda: len(lags) >= 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _probes() == []


async def test_a_failing_observer_ends_the_probe_not_the_block(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[float] = []

    def broken(lag: float) -> None:
        calls.append(lag)
        raise RuntimeError("full")

    with caplog.at_level(logging.ERROR, logger="stillhere.loop"):
        async with loop_lag_probe(broken, interval=INTERVAL_S):
            await _until(lambda: not _probes())
    assert len(calls) == 1
    assert "loop lag probe stopped" in caplog.text


async def test_the_interval_is_above_zero() -> None:
    with pytest.raises(ValueError, match="above 0 s"):
        async with loop_lag_probe(lambda lag: None, interval=0.0):
            pass
