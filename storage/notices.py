"""The one PostgreSQL connection a server keeps to itself, for what lives with a session.

PostgreSQL delivers `NOTIFY`s to a connection that listens, and ends a session advisory
lock with its connection: both need a connection of their own, outside the pool. Whoever
needs it (the revocations, the node's ownership) registers channels and a hook before
`open`; the hooks run on every connection, first and after each loss, so each reads again
whatever it may have missed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg

from storage.pool import UNAVAILABLE, connect

log = logging.getLogger("stillhere.notices")

RECONNECT_S = 2.0  # between attempts to connect again after the connection was lost
APPLICATION_NAME = "stillhere notices"  # for pg_stat_activity

Heard = Callable[[str], None]  # a notice's payload
Hook = Callable[[asyncpg.Connection], Awaitable[None]]


class Notices:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._channels: dict[str, Heard] = {}
        self._hooks: list[Hook] = []
        self._conn: asyncpg.Connection | None = None  # the one `keep` holds

    def listen(self, channel: str, heard: Heard) -> None:
        self._channels[channel] = heard

    def on_connect(self, hook: Hook) -> None:
        self._hooks.append(hook)

    async def open(self) -> asyncpg.Connection:
        """Connect, listen, run the hooks; the connection, for `keep`."""
        conn = await connect(self._dsn, server_settings={"application_name": APPLICATION_NAME})
        try:
            for channel in self._channels:
                await conn.add_listener(channel, self._heard)
            for hook in self._hooks:
                await hook(conn)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def keep(self, conn: asyncpg.Connection) -> None:
        """Hold `conn` (from `open`) until cancelled, connecting again after a loss."""
        while True:
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _, lost=lost: lost.set())
            self._conn = conn
            try:
                await lost.wait()
            finally:
                self._conn = None
                await conn.close()
            log.warning("the notices connection to PostgreSQL was lost; connecting again")
            conn = await self._reconnect()

    def replace(self) -> None:
        """Drop the connection `keep` holds, which then connects again: for one that seems
        alive but is not where it should be (on a primary that vanished unnoticed: a peer
        that still acknowledges packets and answers nothing leaves an idle connection up)."""
        if self._conn is not None:
            self._conn.terminate()

    async def _reconnect(self) -> asyncpg.Connection:
        while True:
            await asyncio.sleep(RECONNECT_S)
            try:
                return await self.open()
            except (*UNAVAILABLE, asyncpg.PostgresError) as failed:
                log.warning("the notices connection cannot connect: %s", type(failed).__name__)

    def _heard(self, conn: object, pid: int, channel: str, payload: str) -> None:
        self._channels[channel](payload)
