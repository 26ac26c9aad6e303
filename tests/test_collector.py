"""The collector's thresholds, set by `--gc-thresholds`."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from providers.collector import DEFAULT, tune_collector


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
