"""Personal rules: a person's standing instructions to the assistant, one row each.

Every read and write is scoped to the person: another person's rule id behaves exactly like
an id that does not exist, so the API never tells that it exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import asyncpg


@dataclass(frozen=True, slots=True)
class Rule:
    id: UUID
    text: str
    created_at: datetime

    def wire(self) -> dict[str, Any]:
        return {"id": str(self.id), "text": self.text, "created_at": self.created_at.isoformat()}


def _rule(row: asyncpg.Record) -> Rule:
    return Rule(id=row["id"], text=row["text"], created_at=row["created_at"])


class RuleStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def of(self, person: str) -> list[Rule]:
        """The person's rules in the order they were given (a serial: times can tie)."""
        rows = await self._pool.fetch(
            "SELECT id, text, created_at FROM rules WHERE person = $1 ORDER BY serial",
            person,
        )
        return [_rule(r) for r in rows]

    async def add(self, person: str, text: str, now: datetime, *, limit: int) -> Rule | None:
        """Store a rule; None if the person already has `limit` rules (nothing stored).

        The count and the insert are one statement, so two racing adds cannot both pass
        the limit."""
        row = await self._pool.fetchrow(
            "INSERT INTO rules (id, person, text, created_at) "
            "SELECT $1, $2, $3, $4 WHERE (SELECT count(*) FROM rules WHERE person = $2) < $5 "
            "RETURNING id, text, created_at",
            uuid4(),
            person,
            text,
            now,
            limit,
        )
        return None if row is None else _rule(row)

    async def delete(self, person: str, rule_id: UUID) -> bool:
        """Delete the person's rule; False if they have no rule with that id."""
        result = await self._pool.execute(
            "DELETE FROM rules WHERE person = $1 AND id = $2", person, rule_id
        )
        return result.endswith(" 1")
