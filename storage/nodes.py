"""The `nodes` table: which nodes share the database, each one's lease and state.

A node's row is its lease: its heartbeat, renewed every third of its `lease_s`
(storage/owners.py, `renew`), covers every person it owns; one older than the node's lease
means the node is gone, or hung, and its people are taken by whichever node their next
hello reaches. Operators read it too (`GET /admin/nodes`, `stillhere inspect --cluster`).
A default node name is new at each start, so rows of nodes gone for a day and owning no
one are deleted as another node starts.
"""

from __future__ import annotations

import os
import socket

import asyncpg

from storage.owners import LEASE_END, PERSON_LEASE_END

FORGET_AFTER = "1 day"  # a node stopped or gone this long, owning no one, is deleted

_START = f"""
WITH forgotten AS (
    DELETE FROM nodes n WHERE n.last_heartbeat < now() - interval '{FORGET_AFTER}'
      AND NOT EXISTS (SELECT 1 FROM owners o WHERE o.node = n.name)
)
INSERT INTO nodes (name, host, pid, lease_s, started_at, last_heartbeat)
VALUES ($1, $2, $3, $4, now(), now())
ON CONFLICT (name) DO UPDATE SET host = excluded.host, pid = excluded.pid,
    lease_s = excluded.lease_s, started_at = excluded.started_at,
    last_heartbeat = excluded.last_heartbeat, stopped_at = NULL
"""

# One row per node, and per node name found in `owners` without a row of its own.
_LISTING = f"""
SELECT coalesce(n.name, o.node) AS name, n.host, n.pid, n.lease_s, n.started_at,
       n.last_heartbeat, n.stopped_at,
       extract(epoch FROM now() - n.last_heartbeat)::float8 AS heartbeat_age_s,
       CASE WHEN n.name IS NULL THEN 'unknown'
            WHEN n.stopped_at IS NOT NULL THEN 'stopped'
            WHEN {LEASE_END} < now() THEN 'gone'
            ELSE 'up' END AS state,
       coalesce(o.people, 0) AS people
FROM nodes n
FULL JOIN (SELECT node, count(*) AS people FROM owners GROUP BY node) o ON o.node = n.name
ORDER BY 1
"""

# A person's `expires_at` is when their lease ends: their node's, or their take's if later.
_PEOPLE = f"""
SELECT node, person, epoch, lease_end AS expires_at, lease_end < now() AS expired
FROM (SELECT o.*, {PERSON_LEASE_END} AS lease_end FROM owners o) o
ORDER BY node, person
"""


async def started(pool: asyncpg.Pool, node: str, lease_s: float) -> None:
    """Write the node's row as it starts (again, under a name it had before)."""
    await pool.execute(_START, node, socket.gethostname(), os.getpid(), lease_s)


async def stopped(pool: asyncpg.Pool, node: str) -> None:
    await pool.execute("UPDATE nodes SET stopped_at = now() WHERE name = $1", node)


async def listing(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch(_LISTING)


async def people(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    """Every owner row, by node: a line per person, for a listing that asks for them."""
    return await pool.fetch(_PEOPLE)
