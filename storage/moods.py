"""The assistant's mood towards each person (migration 014): fondness, 0 to 1.

The rule that moves it is the persona's (`actors.persona`); here it is read and written,
scoped to the person like every other personal row.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import asyncpg

from storage.owners import hold


class MoodStore:
    def __init__(self, pool: asyncpg.Pool, fenced: Callable[[str, int], None]) -> None:
        self._pool = pool
        self._fenced = fenced  # told of each person a write was refused for

    async def fondness(self, person: str) -> float | None:
        """The person's fondness, or None before their first exchange."""
        value = await self._pool.fetchval("SELECT fondness FROM moods WHERE person = $1", person)
        return None if value is None else float(value)

    async def nudge(
        self,
        person: str,
        epoch: int,
        start: float,
        rule: Callable[[float], float],
        now: datetime,
    ) -> float:
        """Move the person's fondness by `rule` (from `start` at their first exchange) and
        return it, under their owner `epoch` (else Fenced, nothing moved). A person's
        exchanges end one at a time (one conversation each); the row is still locked from
        the read to the write, so nothing else's write is lost."""
        async with self._pool.acquire() as conn, conn.transaction():
            await hold(conn, person, epoch, self._fenced)
            value = await conn.fetchval(
                "SELECT fondness FROM moods WHERE person = $1 FOR UPDATE", person
            )
            fondness = min(1.0, max(0.0, rule(start if value is None else float(value))))
            await conn.execute(
                "INSERT INTO moods (person, fondness, at) VALUES ($1, $2, $3) "
                "ON CONFLICT (person) DO UPDATE SET fondness = $2, at = $3",
                person,
                fondness,
                now,
            )
        return fondness
