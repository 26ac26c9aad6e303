"""Claims on the memory keeper's background passes, so each runs on one node at a time.

Every node's sweep runs the keeper's pass (`actors.memory.consolidation.maintain`): the
fingerprint back-fill, then a consolidation per person whose memories changed. Among
several nodes on one PostgreSQL, a node runs a pass for a person only while it holds a
session advisory lock on (job, person), taken with a try-lock on a connection it keeps for
the pass: another node that wants the same pass meanwhile skips it. The lock lives with the
session, so a node that dies mid-pass frees it with its connection: no claim row to expire,
no lease to choose. Two keys that hash alike only defer one pass to the next sweep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

PASSES = 0x4D50  # the advisory locks' first key: "memory passes"; the second hashes the job


@asynccontextmanager
async def claimed(pool: asyncpg.Pool, job: str, person: str = "") -> AsyncIterator[bool]:
    """Within the block, whether this node holds the pass `job` for `person` (for everyone
    when empty): False if another node runs it now."""
    key = f"{job} {person}"
    async with pool.acquire() as conn:
        mine = await conn.fetchval("SELECT pg_try_advisory_lock($1, hashtext($2))", PASSES, key)
        try:
            yield bool(mine)
        finally:
            if mine:
                await conn.execute("SELECT pg_advisory_unlock($1, hashtext($2))", PASSES, key)
