"""SQL migrations, applied in file-name order at start-up.

A session-level advisory lock makes two processes starting at once take turns: the second
finds the migrations already recorded and applies nothing.
"""

from __future__ import annotations

import logging
from importlib import resources

import asyncpg

log = logging.getLogger("stillhere.storage")

_LOCK_KEY = 0x5717_11E2  # arbitrary, constant: "stillhere migrations"


def _migration_files() -> list[tuple[str, str]]:
    folder = resources.files("storage") / "migrations"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(name, (folder / name).read_text(encoding="utf-8")) for name in names]


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied."""
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")}
        applied = []
        for name, sql in _migration_files():
            if name in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)
            log.info("applied migration %s", name)
            applied.append(name)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
