"""The collector: paced by the server (`--gc-young-every`, `--gc-full-every`) or left to
CPython at `--gc-thresholds`, and its collections timed."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import sys
import weakref
from collections.abc import Iterator

import pytest

from providers import collector
from providers.collector import (
    DEFAULT,
    Pace,
    YoungSampler,
    paced_collector,
    timed_collections,
    tune_collector,
)
from tests.conftest import Harness, eventually


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_tuning_sets_the_three_thresholds(restored: None) -> None:
    tune_collector((1234, 5, 6))
    assert gc.get_threshold() == (1234, 5, 6)
    tune_collector(DEFAULT)
    assert gc.get_threshold() == DEFAULT and gc.isenabled()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_each_collection_is_timed_and_a_long_one_logged(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[int, float]] = []
    callbacks = list(gc.callbacks)
    with (
        caplog.at_level(logging.WARNING, "stillhere.server"),
        timed_collections(lambda g, s: seen.append((g, s)), long_pause_s=0.0),
    ):
        _Cycle()
        freed = gc.collect(2)
    assert gc.callbacks == callbacks, "leaving the block removes the timer"
    assert len(seen) == 1 and seen[0][0] == 2 and seen[0][1] >= 0.0
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1
    assert logged[0].startswith("garbage collection of generation 2 stopped this process for")
    assert f"({freed} objects freed)" in logged[0] and freed >= 1


def test_a_short_collection_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[int] = []
    with (
        caplog.at_level(logging.WARNING, "stillhere.server"),
        timed_collections(lambda g, s: seen.append(g), long_pause_s=math.inf),
    ):
        gc.collect(0)
    assert seen == [0] and not caplog.records


async def test_paced_young_collections_free_young_cycles_and_freeze_the_rest() -> None:
    async with paced_collector(Pace(young_every_s=0.02, full_every_s=3600)):
        assert not gc.isenabled(), "CPython no longer collects by itself"
        dead = weakref.ref(_Cycle())
        kept = _Cycle()
        await eventually(lambda: dead() is None, timeout=5)
        assert gc.get_freeze_count() > 0
        # `kept` lived through a tick, so it is frozen: a cycle it ends in stays, for now.
        frozen = weakref.ref(kept)
        del kept
        await asyncio.sleep(0.2)
        assert frozen() is not None
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.collect()
    assert frozen() is None


def test_young_collections_thin_out_while_they_free_nothing_and_return_when_they_do() -> None:
    sampler = YoungSampler(Pace(busy_objects=10, max_gap=8))
    collected_on: list[int] = []
    for tick in range(1, 41):
        if sampler.due():
            collected_on.append(tick)
            sampler.freed(9 if tick < 30 else 10)  # under busy_objects until tick 30
    # gaps of 2, 4, 8, 8, 8, then the busy collection on tick 31 brings back every tick
    assert collected_on == [1, 3, 7, 15, 23, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]
    assert sampler.gap == 1


class _CountedFreezes:
    """The gc module as the pacer sees it, counting its ticks (one freeze each)."""

    def __init__(self) -> None:
        self.ticks = 0

    def freeze(self) -> None:
        self.ticks += 1
        gc.freeze()

    def __getattr__(self, name: str) -> object:
        return getattr(gc, name)


async def test_cyclic_garbage_brings_back_a_young_collection_every_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted = _CountedFreezes()
    monkeypatch.setattr(collector, "gc", counted)
    young: list[int] = []
    pace = Pace(young_every_s=0.005, full_every_s=3600, busy_objects=50, max_gap=8)
    with timed_collections(lambda g, s: young.append(g) if g == 0 else None, math.inf):
        async with paced_collector(pace):
            await eventually(lambda: counted.ticks >= 40, timeout=30)
            quiet = len(young)
            assert quiet <= 12, f"{quiet} young collections in 40 quiet ticks"

            async def litter() -> None:
                while True:
                    for _ in range(100):
                        _Cycle()
                    await asyncio.sleep(0.001)

            littering = asyncio.ensure_future(litter())
            try:
                start, collected = counted.ticks, len(young)
                await eventually(lambda: counted.ticks >= start + 40, timeout=30)
                busy_ticks, busy = counted.ticks - start, len(young) - collected
            finally:
                littering.cancel()
    # At most a gap of max_gap ticks passes before a sample sees the garbage.
    assert busy >= busy_ticks - pace.max_gap, f"{busy} young collections in {busy_ticks} ticks"


async def test_a_paced_full_collection_frees_cycles_among_frozen_objects() -> None:
    generations: list[int] = []
    with timed_collections(lambda g, s: generations.append(g), long_pause_s=math.inf):
        async with paced_collector(Pace(young_every_s=0.02, full_every_s=0.5)):
            kept = _Cycle()
            frozen = weakref.ref(kept)
            await eventually(lambda: gc.get_freeze_count() > 0, timeout=5)
            del kept
            await eventually(lambda: frozen() is None, timeout=5)
    assert 2 in generations and generations.count(0) >= 2


async def test_a_young_pace_of_zero_leaves_the_collector_to_cpython(restored: None) -> None:
    tune_collector((1234, 5, 6))
    async with paced_collector(Pace(young_every_s=0, full_every_s=600)):
        assert gc.isenabled() and gc.get_threshold() == (1234, 5, 6)
        assert gc.get_freeze_count() == 0


def test_a_pace_out_of_range_is_refused() -> None:
    for young, full, busy, gap in (
        (-1, 600, 100, 16),
        (0.5, 0, 100, 16),
        (0.5, -3, 100, 16),
        (0.5, 600, -1, 16),
        (0.5, 600, 100, 0),
    ):
        with pytest.raises(ValueError, match="collector pace"):
            Pace(young, full, busy_objects=busy, max_gap=gap)


async def test_a_running_server_paces_the_collector_and_sets_the_switch_interval(
    harness: Harness,
) -> None:
    before = sys.getswitchinterval()
    await harness.start(switch_interval=0.015, gc_young_every=0.02)
    assert sys.getswitchinterval() == 0.015 and not gc.isenabled()
    await eventually(lambda: gc.get_freeze_count() > 0, timeout=5)
    await harness.stop()
    assert sys.getswitchinterval() == before
    assert gc.isenabled() and gc.get_freeze_count() == 0
