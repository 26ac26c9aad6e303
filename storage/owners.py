"""Who runs each person's conversation: the `owners` leases, the node locks, the fence.

A node holds a session advisory lock on its own name for as long as its listening
connection lives (`storage/notices.py`). A person's row names the node that owns them, the
epoch of that ownership and when the lease ends. Another node may take the person when the
lease has ended, or at once when the owner's lock is free (its process died, or lost
PostgreSQL): the take draws a new epoch. Every write that matters for a person carries the
epoch it was made under and goes through `FENCE`: the owner's row is locked in share mode
by the write itself, so a take waits for a write under way, and a write that comes after a
take finds the epoch changed and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

HANDOFF = "stillhere_handoff"  # payload: "<owner node> <person>"; the owner hands over
RELEASED = "stillhere_released"  # payload: the person; whoever waits for them may take them
NODE_LOCKS = 0x5748  # the advisory locks' first key: "nodes"; the second is the name's hash

# The persons among `{persons}` whose owner's epoch is the one in `{epochs}` (same order),
# locked until the statement's transaction ends; the caller names the parameters. Every
# statement that locks several owner rows locks them in person order (here, and `renew`):
# a batch of says and a lease renewal each in its own order could each hold a row the other
# waits for, and PostgreSQL would end one of them as a deadlock.
FENCE = """
    SELECT o.person, o.epoch FROM owners o
    JOIN unnest({persons}::text[], {epochs}::bigint[]) AS f (person, epoch)
      ON o.person = f.person AND o.epoch = f.epoch
    ORDER BY o.person
    FOR SHARE OF o
"""


def fence_one(first: int) -> str:
    """`FENCE` for one person and epoch, the parameters `$first` and the one after it."""
    return FENCE.format(persons=f"ARRAY[${first}::text]", epochs=f"ARRAY[${first + 1}::bigint]")


async def hold(
    conn: asyncpg.Connection, person: str, epoch: int, fenced: Callable[[str, int], None]
) -> None:
    """Inside a transaction on `conn`: go on only if `epoch` is still the person's owner
    epoch, their owner row then locked (`FENCE`) until the transaction ends, so the writes
    that follow in it are fenced too. Else tell `fenced` and raise Fenced: the caller's
    transaction rolls back and nothing it wrote stays."""
    if await conn.fetchval(fence_one(1), person, epoch) is None:
        fenced(person, epoch)
        raise Fenced(person)


_NODE_ALIVE = """
    EXISTS (SELECT 1 FROM pg_locks l
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND l.classid = {classes}::oid AND l.objid = hashtext({node})::oid)
"""

# A new epoch: the sequence's next value, tagged with the timeline PostgreSQL writes its WAL
# on (a promoted standby starts a new one). After a failover to a standby that had not
# received the last takes, the sequence could hand out their epochs again; an epoch taken on
# the lost timeline then differs from every epoch of the new one, so a node still holding it
# is fenced, never trusted. 2^40 takes per timeline; timelines count from 1.
_NEW_EPOCH = """
    (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint << 40)
    | nextval('owner_epochs')
"""

# Taken when free, expired, the node's own (an earlier run of it), or its node is gone. The
# row as it was (read from the statement's snapshot) says whom the person was taken from.
_TAKE = f"""
WITH before AS (SELECT node, expires_at < now() AS expired FROM owners WHERE person = $1)
INSERT INTO owners AS o (person, node, epoch, expires_at)
VALUES ($1, $2, {_NEW_EPOCH}, now() + $3 * interval '1 second')
ON CONFLICT (person) DO UPDATE
SET node = excluded.node, epoch = excluded.epoch, expires_at = excluded.expires_at
WHERE o.node = excluded.node OR o.expires_at < now()
   OR NOT {_NODE_ALIVE.format(classes=NODE_LOCKS, node="o.node")}
RETURNING epoch, (SELECT node FROM before) AS previous, (SELECT expired FROM before) AS expired
"""


async def hold_node(conn: asyncpg.Connection, node: str) -> bool:
    """Take the node's lock on `conn` for the connection's life; False if another
    connection (another process with the same `--node-id`) holds it."""
    return bool(
        await conn.fetchval("SELECT pg_try_advisory_lock($1, hashtext($2))", NODE_LOCKS, node)
    )


@dataclass(frozen=True, slots=True)
class Taken:
    epoch: int
    previous: str | None  # the node whose row it was, if there was one
    expired: bool  # that row's lease had run out


async def take_over(pool: asyncpg.Pool, person: str, node: str, lease_s: float) -> Taken | None:
    """The new ownership if `node` now owns `person`, and whom from; None if another live
    node does."""
    row = await pool.fetchrow(_TAKE, person, node, lease_s)
    return None if row is None else Taken(row["epoch"], row["previous"], bool(row["expired"]))


async def take(pool: asyncpg.Pool, person: str, node: str, lease_s: float) -> int | None:
    """The new epoch if `node` now owns `person`; None if another live node does."""
    taken = await take_over(pool, person, node, lease_s)
    return None if taken is None else taken.epoch


async def renew(pool: asyncpg.Pool, node: str, epochs: list[int], lease_s: float) -> set[int]:
    """Push back the end of the leases held under `epochs`; the epochs still held."""
    rows = await pool.fetch(
        "UPDATE owners o SET expires_at = now() + $3 * interval '1 second' FROM ("
        "  SELECT person FROM owners WHERE node = $1 AND epoch = ANY($2::bigint[])"
        "  ORDER BY person FOR NO KEY UPDATE"  # in FENCE's order
        ") held WHERE o.person = held.person RETURNING o.epoch",
        node,
        epochs,
        lease_s,
    )
    return {r["epoch"] for r in rows}


async def release(pool: asyncpg.Pool, person: str, node: str, epoch: int | None) -> None:
    """Give `person` up (under `epoch`, or whatever `node` holds if None) and say so to the
    nodes waiting for them; the notice goes out when the row is gone (at commit)."""
    await pool.execute(
        "WITH gone AS (DELETE FROM owners WHERE person = $1 AND node = $2 "
        "AND ($3::bigint IS NULL OR epoch = $3) RETURNING person) "
        "SELECT pg_notify($4, person) FROM gone",
        person,
        node,
        epoch,
        RELEASED,
    )


async def ask_handoff(pool: asyncpg.Pool, person: str) -> None:
    """Ask the node that owns `person`, if any, to hand them over."""
    await pool.execute(
        "SELECT pg_notify($2, node || ' ' || person) FROM owners WHERE person = $1",
        person,
        HANDOFF,
    )


async def owner_of(pool: asyncpg.Pool, person: str) -> asyncpg.Record | None:
    """The person's owner row (node, epoch, expires_at), for the admin API."""
    return await pool.fetchrow(
        "SELECT node, epoch, expires_at FROM owners WHERE person = $1", person
    )


class Fenced(Exception):
    """A write for a person under an epoch that is no longer theirs: another node owns
    them now, and nothing was written."""
