"""The reconnect schedule of a phone: 1 s, 2 s, 4 s, 8 s, then never more than 15 s.

A phone that loses its link retries quickly at first (most drops are a second of bad
signal), then slows down so that a phone in a long tunnel, or thousands of phones after a
server restart, do not hammer the server. Jitter spreads those thousands of phones apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """How long to wait before each reconnect attempt.

    `first` is the wait before attempt 0, multiplied by `factor` per further attempt and
    capped at `cap`. With `jitter` j, each wait is multiplied by a uniform factor in
    [1 - j, 1 + j] (and still capped). Once a link has stayed up `hold` seconds the phone
    starts again from attempt 0: a link that keeps dropping right after it comes back is
    not a recovered link.
    """

    first: float = 1.0
    factor: float = 2.0
    cap: float = 15.0
    jitter: float = 0.0
    hold: float = 5.0

    def __post_init__(self) -> None:
        if self.first < 0 or self.cap < 0 or self.hold < 0:
            raise ValueError("backoff durations cannot be negative")
        if self.factor < 1:
            raise ValueError("backoff factor must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("backoff jitter must be between 0 and 1")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before attempt `attempt` (0 for the first retry after a drop)."""
        try:
            raw = self.first * self.factor ** max(attempt, 0)
        except OverflowError:  # a phone that has been in a tunnel for a very long time
            raw = self.cap
        wait = min(self.cap, raw)
        if self.jitter:
            wait *= rng.uniform(1 - self.jitter, 1 + self.jitter)
        return max(0.0, min(self.cap, wait))
