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
"""

from __future__ import annotations

import gc
import logging

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
