"""The assistant's mood towards each person (migration 014): fondness, 0 to 1.

The rule that moves it is the persona's (`actors.persona`). An exchange's move (`Nudge`) is
written with its reply, in the event log's statement (`storage.event_log`), fenced like it;
here fondness is read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

# The event log's part: each person's nudges of a batch, composed into one move
# (fondness -> scale * fondness + offset), made from `start` at their first exchange. A
# nudge keeps fondness between 0 and 1, so composing nudges changes nothing but rounding.
WRITE = """
    INSERT INTO moods AS m (person, fondness, at)
    SELECT p, least(1, greatest(0, sc * st + off)), a
    FROM unnest({persons}::text[], {starts}::float8[], {scales}::float8[],
                {offsets}::float8[], {ats}::timestamptz[], {epochs}::bigint[])
         AS n (p, st, sc, off, a, ep)
    WHERE (p, ep) IN (SELECT person, epoch FROM owned)
    ON CONFLICT (person) DO UPDATE
    SET fondness = least(1, greatest(0, (
            SELECT n.sc * m.fondness + n.off
            FROM unnest({persons}::text[], {scales}::float8[], {offsets}::float8[])
                 AS n (p, sc, off)
            WHERE n.p = m.person
        ))),
        at = EXCLUDED.at
"""


@dataclass(frozen=True, slots=True)
class Nudge:
    """An exchange's move of the person's fondness: `share` of the way `toward` a value,
    from `start` at their first exchange."""

    start: float
    toward: float
    share: float
    at: datetime


def moves(nudges: Iterable[tuple[str, int, Nudge]]) -> list[list[Any]]:
    """A batch's nudges, (person, epoch, nudge) in the order the exchanges were made, as
    the columns of `WRITE` (persons, starts, scales, offsets, ats, epochs): one composed
    move per person, under the newest epoch it was made under (an older one is no longer
    this node's: it is fenced)."""
    composed: dict[str, tuple[float, float, float, datetime, int]] = {}
    for person, epoch, nudge in nudges:
        scale, offset = 1.0 - nudge.share, nudge.share * nudge.toward
        before = composed.get(person)
        if before is not None and before[4] > epoch:
            continue
        if before is not None and before[4] == epoch:
            scale, offset = before[1] * scale, offset + scale * before[2]
        composed[person] = (nudge.start, scale, offset, nudge.at, epoch)
    return [list(composed), *([row[i] for row in composed.values()] for i in range(5))]


class MoodStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def fondness(self, person: str) -> float | None:
        """The person's fondness, or None before their first exchange."""
        value = await self._pool.fetchval("SELECT fondness FROM moods WHERE person = $1", person)
        return None if value is None else float(value)
