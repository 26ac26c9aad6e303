"""`stillhere-bench db-cost`: what one turn costs PostgreSQL, read from PostgreSQL's own counters.

How far one PostgreSQL carries a cluster (docs/scaling.md) depends on what each turn asks of
it. This bench starts one real `stillhere serve` (zero-latency rehearsal model, embedded
PostgreSQL with `pg_stat_statements` preloaded) and reads, before and after each phase:

- `pg_stat_statements`: statements executed (`calls`), the WAL each wrote, by statement. A
  statement is one round trip from the server, except an `executemany`, whose rows go
  pipelined in one; so `statements` bounds the round trips from above;
- `pg_stat_database` (every database summed): transactions committed and rolled back;
  `pg_stat_user_tables`: rows inserted, updated and deleted in the server's tables;
  `pg_stat_io`: the WAL's flushes (fsyncs, what a commit waits for). Backends report these
  at most once a second, an idle one up to 10 s late: each phase's last reading waits 11 s
  and then until they hold still;
- `pg_current_wal_lsn()`: the WAL bytes written, exact, whoever wrote them (autovacuum and
  checkpoints too); `pg_stat_statements` again: the WAL the server's statements wrote;
  `pg_stat_wal`: records and full-page images (a page's first change after a checkpoint
  logs the whole page);
- the CPU of the server process and of PostgreSQL's processes (psutil).

What the server does when nobody talks (lease renewals, the sweep) is read over an idle
stretch first and taken out of each phase in proportion to its length; the bench's own
readings are not counted (its statements name `pg_stat`, and are left out).

The phases, on bare WebSocket phones with new devices (as bench flap's throughput phase):
`hello`, M (`--phones`) new conversations opened; `turns`, the M phones' K (`--says`) says
each, back to back (the server's group commit shares writes between conversations at this
load); `serial`, one phone's `--serial-says` (nothing to share); `memory`, the M phones'
K/2 says each asking to remember a new fact (the rehearsal model calls the `remember` tool:
a memory stored and fingerprinted). Per hello or per turn: statements, transactions, rows,
WAL bytes and flushes, CPU.

    .venv/bin/python -m bench.db_cost --json /tmp/db-cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil

from bench import procs, results
from bench.flap_db import dsn_of
from bench.flap_throughput import connect, say
from providers.event_loop import run as run_on_loop
from storage.embedded import EmbeddedPostgres
from transport.config import longer_than_zero

DESCRIPTION = "what one turn costs PostgreSQL: statements, transactions, rows, WAL bytes"
SERVER_OPTIONS = ["--frames-per-s", "100000", "--frame-burst", "100000"]
COUNTERS = (
    "statements", "transactions", "rows_inserted", "rows_updated", "rows_deleted",
    "wal_bytes", "statement_wal_bytes", "wal_records", "wal_fpi", "wal_fsyncs",
    "server_cpu_ms", "postgres_cpu_ms",
)  # fmt: skip
# Transactions of every database (autovacuum's included: its work is the turns' too); rows
# of the server's own tables (not the catalog's, which ANALYZE writes); the WAL's position,
# records, full-page images and flushes (fsyncs: what a commit waits for).
_DATABASE = """
SELECT pg_current_wal_lsn()::text AS lsn,
       (SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database)::bigint AS transactions,
       sum(n_tup_ins)::bigint AS rows_inserted, sum(n_tup_upd)::bigint AS rows_updated,
       sum(n_tup_del)::bigint AS rows_deleted,
       (SELECT wal_records FROM pg_stat_wal) AS wal_records,
       (SELECT wal_fpi FROM pg_stat_wal) AS wal_fpi,
       (SELECT sum(fsyncs) FROM pg_stat_io WHERE object = 'wal')::bigint AS wal_fsyncs
FROM pg_stat_user_tables
"""
# Every statement but the bench's own readings (which name pg_stat_*).
_STATEMENTS = """
SELECT queryid, query, calls, wal_bytes::bigint AS wal_bytes FROM pg_stat_statements
WHERE query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_current_wal_lsn%'
"""
# A backend that went idle less than a second after its last report holds its counters
# back for up to 10 s (PostgreSQL's PGSTAT_IDLE_INTERVAL).
REPORTED_S = 11.0
STILL_PAUSE_S = 1.2
STILL_READS = 30
TOP_STATEMENTS = 12


def add_parser(subparsers: Any) -> None:
    """`stillhere-bench db-cost`."""
    parser = subparsers.add_parser("db-cost", help=DESCRIPTION, description=DESCRIPTION)
    add_options(parser)
    parser.set_defaults(run=run)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--phones", type=int, default=50, help="phones in the loaded phases (50)")
    parser.add_argument("--says", type=int, default=40, help="says per phone (40; memory: half)")
    parser.add_argument(
        "--serial-says", type=int, default=200, help="the serial phase's says, on one phone (200)"
    )
    parser.add_argument(
        "--idle", type=longer_than_zero, default=10.0, help="the idle stretch read first (10s)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "db_cost")


@dataclass
class Reading:
    """PostgreSQL's counters and the CPU seconds at one moment."""

    at: float
    counters: dict[str, float]
    statements: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # calls, WAL

    def minus(self, before: Reading) -> dict[str, float]:
        return {key: self.counters[key] - before.counters[key] for key in COUNTERS}


