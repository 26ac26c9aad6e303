"""Who runs each person's conversation: the `owners` rows, the node leases and locks, the fence.

A node holds a session advisory lock on its own name for as long as its listening
connection lives (`storage/notices.py`), and a lease: its row in `nodes`, whose heartbeat it
renews every third of its `lease_s` (`renew`), one row whatever the number of people it
owns; the lease ends `lease_s` after the last heartbeat. A person's row names the node that
owns them, the epoch of that ownership and the end of the lease the take itself gave them
(`expires_at`, never renewed: it covers a person taken after the node's last renewal).
Another node may take the person when both leases have ended, or at once when the owner's
lock is free (its process died, or lost PostgreSQL): the take draws a new epoch.

A take from another node locks that node's row in share mode and reads its lease there, so
it and the node's renewal (an UPDATE of that row) happen one after the other: a take under
way when the renewal comes is committed before the renewal returns, and a take that comes
after it sees the renewed lease and takes nothing. The node therefore reads which of its
epochs still hold (`held`) only after a renewal that may have followed a take: one that
found its lease lapsed or its lock not held by its listening connection (actors/ownership.py
says when); otherwise nobody could have taken anyone from it.

Every write that matters for a person carries the epoch it was made under and goes through
`FENCE`: the owner's row is locked in share mode by the write itself, so a take waits for a
write under way, and a write that comes after a take finds the epoch changed and writes
nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

HANDOFF = "stillhere_handoff"  # payload: "<owner node> <person>"; the owner hands over
RELEASED = "stillhere_released"  # payload: the person; whoever waits for them may take them
NODE_LOCKS = 0x5748  # the advisory locks' first key: "nodes"; the second is the name's hash

# The persons among `{persons}` whose owner's epoch is the one in `{epochs}` (same order),
# locked until the statement's transaction ends; the caller names the parameters. A batch
# (the says or events of many people) locks its rows in person order, so no two statements
# locking several owner rows can each hold a row the other waits for. The renewal locks no
# owner row at all: only its node's.
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


# The node's lock as pg_locks shows it: held by the node's listening connection while it
# lives (`hold_node`); `{node}` names the node.
_NODE_LOCK = """
    FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = {classes}::oid AND l.objid = hashtext({node})::oid
""".replace("{classes}", str(NODE_LOCKS))

# When the node's lease ends: `lease_s` after its last heartbeat.
LEASE_END = "n.last_heartbeat + n.lease_s * interval '1 second'"

# A person's lease ends with the later of the take's own and their node's.
PERSON_LEASE_END = f"""
    greatest(o.expires_at, (SELECT {LEASE_END} FROM nodes n WHERE n.name = o.node))
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

# Taken when free, the node's own (an earlier run of it), expired (the take's own lease and
# its node's), or its node is gone (its lock free). The decision is read from the owner's
# `nodes` row locked in share mode (the module's docstring says why), one subquery, so the
# lock is taken whichever way it goes; a node with no row has no lease but the take's. The
# row as it was (read from the statement's snapshot) says whom the person was taken from,
# and whether their lease had ended.
_GONE = "NOT EXISTS (SELECT 1 {lock})"
_TAKE = f"""
WITH before AS (
    SELECT node, {PERSON_LEASE_END} < now() AS expired FROM owners o WHERE person = $1
)
INSERT INTO owners AS o (person, node, epoch, expires_at)
VALUES ($1, $2, {_NEW_EPOCH}, now() + $3 * interval '1 second')
ON CONFLICT (person) DO UPDATE
SET node = excluded.node, epoch = excluded.epoch, expires_at = excluded.expires_at
WHERE o.node = excluded.node OR coalesce(
    (SELECT ({LEASE_END} < now() AND o.expires_at < now())
            OR {_GONE.format(lock=_NODE_LOCK.format(node="n.name"))}
     FROM nodes n WHERE n.name = o.node FOR SHARE),
    o.expires_at < now() OR {_GONE.format(lock=_NODE_LOCK.format(node="o.node"))})
RETURNING epoch, (SELECT node FROM before) AS previous, (SELECT expired FROM before) AS expired
"""


async def hold_node(conn: asyncpg.Connection, node: str) -> bool:
    """Take the node's lock on `conn` for the connection's life; False if another
    connection (another process with the same `--node-id`) holds it."""
    return bool(
        await conn.fetchval("SELECT pg_try_advisory_lock($1, hashtext($2))", NODE_LOCKS, node)
    )


Queries = asyncpg.Pool | asyncpg.Connection  # a pool, or one connection's transaction


@dataclass(frozen=True, slots=True)
class Taken:
    epoch: int
    previous: str | None  # the node whose row it was, if there was one
    expired: bool  # that row's lease had run out


async def take_over(pool: Queries, person: str, node: str, lease_s: float) -> Taken | None:
    """The new ownership if `node` now owns `person`, and whom from; None if another live
    node does."""
    row = await pool.fetchrow(_TAKE, person, node, lease_s)
    return None if row is None else Taken(row["epoch"], row["previous"], bool(row["expired"]))


async def take(pool: asyncpg.Pool, person: str, node: str, lease_s: float) -> int | None:
    """The new epoch if `node` now owns `person`; None if another live node does."""
    taken = await take_over(pool, person, node, lease_s)
    return None if taken is None else taken.epoch


@dataclass(frozen=True, slots=True)
class Renewed:
    lapsed: bool  # the lease had ended before this renewal: others may have taken people
    holder: int | None  # the backend holding the node's lock (its listening connection's)


# The node's heartbeat pushed on, and with it its lease, which had lapsed if its end was
# past at the statement's start (read from the statement's snapshot: one row, this node's).
_RENEW = f"""
UPDATE nodes n SET last_heartbeat = now()
FROM (SELECT {LEASE_END} < now() AS lapsed FROM nodes n WHERE n.name = $1) was
WHERE n.name = $1
RETURNING was.lapsed, (SELECT l.pid {_NODE_LOCK.format(node="n.name")}) AS holder
"""


async def renew(pool: Queries, node: str) -> Renewed | None:
    """Renew the node's lease: one row, whatever the number of people it owns; None if the
    node has no row (`nodes.started` writes it)."""
    row = await pool.fetchrow(_RENEW, node)
    return None if row is None else Renewed(row["lapsed"], row["holder"])


async def held(pool: asyncpg.Pool, node: str, epochs: list[int]) -> set[int]:
    """Which of `epochs` are still the node's: a read of every row given, for after a
    renewal that may have followed a take."""
    rows = await pool.fetch(
        "SELECT epoch FROM owners WHERE node = $1 AND epoch = ANY($2::bigint[])", node, epochs
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
    """The person's owner row (node, epoch, expires_at: when their lease ends), for the
    admin API."""
    return await pool.fetchrow(
        f"SELECT node, epoch, {PERSON_LEASE_END} AS expires_at FROM owners o WHERE person = $1",
        person,
    )


class Fenced(Exception):
    """A write for a person under an epoch that is no longer theirs: another node owns
    them now, and nothing was written."""
