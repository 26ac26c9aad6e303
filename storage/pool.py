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
# down by an operator, a pooled connection found dead): "not now", not a wrong query. The
# pool drops such a connection and opens a fresh one on a later use, once PostgreSQL is back.
UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.InterfaceError,
)


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
