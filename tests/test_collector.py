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

from providers.collector import DEFAULT, Pace, paced_collector, timed_collections, tune_collector
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
    for young, full in ((-1, 600), (0.5, 0), (0.5, -3)):
        with pytest.raises(ValueError, match="collector pace"):
            Pace(young, full)


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
