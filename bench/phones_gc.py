"""The phones' own garbage collector: timed, and kept from stopping the phones for seconds.

The bench runs every phone in one process, and its ledger keeps every say, reply and
welcome until the end. The old generations of that one heap grow to millions of objects,
and a collection that walks them stops every phone at once: the resumes and turns in flight
across the pause are timed that much slower, though the server answered in time. A real
phone does not share a heap with 1,999 others. Every mode times every collection (`bench_gc`
in the flap report), so a run says what its phones' collector cost it.

- "plain" leaves the collector at the bench's thresholds. Its full collections stop the
  phones for seconds: 2.5 to 3.9 s at the longest in a 300 s run at 2,000 phones
  (`python -m bench.flap --clients 2000 --duration 300 --phones-gc plain`, `pause_ms_max`).
- "freeze" freezes whatever survives a collection (`gc.freeze`): no later collection walks
  it again, and each one walks only what was made since the last. Young collections come
  every 10,000 net allocations instead of 50,000: each object is still walked once, but a
  pause walks at most what 10,000 allocations left. The price: a cycle that becomes garbage
  after surviving a collection is not freed until the run ends; the report gives how many
  objects were frozen.
- "off", the default, holds the collector off while the phones flap, since even frozen,
  young collections stopped them for 3% of the same run, up to 97 ms at a time, each inside
  the timed resumes in flight (the command above with `--phones-gc freeze`: `pause_s_total`,
  `pause_ms_max`). The cycles the phones leave meanwhile stay in memory until the run ends,
  when one full collection frees them; the report gives what that cost: how much this
  process grew, and how many objects the final collection freed.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator
from typing import Any

import psutil

from bench.procs import process_rss_mb
from providers.collector import timed_collections

MODES = ("off", "freeze", "plain")
FREEZE_FIRST_THRESHOLD = 10_000


class PhonesCollector:
    """Installed for one flapping run of the phones (start, then stop in a `finally`)."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"phones' collector mode must be one of {MODES}, not {mode!r}")
        self.mode = mode
        self.collections = [0, 0, 0]  # by generation
        self.pauses_s: list[float] = []
        self._timing = contextlib.ExitStack()
        self._frozen = 0  # read as the run ends, before the objects are handed back
        self._thresholds = self._running = gc.get_threshold()  # before the run, during it
        self._rss_mb_start = 0.0  # this process's, as the run starts
        self._rss_mb_grown = 0.0  # and how much more it held as the run ended
        self._freed_after = 0  # objects the full collection after an "off" run freed

    def start(self) -> None:
        self._rss_mb_start = process_rss_mb(psutil.Process())
        if self.mode == "freeze":
            gc.set_threshold(FREEZE_FIRST_THRESHOLD, *self._thresholds[1:])
        elif self.mode == "off":
            gc.disable()
        self._running = gc.get_threshold()
        self._timing.enter_context(timed_collections(self._on_collection, math.inf))

    def stop(self) -> dict[str, Any]:
        """Uninstall, let every frozen object be collected again, and report; after an
        "off" run, collect what piled up (untimed: the run is over)."""
        self._timing.close()
        self._rss_mb_grown = process_rss_mb(psutil.Process()) - self._rss_mb_start
        gc.set_threshold(*self._thresholds)
        self._frozen = gc.get_freeze_count()
        gc.unfreeze()
        if self.mode == "off":
            gc.enable()
            self._freed_after = gc.collect()
        return self.figures()

    def figures(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "thresholds": list(self._running),
            "collections": list(self.collections),
            "pause_ms_max": round(max(self.pauses_s, default=0.0) * 1000, 1),
            "pause_s_total": round(sum(self.pauses_s), 3),
            "frozen_objects": self._frozen,
            "rss_mb_grown": round(self._rss_mb_grown, 1),
            "freed_after_run": self._freed_after,
        }

    def _on_collection(self, generation: int, seconds: float) -> None:
        self.pauses_s.append(seconds)
        self.collections[generation] += 1
        if self.mode == "freeze":
            gc.freeze()


@contextlib.contextmanager
def phones_collected(mode: str) -> Iterator[dict[str, Any]]:
    """A `PhonesCollector` in `mode` for the length of the block; the dict it yields is
    filled with the collector's figures as the block ends."""
    collector = PhonesCollector(mode)
    figures: dict[str, Any] = {}
    collector.start()
    try:
        yield figures
    finally:
        figures.update(collector.stop())
