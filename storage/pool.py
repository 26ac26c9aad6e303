"""The one way stillhere opens an asyncpg pool.

asyncpg resets every connection it takes back (`RESET ALL`, `UNLISTEN *`, unlock advisory
locks...), a round trip on each release: several per turn. Pool connections here never
change session state (migrations take their advisory lock on a connection of their own),
so that reset is skipped. asyncpg still rolls back a transaction left open before calling
the pool's `reset`, so a cancelled query never leaks into the next user.

A connection lost, or dropped by asyncpg for not answering, says its host is gone or
hung, and the pool's other connections to it are as good as lost: the pool replaces them
all (`expire_connections`) rather than let each hang its next user in turn.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import asyncpg

log = logging.getLogger("stillhere.storage")

# What asyncpg raises when PostgreSQL is down, restarting or cut off (refused, reset, shut
# down by an operator, a pooled connection found dead, no primary among the hosts yet):
# "not now", not a wrong query. The pool drops such a connection and opens a fresh one on
# a later use, once PostgreSQL is back.
UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.InterfaceError,
    # During a failover: no host of a multi-host DSN accepts writes yet (the standby is
    # still one), or a connection reached a server that is read-only now.
    asyncpg.TargetServerAttributeNotMatched,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
)

# PostgreSQL's disk is full (SQLSTATE 53100): a statement that needed a new page of a table,
# an index or a file failed and was rolled back; its connection lives on, and the same write
# succeeds once there is space again. (A full disk that stops WAL from growing is a PANIC
# instead: PostgreSQL drops every connection and recovers, which is UNAVAILABLE.)
STORAGE_FULL = asyncpg.exceptions.DiskFullError


def storage_fault(failure: Exception) -> tuple[str, str]:
    """The error code for a write PostgreSQL could not do now (UNAVAILABLE or STORAGE_FULL),
    and what happened on one line for the log (PostgreSQL's message, without its hint)."""
    if isinstance(failure, STORAGE_FULL):
        return "storage_full", f"disk full ({failure.message})"
    return "unavailable", f"unavailable ({failure or type(failure).__name__})"


class DiskSpace:
    """Whether PostgreSQL's disk is full as the server's writes last found it: the last
    write failed for lack of space and none has succeeded since. A failure of another kind
    says nothing about space and changes nothing. `/readyz` answers `storage_full` meanwhile."""

    def __init__(self) -> None:
        self.full = False

    def note(self, failure: BaseException | None) -> None:
        """After a write: None if it went through, else what refused it."""
        if failure is None:
            self.full = False
        elif isinstance(failure, STORAGE_FULL):
            self.full = True


# A primary that vanished (its machine dead, its network cut) refuses nothing: packets to it
# go unanswered, so nothing fails by itself for minutes. These bound what waits on it.
# - Each host of the DSN has this long to take a connection before the next one is tried
#   (asyncpg bounds the whole attempt instead: a vanished first host would use it all up,
#   and the standby promoted after it would never be tried).
CONNECT_TIMEOUT_S = 5.0
# - A statement, and asyncpg's cancelling of one, gives up after this (the pool then drops
#   its connection): the bound on a PostgreSQL that takes connections and never answers.
QUERY_TIMEOUT_S = 10.0
# - A connection whose data goes unacknowledged this long, or that is idle and whose host
#   stops answering keepalive probes, is dropped by the kernel (Linux), and the next use
#   of it fails: the bound on a host that vanished, the notices' idle connection included.
DEAD_PEER_S = 10


# For each multi-host DSN, its host (as a DSN of that host alone) that last took a
# connection: tried first next time, so that once a primary vanished and another was found,
# new connections do not each wait CONNECT_TIMEOUT_S for the vanished one first.
_LAST_TOOK: dict[str, str] = {}


async def connect(dsn: str, **options: Any) -> asyncpg.Connection:
    """`asyncpg.connect`, with a multi-host `dsn` tried one host at a time, each within
    CONNECT_TIMEOUT_S, and its socket dropped once its host stops answering (DEAD_PEER_S)."""
    hosts = _one_host_each(dsn)
    last = _LAST_TOOK.get(dsn)
    if last in hosts:
        hosts.insert(0, hosts.pop(hosts.index(last)))
    failure: BaseException | None = None
    for one in hosts:
        try:
            conn = await asyncpg.connect(one, timeout=CONNECT_TIMEOUT_S, **options)
        except UNAVAILABLE as error:  # gone, or not the primary: the next host may be
            failure = error
            continue
        _LAST_TOOK[dsn] = one
        _detect_dead_peer(conn)
        return conn
    assert failure is not None
    raise failure


def _one_host_each(dsn: str) -> list[str]:
    """`dsn` once per host it names, in order, with the rest of it as it is (a DSN of one
    host, or of none (a unix socket in its query), stays one)."""
    parts = urlsplit(dsn)
    user, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return [dsn]
    return [parts._replace(netloc=user + at + host).geturl() for host in hosts.split(",")]


def _detect_dead_peer(conn: asyncpg.Connection) -> None:
    """TCP keepalives and a user timeout on the connection's socket (Linux, over TCP)."""
    sock = conn._transport.get_extra_info("socket")  # asyncpg has no public way to it
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    if not hasattr(socket, "TCP_USER_TIMEOUT"):
        return
    probe_every_s = 1
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, DEAD_PEER_S // 2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, probe_every_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, DEAD_PEER_S // 2 // probe_every_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_PEER_S * 1000)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Nothing to undo: see the module docstring."""


class _PoolConnection(asyncpg.Connection):
    """A connection that knows whether it was closed on purpose (by the pool: idle, used
    enough, replaced, or the pool closing) or ended otherwise (lost, or dropped by asyncpg
    after a statement or its cancelling went unanswered)."""

    closed_on_purpose = False

    async def close(self, *, timeout: float | None = None) -> None:
        self.closed_on_purpose = True
        await super().close(timeout=timeout)


async def open_pool(
    dsn: str,
    *,
    max_size: int,
    init: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
) -> asyncpg.Pool:
    pool: asyncpg.Pool | None = None  # once made

    async def prepare(conn: _PoolConnection) -> None:
        async def ended(_: object) -> None:
            if pool is None or pool.is_closing() or conn.closed_on_purpose:
                return
            log.warning("a connection to PostgreSQL ended: the pool's others are replaced")
            await pool.expire_connections()

        conn.add_termination_listener(ended)
        if init is not None:
            await init(conn)

    pool = await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=max_size,
        init=prepare,
        reset=_keep_session,
        connect=connect,
        connection_class=_PoolConnection,
        command_timeout=QUERY_TIMEOUT_S,
    )
    return pool
