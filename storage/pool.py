"""The one way stillhere opens an asyncpg pool.

asyncpg resets every connection it takes back (`RESET ALL`, `UNLISTEN *`, unlock advisory
locks...), a round trip on each release: several per turn. Pool connections here never
change session state (migrations take their advisory lock on a connection of their own),
so that reset is skipped. asyncpg still rolls back a transaction left open before calling
the pool's `reset`, so a cancelled query never leaks into the next user.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg

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
    return "unavailable", f"unavailable ({failure})"


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


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Nothing to undo: see the module docstring."""


async def open_pool(
    dsn: str,
    *,
    max_size: int,
    init: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        dsn, min_size=1, max_size=max_size, init=init, reset=_keep_session
    )
