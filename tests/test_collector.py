"""The collector's thresholds, set by `--gc-thresholds`, and its collections timed."""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Iterator

import pytest

from providers.collector import DEFAULT, timed_collections, tune_collector


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