def lsn_bytes(lsn: str) -> int:
    """A WAL position `X/Y` (hex) as a byte offset."""
    high, low = lsn.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def cpu_ms(process: psutil.Process, *, with_children: bool) -> float:
    with contextlib.suppress(psutil.Error):
        group = [process, *(process.children() if with_children else [])]
        return sum(p.cpu_times().user + p.cpu_times().system for p in group) * 1000.0
    return 0.0


class Counters:
    """Reads the server's PostgreSQL (one connection of the bench's own) and CPU."""

    def __init__(self, conn: asyncpg.Connection, server: psutil.Process, pgdata: Path) -> None:
        self.conn, self.server = conn, server
        self.postmaster = psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0]))

    async def read(self) -> Reading:
        row = await self.conn.fetchrow(_DATABASE)
        statements = {
            int(r["queryid"]): (r["query"], int(r["calls"]), int(r["wal_bytes"]))
            for r in await self.conn.fetch(_STATEMENTS)
            if r["queryid"] is not None
        }
        counters = {key: float(row[key]) for key in COUNTERS if key in row}
        counters["wal_bytes"] = float(lsn_bytes(row["lsn"]))
        counters["statements"] = float(sum(calls for _, calls, _ in statements.values()))
        counters["statement_wal_bytes"] = float(sum(wal for _, _, wal in statements.values()))
        counters["server_cpu_ms"] = cpu_ms(self.server, with_children=False)
        counters["postgres_cpu_ms"] = cpu_ms(self.postmaster, with_children=True)
        return Reading(time.perf_counter(), counters, statements)

    async def still(self, floor: dict[str, float]) -> Reading:
        """Read until two readings a pause apart differ by no more than the idle rate
        (`floor`, per second) would explain, from REPORTED_S after the work: every backend
        has reported it."""
        await asyncio.sleep(REPORTED_S)
        last = await self.read()
        for _ in range(STILL_READS):
            await asyncio.sleep(STILL_PAUSE_S)
            now = await self.read()
            grew = now.minus(last)
            allowance = {k: floor[k] * (now.at - last.at) * 2 + 2 for k in floor}
            if all(
                grew[k] <= allowance[k] for k in ("statements", "transactions", "rows_inserted")
            ):
                return now
            last = now
        return last


@dataclass
class Phase:
    name: str
    units: int  # hellos or turns
    seconds: float
    grew: dict[str, float]
    statements: list[dict[str, Any]]

    def per_unit(self) -> dict[str, float]:
        return {key: round(value / self.units, 2) for key, value in self.grew.items()}


async def phase(
    name: str,
    counters: Counters,
    idle: dict[str, float],
    units: int,
    work: Callable[[], Awaitable[None]],
) -> Phase:
    """`work` between two readings, the idle rate over the same time taken out."""
    before = await counters.read()
    await work()
    after = await counters.still(idle)
    seconds = after.at - before.at
    grew = {key: value - idle[key] * seconds for key, value in after.minus(before).items()}
    return Phase(name, units, seconds, grew, top_statements(before, after, units))


def top_statements(before: Reading, after: Reading, units: int) -> list[dict[str, Any]]:
    """The statements run most in a phase, per unit: calls and WAL bytes."""
    rows = []
    for queryid, (query, calls, wal) in after.statements.items():
        _, calls0, wal0 = before.statements.get(queryid, (query, 0, 0))
        if calls > calls0:
            text = " ".join(query.split())[:100]
            rows.append(
                {
                    "query": text,
                    "calls": round((calls - calls0) / units, 3),
                    "wal_bytes": round((wal - wal0) / units, 1),
                }
            )
    rows.sort(key=lambda r: (-r["calls"], -r["wal_bytes"]))
    return rows[:TOP_STATEMENTS]


Links = list[aiohttp.ClientWebSocketResponse]


async def _talk(links: Links, says: int, text: Callable[[int, int], str]) -> None:
    async def one(i: int, ws: aiohttp.ClientWebSocketResponse) -> None:
        for n in range(says):
            await say(ws, text(i, n))

    await asyncio.gather(*(one(i, ws) for i, ws in enumerate(links)))


def _plain(i: int, n: int) -> str:
    return f"Throughput message {n}, plain words and nothing more."


def _remember(i: int, n: int) -> str:
    return f"Remember that parcel {i * 1000 + n} goes to the blue house on street {n}."


async def _open(http: aiohttp.ClientSession, url: str, phones: int, out: Links) -> None:
    opened = await asyncio.gather(*(connect(http, url) for _ in range(phones)))
    out.extend(ws for ws, _ in opened)


