"""`stillhere-bench lease`: what one lease renewal period costs PostgreSQL, by people owned.

A node renews its lease every third of `--lease` (2 s by default). The lease is the node's
row in `nodes` (storage/owners.py, `renew`): one statement and one row whatever the number
of people the node owns. It replaced a lease per person, renewed by one UPDATE of every
person's `owners` row plus the node's heartbeat: two statements, N + 1 rows. For each N of
`--people`, on an embedded PostgreSQL, this bench writes N owner rows for one node and
times, over `--rounds` periods each: the per-person renewal (`PER_PERSON`, kept here as the
baseline, as it was and at its best), the node's renewal as the server makes it, and the
read of which epochs still hold (`owners.held`), which a node makes only after a renewal
that may have followed a take (actors/ownership.py). Per period: statements, rows written,
WAL bytes, time (median).

    stillhere-bench lease --people 20000,100000 --json /tmp/lease.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from storage import nodes, owners
from storage.embedded import migrated_database

DESCRIPTION = "what one lease renewal period costs, per person against per node, by people"
NODE = "bench"
LEASE_S = 6.0

# The per-person renewal the node lease replaced: every held person's row, in person order
# (as the fence locks them), then the node's heartbeat. Its epochs were matched with
# `= ANY($2)`; `joined` matches them by a join on the array instead, the per-person
# renewal at its best, so the comparison is with that too.
PER_PERSON = """
UPDATE owners o SET expires_at = now() + $3 * interval '1 second' FROM (
  SELECT person FROM owners WHERE node = $1 AND {held}
  ORDER BY person FOR NO KEY UPDATE
) held WHERE o.person = held.person RETURNING o.epoch
"""
AS_IT_WAS = PER_PERSON.format(held="epoch = ANY($2::bigint[])")
JOINED = PER_PERSON.format(held="epoch IN (SELECT unnest($2::bigint[]))")
WAYS = ("per_person", "joined", "per_node", "held_read")
HEARTBEAT = "UPDATE nodes SET last_heartbeat = now() WHERE name = $1"


def add_parser(subparsers: Any) -> None:
    """`stillhere-bench lease`."""
    parser = subparsers.add_parser("lease", help=DESCRIPTION, description=DESCRIPTION)
    parser.add_argument(
        "--people",
        type=_counts,
        default=[20_000, 100_000],
        help="people owned by the node, comma-separated (20000,100000)",
    )
    parser.add_argument("--rounds", type=_count, default=7, help="periods timed (7)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.set_defaults(run=run)


def _counts(text: str) -> list[int]:
    return [_count(part) for part in text.split(",")]


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"a count is 1 or more: {text!r}")
    return count


async def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="stillhere-lease-") as folder:
        async with migrated_database(None, Path(folder)) as dsn:
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
            try:
                sizes = [await _size(pool, n, args.rounds) for n in args.people]
            finally:
                await pool.close()
    report = {"rounds": args.rounds, "lease_s": LEASE_S, "sizes": sizes}
    print(_table(sizes))
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return 0


async def _size(pool: asyncpg.Pool, people: int, rounds: int) -> dict[str, Any]:
    """One node owning `people`: each way of renewing, timed over `rounds` periods."""
    epochs = await _owning(pool, people)

    def per_person(statement: str) -> Callable[[], Awaitable[object]]:
        async def renewal() -> None:
            assert len(await pool.fetch(statement, NODE, epochs, LEASE_S)) == people
            await pool.execute(HEARTBEAT, NODE)

        return renewal

    async def per_node() -> None:
        assert await owners.renew(pool, NODE) is not None

    async def read_held() -> None:
        assert len(await owners.held(pool, NODE, epochs)) == people

    costs = {
        "per_person": await _period(pool, per_person(AS_IT_WAS), rounds, statements=2),
        "joined": await _period(pool, per_person(JOINED), rounds, statements=2),
        "per_node": await _period(pool, per_node, rounds, statements=1),
        "held_read": await _period(pool, read_held, rounds, statements=1),
    }
    ratios = {f"{way}_ratio": costs[way]["ms"] / costs["per_node"]["ms"] for way in WAYS[:2]}
    return {"people": people, **costs, **ratios}


async def _owning(pool: asyncpg.Pool, people: int) -> list[int]:
    """The node, alone, owning `people` persons: their epochs."""
    await pool.execute("TRUNCATE owners")
    await pool.execute("DELETE FROM nodes")
    await nodes.started(pool, NODE, LEASE_S)
    rows = await pool.fetch(
        "INSERT INTO owners (person, node, epoch, expires_at) "
        "SELECT md5(i::text), $1, nextval('owner_epochs'), now() + $3 * interval '1 second' "
        "FROM generate_series(1, $2) i RETURNING epoch",
        NODE,
        people,
        LEASE_S,
    )
    await pool.execute("VACUUM ANALYZE owners")
    await pool.execute("VACUUM ANALYZE nodes")
    return [r["epoch"] for r in rows]


async def _period(
    pool: asyncpg.Pool, renewal: Callable[[], Awaitable[object]], rounds: int, *, statements: int
) -> dict[str, Any]:
    """The median time and WAL bytes of `renewal` over `rounds` runs, after one unmeasured,
    with the rows its last run wrote (by their versions) and its statements."""
    await renewal()
    times, wal = [], []
    for _ in range(rounds):
        before = await _lsn(pool)
        xid = await pool.fetchval("SELECT txid_current()")
        started = time.perf_counter()
        await renewal()
        times.append((time.perf_counter() - started) * 1000)
        wal.append(await pool.fetchval("SELECT pg_current_wal_lsn() - $1::text::pg_lsn", before))
        written = await pool.fetchval(_WRITTEN, xid)
    return {
        "ms": round(statistics.median(times), 3),
        "ms_max": round(max(times), 3),
        "wal_bytes": int(statistics.median(wal)),
        "rows_written": written,
        "statements": statements,
    }


# The rows of `owners` and `nodes` written by a transaction after `$1` (a fresh database:
# no transaction id has wrapped around).
_WRITTEN = """
SELECT (SELECT count(*) FROM owners WHERE xmin::text::bigint > $1)
     + (SELECT count(*) FROM nodes WHERE xmin::text::bigint > $1)
"""


async def _lsn(pool: asyncpg.Pool) -> str:
    return str(await pool.fetchval("SELECT pg_current_wal_lsn()::text"))


def _table(sizes: list[dict[str, Any]]) -> str:
    lines = [
        f"{'people':>8}  {'renewal':<10} {'stmts':>5} {'rows':>7} {'WAL KB':>8} {'ms':>9}",
    ]
    for size in sizes:
        for name in WAYS:
            cost = size[name]
            lines.append(
                f"{size['people']:>8}  {name:<10} {cost['statements']:>5} "
                f"{cost['rows_written']:>7} {cost['wal_bytes'] / 1024:>8.1f} {cost['ms']:>9.3f}"
            )
        ratios = f"{size['per_person_ratio']:.0f}x, joined {size['joined_ratio']:.0f}x"
        lines.append(f"{'':>8}  time, per person / per node: {ratios}")
    return "\n".join(lines)
