"""The collector: on a schedule (`--gc-every`), or by thresholds (`--gc-thresholds`)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from providers.collector import DEFAULT, scheduled_collections, tune_collector


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


class Cycle:
    """Garbage only the collector frees: it refers to itself."""

    def __init__(self) -> None:
        self.me = self


async def test_on_a_schedule_only_the_scheduled_collection_frees_cycles() -> None:
    async with scheduled_collections(0.2):
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        freed = asyncio.Event()
        cycle = Cycle()
        weakref.finalize(cycle, freed.set)
        del cycle
        kept = [[] for _ in range(100_000)]  # far past any threshold: nothing automatic runs
        del kept
        assert not freed.is_set()
        async with asyncio.timeout(10):
            await freed.wait()  # the scheduled collection did it
    assert gc.isenabled() and gc.get_freeze_count() == 0


async def test_every_zero_leaves_the_automatic_collector_on() -> None:
    async with scheduled_collections(0):
        assert gc.isenabled() and gc.get_freeze_count() == 0
