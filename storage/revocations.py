"""Revoked persons: the `revocations` table and its notification channel.

A revocation (or its lifting) is written and announced in one transaction: PostgreSQL
delivers a `NOTIFY` only at commit, so a server that hears it finds the row there, and a
server that was not listening reads the whole table when it (re)connects.
"""

from __future__ import annotations

import asyncpg

CHANNEL = "stillhere_revocations"
REVOKED, LIFTED = "+", "-"  # the payload's first character; the person key follows


async def revoke(conn: asyncpg.Connection, person: str) -> bool:
    """Revoke `person`; False if it already was."""
    async with conn.transaction():
        added = await conn.fetchval(
            "INSERT INTO revocations (person) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1",
            person,
        )
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, REVOKED + person)
    return added is not None


async def lift(conn: asyncpg.Connection, person: str) -> bool:
    """Lift `person`'s revocation; False if it was not revoked."""
    async with conn.transaction():
        removed = await conn.execute("DELETE FROM revocations WHERE person = $1", person)
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, LIFTED + person)
    return removed != "DELETE 0"


async def revoked(conn: asyncpg.Connection) -> set[str]:
    return {row["person"] for row in await conn.fetch("SELECT person FROM revocations")}
