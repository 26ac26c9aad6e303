"""Python's cyclic garbage collector, tuned for a server whose heap is mostly long-lived.

Every conversation holds its window, cards and replay buffer for as long as it lives, so
with 2,000 conversations the heap holds millions of tracked objects. At CPython's default
thresholds (700, 10, 10) the young generations are collected so often that the transient
objects of each turn (frames in flight, futures, records) survive into the old generation,
and a full collection, which walks the whole heap while the event loop waits, followed
every few seconds: in a 2,000-phone `bench flap` run, 360 to 440 ms each, every 8 s, and
the resume p99 was 400 to 1,000 ms (stop 12). A first threshold of 50,000 made full
collections rare, but the first threshold counts allocations less deallocations, and the
deaths of older objects pull it down: with phones reconnecting all the time, a young
collection came only every 20 to 30 s and then walked some 180,000 survivors (a link's
machinery, for every link made meanwhile), 190 to 430 ms with the loop stopped. At 10,000
they come every few seconds and take 30 to 140 ms; generation 1 is then collected every
two minutes or so (0.76 and 0.89 s in a 300 s run). Collections took 11.3 s of that run
against 5.6 s, with no rise in the server's CPU beyond the spread, and over three pairs of
runs at 2,000 phones resume p99 fell by 17 to 25% (bench/README.md, stop 14).

Since stop 17 a WebSocket link that ends leaves no reference cycles (`transport/websocket.py`)
and the server makes no cyclic garbage under that load, so nothing but live objects reaches
the young generation: at 10,000 a young collection comes every 15 s or so and walks the
links made meanwhile (up to 500 ms), and generation 1 was not collected at all in 300 s.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("stillhere.server")

DEFAULT = (10_000, 50, 100)
# A collection this long is worth a line in the log: every link and turn waited for it.
LONG_PAUSE_S = 0.25


def parse_thresholds(text: str) -> tuple[int, int, int]:
    """`10000,50,100` -> (10000, 50, 100): collections of generation 0 every so many net
    allocations, of 1 every so many of 0, of 2 every so many of 1 (CPython's meaning)."""
    try:
        first, second, third = (int(x) for x in text.split(","))
    except ValueError:  # not numbers, or not three of them
        first = second = third = 0
    if min(first, second, third) < 1:
        raise ValueError(
            f"GC thresholds are three whole numbers >= 1 (e.g. 10000,50,100), not {text!r}"
        )
    return first, second, third


def tune_collector(thresholds: tuple[int, int, int]) -> None:
    """Set the three thresholds for this process, and say so in the log."""
    gc.set_threshold(*thresholds)
    log.info("garbage collector thresholds %s", "/".join(map(str, thresholds)))


@contextlib.contextmanager
def timed_collections(
    observe: Callable[[int, float], None], long_pause_s: float = LONG_PAUSE_S
) -> Iterator[None]:
    """For the length of the block, call `observe(generation, seconds)` after every
    collection, and log the ones of `long_pause_s` or more.

    A collection holds the GIL from start to end, in whichever thread triggered it, so its
    length is how long every thread, the event loop's too, stood still. `observe` runs in
    that thread, with the collector not yet done, so it must be thread-safe and quick.
    """
    timer = _CollectionTimer(observe, long_pause_s)
    gc.callbacks.append(timer)
    try:
        yield
    finally:
        gc.callbacks.remove(timer)


class _CollectionTimer:
    def __init__(self, observe: Callable[[int, float], None], long_pause_s: float) -> None:
        self._observe = observe
        self._long_pause_s = long_pause_s
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started
        generation = info["generation"]
        self._observe(generation, seconds)
        if seconds >= self._long_pause_s:
            log.warning(
                "garbage collection of generation %d stopped this process for %.0f ms "
                "(%d objects freed)",
                generation,
                seconds * 1000,
                info["collected"],
            )
