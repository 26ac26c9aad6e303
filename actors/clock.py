"""Time: an injected clock (so the resume window and the sweep are tested in milliseconds),
and durations as people write them (`90s`, `30m`, `2h`)."""

from __future__ import annotations

import argparse
import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that only moves when told to; safe to read from actor threads."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 5, 19, 9, 0, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds from `90s`, `30m`, `2h`, `7d`, `250ms` or a bare number of seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 90s, 30m, 2h)")
    return float(match.group(1)) * _UNITS[match.group(2)]
