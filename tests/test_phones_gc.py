"""The bench phones' collector (bench/phones_gc.py): survivors frozen, collections timed."""

from __future__ import annotations

import gc

import pytest

from bench.phones_gc import FREEZE_FIRST_THRESHOLD, PhonesCollector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_freeze_mode_freezes_survivors_and_gives_them_back() -> None:
    collector = PhonesCollector("freeze")
    kept = [_Node() for _ in range(1000)]
    before, callbacks = gc.get_threshold(), list(gc.callbacks)
    collector.start()
    try:
        assert gc.get_threshold()[0] == FREEZE_FIRST_THRESHOLD
        gc.collect(0)
        assert gc.get_freeze_count() >= len(kept), "the survivors are frozen"
        garbage = _Node()
        del garbage
        assert gc.collect(0) >= 1, "a cycle made after the freeze is still collected"
    finally:
        figures = collector.stop()
    assert gc.get_freeze_count() == 0, "stop hands every frozen object back to the collector"
    assert gc.get_threshold() == before, "and puts the thresholds back"
    assert figures["thresholds"] == [FREEZE_FIRST_THRESHOLD, *before[1:]]
    assert figures["mode"] == "freeze"
    assert figures["frozen_objects"] >= len(kept)
    assert figures["collections"][0] >= 2
    assert figures["pause_ms_max"] >= 0 and figures["pause_s_total"] >= 0
    assert gc.callbacks == callbacks, "and removes its timer"


def test_plain_mode_only_times_collections() -> None:
    collector = PhonesCollector("plain")
    collector.start()
    try:
        gc.collect(1)
        assert gc.get_freeze_count() == 0
    finally:
        figures = collector.stop()
    assert figures["collections"] == [0, 1, 0]
    assert len(collector.pauses_s) == 1 and figures["frozen_objects"] == 0
    assert figures["thresholds"] == list(gc.get_threshold())


def test_off_mode_holds_the_collector_off_then_frees_what_piled_up() -> None:
    collector = PhonesCollector("off")
    callbacks = list(gc.callbacks)
    collector.start()
    try:
        assert not gc.isenabled(), "no collection stops the phones while they flap"
        for _ in range(1000):
            _Node()  # cycles left behind: only a collection frees them
    finally:
        figures = collector.stop()
    assert gc.isenabled(), "stop gives the collector back"
    assert figures["mode"] == "off" and figures["collections"] == [0, 0, 0]
    assert figures["freed_after_run"] >= 1000, "the cycles are freed once the run is over"
    assert isinstance(figures["rss_mb_grown"], float)
    assert gc.callbacks == callbacks


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="freeze"):
        PhonesCollector("never")
