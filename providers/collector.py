"""Python's cyclic garbage collector, paced for a server whose heap is mostly long-lived.

Every conversation holds its window, cards and replay buffer for as long as it lives, and
every link its connection's machinery for as long as the phone stays, so the heap is large
(some 380,000 tracked objects at 2,000 phones), and a collection walks each object of the
generations it collects with everything else stopped (the GIL is held throughout).

Left to CPython, the first threshold counts allocations less deallocations; the deaths of
older objects pull it down, so with phones reconnecting all the time a young collection
comes seldom and then walks every link made meanwhile, with the loop stopped. A lower first
threshold makes the collections shorter but more frequent, with no clear gain for resumes.

So by default the server paces the collector itself (`paced_collector`), on the loop:
- every `young_every_s` (0.5 s) it freezes the objects made since the last tick
  (`gc.freeze`): no later collection walks them again, and they are still freed as soon
  as nothing refers to them;
- before freezing, it collects those young objects first, but only on sampled ticks: once
  the phones are connected, a young collection stops the loop for its walk and frees next
  to nothing. So each one that frees fewer than `busy_objects` doubles the gap to the next,
  up to `max_gap` ticks (8 s at the defaults), and one that frees more brings back a
  collection every tick;
- every `full_every_s` (10 min) it unfreezes everything and collects all of it, so cycles
  among older objects are freed too; that walks the whole heap, hence seldom.
This leans on the server making next to no cyclic garbage: a link that ends leaves none
(`WebSocketLink._finish` in `transport/websocket.py`).
A cycle frozen uncollected (made between samples, or among frozen objects) waits for the
next full collection; that is what `full_every_s` bounds. Should the server start making
cyclic garbage at `busy_objects` or more a tick (an error path, say), the next sample finds
it, at most `max_gap` ticks later, and collections come every tick again: what waits is that
gap's worth. Garbage made more slowly can wait throughout: at most `busy_objects` a tick,
some 120,000 objects in 10 min at the defaults.

Under `python -m bench.flap --clients 2000 --duration 300 --transport mixed --seed 1`,
CPython's pacing (a server at `--gc-young-every 0`) stopped the loop for up to 500 ms at
a time; paced, every young collection took under 50 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from providers.background import in_background

log = logging.getLogger("stillhere.server")

DEFAULT = (10_000, 50, 100)  # CPython's own pacing: while starting, and at young pace 0
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


@dataclass(frozen=True, slots=True)
class Pace:
    """How the server paces the collector; `young_every_s` 0 leaves it to CPython."""

    young_every_s: float = 0.5
    full_every_s: float = 600.0
    busy_objects: int = 100  # a young collection freeing this many keeps them every tick
    max_gap: int = 16  # ticks between young collections at most, while they free nothing

    def __post_init__(self) -> None:
        if (
            min(self.young_every_s, self.busy_objects) < 0
            or self.full_every_s <= 0
            or self.max_gap < 1
        ):
            raise ValueError(
                "collector pace needs young >= 0 s, full > 0 s, busy >= 0 objects and a gap "
                f">= 1 tick, not {self}"
            )


class YoungSampler:
    """Which ticks collect the young objects before freezing them: every tick while
    collections free `busy_objects` or more, ever fewer (down to one in `max_gap`) while
    they free less."""

    def __init__(self, pace: Pace) -> None:
        self._pace = pace
        self.gap = 1  # ticks from one young collection to the next
        self._waited = 0

    def due(self) -> bool:
        """A tick has come: whether it collects."""
        self._waited += 1
        return self._waited >= self.gap

    def freed(self, objects: int) -> None:
        """What the young collection of a due tick freed."""
        self._waited = 0
        busy = objects >= self._pace.busy_objects
        self.gap = 1 if busy else min(self.gap * 2, self._pace.max_gap)


@contextlib.asynccontextmanager
async def paced_collector(pace: Pace) -> AsyncIterator[None]:
    """For the length of the block, collect on the running loop at `pace` (the module's
    docstring says why), or, with `pace.young_every_s` 0, leave it to CPython. Afterwards
    CPython collects again, with nothing left frozen."""
    if not pace.young_every_s:
        yield
        return
    gc.disable()
    log.info(
        "garbage collector paced: young objects every %g s, all of them every %g s",
        pace.young_every_s,
        pace.full_every_s,
    )
    try:
        async with in_background(_pace(pace)):
            yield
    finally:
        gc.unfreeze()
        gc.enable()


async def _pace(pace: Pace) -> None:
    last_full = time.monotonic()
    sampler = YoungSampler(pace)
    while True:
        await asyncio.sleep(pace.young_every_s)
        if time.monotonic() - last_full >= pace.full_every_s:
            gc.unfreeze()
            gc.collect()
            last_full = time.monotonic()
        elif sampler.due():
            sampler.freed(gc.collect(0))
        gc.freeze()


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
