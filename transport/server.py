"""What every request handler reaches: the parts of one running server."""

from __future__ import annotations

from dataclasses import dataclass, field
from weakref import WeakSet

import pykka
from aiohttp import WSCloseCode, web

from actors.directory import Directory
from actors.runtime import Runtime
from actors.supervisor import Supervisor
from transport.config import Settings
from transport.identity import Identity
from transport.link import QueuedLink
from transport.protocol import CLOSE_REVOKED, PersonRates, error_frame


@dataclass(slots=True)
class Server:
    settings: Settings
    runtime: Runtime
    identity: Identity
    directory: Directory
    supervisor: pykka.ActorRef[Supervisor]
    links: WeakSet[QueuedLink] = field(default_factory=WeakSet)
    admin_port: int | None = None  # where the admin API listens, once started (if on)
    post_rates: PersonRates = field(init=False)

    def __post_init__(self) -> None:
        self.post_rates = PersonRates(self.settings.limits)


SERVER_KEY = web.AppKey("stillhere.server", Server)


async def close_links(app: web.Application) -> None:
    """On shutdown, close every link as "going away" (1001): phones will reconnect."""
    for link in list(app[SERVER_KEY].links):
        link.end(WSCloseCode.GOING_AWAY)


def close_revoked(directory: Directory, person: str) -> None:
    """Close a just-revoked person's live links: `error` `revoked`, then close 4403."""
    live = directory.get(person)
    if live is not None:
        revoked = error_frame("revoked", "this account or device has been revoked")
        live.stream.farewell(revoked, CLOSE_REVOKED)
