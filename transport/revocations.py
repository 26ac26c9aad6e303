"""The running server's view of revoked persons, kept current by PostgreSQL LISTEN/NOTIFY.

`stillhere revoke` writes the `revocations` table and notifies (storage/revocations.py).
The server's own connection (storage/notices.py) listens: on a revocation the person is
added to the set every hello and request is checked against (`Identity.person`), and their
live links are closed (`error` `revoked`, WebSocket close 4403). The set is read whole on
every connection, first and after a loss, so a revocation made meanwhile is not missed;
until then, the set read last holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import asyncpg

from storage.notices import Notices
from storage.revocations import CHANNEL, REVOKED, revoked

log = logging.getLogger("stillhere.revocations")


class RevocationWatch:
    def __init__(self, notices: Notices, on_revoked: Callable[[str], None]) -> None:
        self.revoked: set[str] = set()
        self._on_revoked = on_revoked
        notices.listen(CHANNEL, self._heard)
        notices.on_connect(self._load)

    async def _load(self, conn: asyncpg.Connection) -> None:
        self._replace(await revoked(conn))

    def _heard(self, payload: str) -> None:
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