async def phases(args: argparse.Namespace, counters: Counters, url: str) -> dict[str, Any]:
    """The idle stretch, then each phase on phones of its own."""
    await asyncio.sleep(REPORTED_S)  # the server's start (migrations, pools) reported first
    start = await counters.read()
    await asyncio.sleep(args.idle)
    idle_reading = await counters.read()
    idle = {k: v / (idle_reading.at - start.at) for k, v in idle_reading.minus(start).items()}
    done: list[Phase] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        loaded: Links = []
        serial: Links = []
        try:
            done.append(
                await phase(
                    "hello",
                    counters,
                    idle,
                    args.phones,
                    partial(_open, http, url, args.phones, loaded),
                )
            )
            await _talk(loaded, 2, _plain)  # warm: statements prepared, actors started
            await _open(http, url, 1, serial)
            await _talk(serial, 2, _plain)
            plan = (
                ("turns", loaded, args.says, _plain),
                ("serial", serial, args.serial_says, _plain),
                ("memory", loaded, max(1, args.says // 2), _remember),
            )
            for name, links, says, text in plan:
                done.append(
                    await phase(
                        name, counters, idle, len(links) * says, partial(_talk, links, says, text)
                    )
                )
        finally:
            await asyncio.gather(*(ws.close() for ws in (*loaded, *serial)), return_exceptions=True)
    return {
        "idle_per_s": {key: round(value, 2) for key, value in idle.items()},
        "phases": {
            p.name: {
                "units": p.units,
                "seconds": round(p.seconds, 2),
                "per_unit": p.per_unit(),
                "top_statements": p.statements,
            }
            for p in done
        },
    }


async def preload_statements(data_dir: Path) -> None:
    """Make the embedded PostgreSQL in `data_dir` (initdb on first use) load
    pg_stat_statements when it next starts, and stop it."""
    loop = asyncio.get_running_loop()
    postgres = await loop.run_in_executor(None, EmbeddedPostgres, data_dir)
    try:
        conn = await asyncpg.connect(postgres.dsn, timeout=30)
        try:
            await conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        finally:
            await conn.close()
    finally:
        await loop.run_in_executor(None, postgres.stop)


async def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One server with pg_stat_statements, its phases read; the report."""
    data_dir = root / "stillhere" / "data"
    await preload_statements(data_dir)
    server = procs.start("stillhere", root, latency=0.0, rate=0.0, extra=SERVER_OPTIONS)
    try:
        await procs.wait_ready(server)
        assert server.pgdata is not None
        conn = await asyncpg.connect(dsn_of(server.pgdata), timeout=30)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            counters = Counters(conn, server.ps(), server.pgdata)
            report = await phases(args, counters, server.base_url + "/v1/ws")
        finally:
            await conn.close()
    finally:
        report_stop = await procs.stopped(server)
    report.update(
        phones=args.phones,
        says=args.says,
        server_stop=report_stop,
        load_average=list(psutil.getloadavg()),
    )
    return report


COLUMNS = (
    ("statements", "stmts"), ("transactions", "xacts"), ("rows_inserted", "ins"),
    ("rows_updated", "upd"), ("rows_deleted", "del"), ("wal_bytes", "WAL B"),
    ("statement_wal_bytes", "stmt WAL"), ("wal_fpi", "FPI"), ("wal_fsyncs", "fsyncs"),
    ("server_cpu_ms", "srv ms"), ("postgres_cpu_ms", "pg ms"),
)  # fmt: skip


def table(report: dict[str, Any]) -> str:
    lines = [
        f"PostgreSQL's cost per hello or turn: {report['phones']} phones, "
        f"{report['says']} says each; load average {report['load_average']}",
        f"{'per':<8}{'n':>6}" + "".join(f"{label:>9}" for _, label in COLUMNS),
    ]
    for name, got in report["phases"].items():
        cells = "".join(f"{got['per_unit'][key]:>9.2f}" for key, _ in COLUMNS)
        lines.append(f"{name:<8}{got['units']:>6}{cells}")
    lines.append(
        "idle, per second: " + ", ".join(f"{k} {v}" for k, v in report["idle_per_s"].items())
    )
    for name in ("turns", "memory"):
        lines.append(f"{name}: statements per turn (calls, WAL bytes)")
        for row in report["phases"][name]["top_statements"]:
            lines.append(f"  {row['calls']:>6.2f} {row['wal_bytes']:>8.1f}  {row['query']}")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    """The table (and --json); 2 if the run could not finish."""
    with tempfile.TemporaryDirectory(prefix="stillhere-db-cost-") as tmp:
        return await procs.finish("db-cost", measure(args, Path(tmp)), args, table, lambda _: 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.db_cost", description=DESCRIPTION)
    add_options(parser)
    return run_on_loop(run(parser.parse_args(argv)), "asyncio")


if __name__ == "__main__":
    sys.exit(main())
