"""The assistant's mood towards each person (migration 014): fondness, 0 to 1.

The rule that moves it is the persona's (`actors.persona`); here it is read and written,
scoped to the person like every other personal row.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import asyncpg

from storage.owners import Fenced, fence_one

# Fenced in the statement: for a person whose owner epoch is no longer `$7`, no row comes
# from `owned`, nothing is written and nothing is returned.
_NUDGE = f"""
WITH owned AS ({fence_one(6)})
INSERT INTO moods AS m (person, fondness, at)
SELECT $1, least(1, greatest(0, $2::float8 + $3::float8 * ($4::float8 - $2))), $5 FROM owned
ON CONFLICT (person) DO UPDATE
SET fondness = least(1, greatest(0, m.fondness + $3 * ($4 - m.fondness))), at = $5
RETURNING fondness
"""


class MoodStore:
    def __init__(self, pool: asyncpg.Pool, fenced: Callable[[str, int], None]) -> None:
        self._pool = pool
        self._fenced = fenced  # told of each person a write was refused for

    async def fondness(self, person: str) -> float | None:
        """The person's fondness, or None before their first exchange."""
        value = await self._pool.fetchval("SELECT fondness FROM moods WHERE person = $1", person)
        return None if value is None else float(value)

    async def nudge(
        self, person: str, epoch: int, start: float, toward: float, share: float, now: datetime
    ) -> float:
        """Move the person's fondness `share` of the way `toward` a value (from `start` at
        their first exchange) and return it, under their owner `epoch` (else Fenced, nothing
        moved). One statement, one round trip: the upsert reads the row it locks, so a nudge
        is never lost to another, and the fence is in the same statement."""
        value = await self._pool.fetchval(_NUDGE, person, start, share, toward, now, person, epoch)
        if value is None:
            self._fenced(person, epoch)
            raise Fenced(person)
        return float(value)
