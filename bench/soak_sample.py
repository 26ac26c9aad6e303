"""One reading of what a long-running server holds, for `bench.soak`.

Each reading comes from the running processes themselves, never from the bench's clock:

- the server process: RSS and OS threads (psutil), and its open file descriptors from
  `/proc/PID/fd`, split into sockets and the rest (files, pipes, eventfds); its TCP
  connections that are established (a phone holds the other end) and in CLOSE_WAIT (the
  phone has closed, the server still holds the socket: what a descriptor leak looks like
  while it happens);
- the server's `/metrics`: `stillhere_live_actors` (conversations with a live actor),
  `stillhere_actor_threads` (the threads serving them: the actor pool's, or one per live
  actor) and `stillhere_links` (client links attached, each one socket);
- its PostgreSQL, over one connection the bench holds for the run: the other backends in
  `pg_stat_activity` (the server's pools), `pg_total_relation_size` of every table in the
  public schema (indexes and TOAST included), and the turns stored.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from bench import procs
from bench.flap_db import dsn_of
from bench.flap_metrics import scrape

# Every connection but the bench's own reading one: the server's pools.
CONNECTIONS = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
)
TABLE_BYTES = (
    "SELECT c.relname, pg_total_relation_size(c.oid) AS bytes FROM pg_class c "
    "WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace"
)
GAUGES = {
    "stillhere_live_actors": "live_actors",
    "stillhere_actor_threads": "actor_threads",
    "stillhere_links": "links",
}


@dataclass
class Sample:
    t: float  # seconds since the load began
    rss_mb: float
    threads: int
    fds: int
    fds_sockets: int
    tcp_established: int
    tcp_close_wait: int
    live_actors: int
    actor_threads: int
    links: int
    db_connections: int
    turns_stored: int
    tables_mb: float  # every table's pg_total_relation_size, summed
    table_bytes: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def open_fds(pid: int) -> tuple[int, int]:
    """(descriptors, of which sockets) the process holds open now."""
    fd_dir = Path(f"/proc/{pid}/fd")
    total = sockets = 0
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue  # closed between the listing and the read
        total += 1
        sockets += target.startswith("socket:")
    return total, sockets


def tcp_states(process: psutil.Process) -> dict[str, int]:
    """The process's TCP connections established, and those whose peer has closed and that
    it has not (CLOSE_WAIT)."""
    states = Counter(c.status for c in process.net_connections("tcp"))
    return {
        "tcp_established": states[psutil.CONN_ESTABLISHED],
        "tcp_close_wait": states[psutil.CONN_CLOSE_WAIT],
    }


async def gauges(base_url: str) -> dict[str, int]:
    found = {key: 0 for key in GAUGES.values()}
    for sample in await scrape(base_url):
        if sample.name in GAUGES:
            found[GAUGES[sample.name]] = int(sample.value)
    return found


class Sampler:
    """Reads a `Sample` of one running stillhere server on demand."""

    def __init__(self, server: procs.Server, t0: float) -> None:
        self.server = server
        self.t0 = t0
        self._db: asyncpg.Connection | None = None

    async def open(self) -> None:
        assert self.server.pgdata is not None
        self._db = await asyncpg.connect(dsn_of(self.server.pgdata), timeout=30)

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()

    async def read(self) -> Sample:
        assert self._db is not None
        t = time.perf_counter() - self.t0
        fds, sockets = open_fds(self.server.proc.pid)
        live = await gauges(self.server.base_url)
        tables = {r["relname"]: int(r["bytes"]) for r in await self._db.fetch(TABLE_BYTES)}
        return Sample(
            t=round(t, 1),
            rss_mb=round(self.server.rss_mb(), 2),
            threads=self.server.threads(),
            fds=fds,
            fds_sockets=sockets,
            **tcp_states(self.server.ps()),
            live_actors=live["live_actors"],
            actor_threads=live["actor_threads"],
            links=live["links"],
            db_connections=int(await self._db.fetchval(CONNECTIONS)),
            turns_stored=int(await self._db.fetchval("SELECT count(*) FROM turns")),
            tables_mb=round(sum(tables.values()) / 2**20, 3),
            table_bytes=tables,
        )
