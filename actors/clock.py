"""Time: an injected clock (so the resume window, the sweep and a follow-on's pause are
tested in milliseconds), and durations as people write them (`90s`, `30m`, `2h`)."""

from __future__ import annotations

import argparse
import asyncio
import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None:
        """Return once the clock has moved on by `seconds`; on the loop."""


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that only moves when told to; safe to read from actor threads."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 5, 19, 9, 0, tzinfo=UTC)
        self._lock = threading.Lock()
        self._sleepers: list[tuple[datetime, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        with self._lock:
            return self._now

    async def sleep(self, seconds: float) -> None:
        """Wait until `advance` has moved the clock `seconds` on (at once if not above 0)."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if seconds <= 0:
                return
            self._sleepers.append((self._now + timedelta(seconds=seconds), loop, woken))
        await woken

    @property
    def sleepers(self) -> int:
        """How many `sleep`s wait: a test moves the clock once the one it means is asleep."""
        with self._lock:
            return sum(not woken.done() for _, _, woken in self._sleepers)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            due = [s for s in self._sleepers if s[0] <= self._now]
            self._sleepers = [s for s in self._sleepers if s[0] > self._now]
        for _, loop, woken in due:
            loop.call_soon_threadsafe(_wake, woken)


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():  # a sleeper cancelled meanwhile
        woken.set_result(None)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds from `90s`, `30m`, `2h`, `7d`, `250ms` or a bare number of seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 90s, 30m, 2h)")
    return float(match.group(1)) * _UNITS[match.group(2)]
