"""How late the running event loop runs a timer: the time anything ready on it waits.

Whatever the loop does (reading a frame, answering a hello, streaming a reply) waits behind
whatever else is ready, so a loop near saturation adds to every latency without showing in
any handler's own timing. In a 2,000-phone `bench flap` run the phones saw resumes at p95 of
seconds while the server's hello histogram said at most 100 ms: the gap is frames waiting
in a busy loop, the server's or the bench's own. A probe on each loop tells which: it sleeps
a short interval again and again, and reports how late it woke. One timer at a time, so
its cost is bounded (20 wake-ups a second at the default interval).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from providers.background import in_background

log = logging.getLogger("stillhere.loop")

DEFAULT_INTERVAL_S = 0.05


@contextlib.asynccontextmanager
async def loop_lag_probe(
    observe: Callable[[float], None], interval: float = DEFAULT_INTERVAL_S
) -> AsyncIterator[None]:
    """For the length of the block, probe the running loop every `interval` seconds and
    call `observe` with how many seconds late each wake-up was (never below 0)."""
    if interval <= 0:  # a zero sleep would wake on every turn of the loop
        raise ValueError(f"the loop lag interval is above 0 s, not {interval}")
    async with in_background(_probe(observe, interval)):
        yield


async def _probe(observe: Callable[[float], None], interval: float) -> None:
    while True:
        due = time.monotonic() + interval
        await asyncio.sleep(interval)
        try:
            observe(max(0.0, time.monotonic() - due))
        except Exception:  # a broken observer ends the probe, never the loop's work
            log.exception("loop lag probe stopped: observing a lag failed")
            return
