"""Python's cyclic garbage collector, tuned for a server whose heap is mostly long-lived.

Every conversation holds its window, cards and replay buffer for as long as it lives, so
with 2,000 conversations the heap holds millions of tracked objects. At CPython's default
thresholds (700, 10, 10) the young generations are collected so often that the transient
objects of each turn (frames in flight, futures, records) survive into the old generation,
and a full collection, which walks the whole heap while the event loop waits, followed
every few seconds: in a 2,000-phone `bench flap` run, 360 to 440 ms each, every 8 s, and
the resume p99 was 400 to 1,000 ms. With a first threshold of 50,000 they die young, full
collections become rare, and a 60 s run's resume p99 fell to 81 ms (bench/README.md).
Cyclic garbage is still collected, only later: a 300 s run's peak RSS rose from 349 to
421 MB, while what an idle conversation costs did not change.

Even so, at 2,000 phones the young generation held 50,000 to 230,000 objects when it was
collected (asyncio's waiting coroutines, futures and callbacks, which live for a fraction
of a second to seconds), and each collection held the loop 40 to 380 ms, every second or
two; nearly all of it survived. So by default (`--gc-every`, 5 min) the automatic collector
is off: reference counting frees almost everything, the objects of start-up are frozen out
of every collection, and a full collection on a schedule reclaims the cycles (a dropped
link's exception and its frames, say). With the collector off, resume p99 in a 60 s run at
2,000 phones fell from 324 to 82 ms and the server's CPU by 12% (bench/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator

log = logging.getLogger("stillhere.server")

DEFAULT = (50_000, 50, 100)


def parse_thresholds(text: str) -> tuple[int, int, int]:
    """`50000,50,100` -> (50000, 50, 100): collections of generation 0 every so many net
    allocations, of 1 every so many of 0, of 2 every so many of 1 (CPython's meaning)."""
    try:
        first, second, third = (int(x) for x in text.split(","))
    except ValueError:  # not numbers, or not three of them
        first = second = third = 0
    if min(first, second, third) < 1:
        raise ValueError(
            f"GC thresholds are three whole numbers >= 1 (e.g. 50000,50,100), not {text!r}"
        )
    return first, second, third


def tune_collector(thresholds: tuple[int, int, int]) -> None:
    """Set the three thresholds for this process, and say so in the log."""
    gc.set_threshold(*thresholds)
    log.info("garbage collector thresholds %s", "/".join(map(str, thresholds)))


@contextlib.asynccontextmanager
async def scheduled_collections(every: float) -> AsyncIterator[None]:
    """For the length of the block, collect on a schedule instead of by thresholds: freeze
    what exists now (start-up: modules, models), turn the automatic collector off, and run a
    full collection every `every` seconds. `every` 0 leaves the automatic collector on."""
    if every <= 0:
        yield
        return
    gc.freeze()  # O(1): start-up's objects are never walked again
    gc.disable()
    log.info("garbage collector: automatic off, a full collection every %d s", every)
    task = asyncio.get_running_loop().create_task(_collect_every(every))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        gc.enable()
        gc.unfreeze()


async def _collect_every(every: float) -> None:
    while True:
        await asyncio.sleep(every)
        started = time.perf_counter()
        freed = gc.collect()
        log.info(
            "garbage collector: %d unreachable objects freed in %.0f ms",
            freed,
            (time.perf_counter() - started) * 1000,
        )
