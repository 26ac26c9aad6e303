"""The running server's view of revoked persons, kept current by PostgreSQL LISTEN/NOTIFY.

`stillhere revoke` writes the `revocations` table and notifies (storage/revocations.py).
Each server holds one connection of its own that listens: on a revocation it adds the
person to the set every hello and request is checked against (`Identity.person`), and
closes the person's live links (`error` `revoked`, WebSocket close 4403). The set is read
whole when the server starts and again each time the listening connection comes back after
a loss, so a revocation made meanwhile is not missed; until then, the set read last holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from storage.revocations import CHANNEL, REVOKED, revoked

log = logging.getLogger("stillhere.revocations")

LISTENER = "stillhere revocations"  # its connection's application_name, for pg_stat_activity
RECONNECT_S = 2.0  # between attempts to listen again after the connection was lost


class RevocationWatch:
    def __init__(self, dsn: str, on_revoked: Callable[[str], None]) -> None:
        self.revoked: set[str] = set()
        self._dsn = dsn
        self._on_revoked = on_revoked

    async def load(self) -> asyncpg.Connection:
        """Connect, listen, and read the whole set; the connection, for `watch`."""
        conn = await asyncpg.connect(self._dsn, server_settings={"application_name": LISTENER})
        try:
            await conn.add_listener(CHANNEL, self._heard)
            self._replace(await revoked(conn))
        except BaseException:
            await conn.close()
            raise
        return conn

    async def watch(self, conn: asyncpg.Connection) -> None:
        """Listen on `conn` (from `load`) until cancelled, listening again after a loss."""
        while True:
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _, lost=lost: lost.set())
            try:
                await lost.wait()
            finally:
                await conn.close()
            log.warning("the revocations listener lost its connection; listening again")
            conn = await self._reconnect()

    async def _reconnect(self) -> asyncpg.Connection:
        while True:
            await asyncio.sleep(RECONNECT_S)
            try:
                return await self.load()
            except (OSError, asyncpg.PostgresError) as failed:
                log.warning("the revocations listener cannot connect: %s", type(failed).__name__)

    def _heard(self, conn: object, pid: int, channel: str, payload: str) -> None:
        person = payload[1:]
        if payload.startswith(REVOKED):
            self._add({person})
        else:
            self.revoked.discard(person)
            log.info("revocation of person %s lifted", person[:8])

    def _replace(self, persons: set[str]) -> None:
        self._add(persons - self.revoked)
        self.revoked &= persons
        log.info("%d persons revoked", len(self.revoked))

    def _add(self, persons: set[str]) -> None:
        for person in persons:
            if person not in self.revoked:
                self.revoked.add(person)
                log.info("person %s revoked: its live links are closed", person[:8])
                self._on_revoked(person)
