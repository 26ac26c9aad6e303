"""The assistant's mood towards each person (migration 014): fondness, 0 to 1.

The rule that moves it is the persona's (`actors.persona`); here it is read and written,
scoped to the person like every other personal row.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg


class MoodStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def fondness(self, person: str) -> float | None:
        """The person's fondness, or None before their first exchange."""
        value = await self._pool.fetchval("SELECT fondness FROM moods WHERE person = $1", person)
        return None if value is None else float(value)

    async def nudge(
        self, person: str, start: float, toward: float, share: float, now: datetime
    ) -> float:
        """Move the person's fondness `share` of the way `toward` a value (from `start` at
        their first exchange) and return it. One statement, one round trip: the upsert
        reads the row it locks, so a nudge is never lost to another, and a turn costs
        PostgreSQL one short write (the bench `db-cost` counts them)."""
        value = await self._pool.fetchval(
            "INSERT INTO moods AS m (person, fondness, at) "
            "VALUES ($1, least(1, greatest(0, $2::float8 + $3::float8 * ($4::float8 - $2))), $5) "
            "ON CONFLICT (person) DO UPDATE "
            "SET fondness = least(1, greatest(0, m.fondness + $3 * ($4 - m.fondness))), at = $5 "
            "RETURNING fondness",
            person,
            start,
            share,
            toward,
            now,
        )
        return float(value)
