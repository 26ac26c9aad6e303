"""What every request handler reaches: the parts of one running server."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from weakref import WeakSet

import pykka
from aiohttp import web

from actors.directory import CLOSE_MOVED, MOVED, Directory
from actors.runtime import Runtime
from actors.supervisor import Supervisor
from transport.config import Settings
from transport.errors import error_response
from transport.identity import Identity
from transport.link import QueuedLink
from transport.protocol import CLOSE_REVOKED, KeyedRates, error_frame
from transport.tls import Certificate


@dataclass(slots=True)
class Server:
    settings: Settings
    runtime: Runtime
    identity: Identity
    directory: Directory
    supervisor: pykka.ActorRef[Supervisor]
    certificate: Certificate | None = None  # the listeners' TLS (`--tls-cert`), if any
    links: WeakSet[QueuedLink] = field(default_factory=WeakSet)
    address_links: Counter[str] = field(default_factory=Counter)  # open links per IP address
    admin_port: int | None = None  # where the admin API listens, once started (if on)
    # The WebSocket heartbeat (transport/websocket.py, `keep_pinging`): a link silent this
    # long is pinged, and dropped if its phone has not answered within `pong_within`.
    ping_after: float = 30.0
    pong_within: float = 15.0
    readyz_asked_at: float | None = None  # monotonic: a balancer watches this node
    post_rates: KeyedRates = field(init=False)  # POSTs, per person
    address_rates: KeyedRates = field(init=False)  # new links, per IP address

    def __post_init__(self) -> None:
        limits = self.settings.limits
        self.post_rates = KeyedRates(limits.frames_per_s, limits.frame_burst)
        self.address_rates = KeyedRates(
            limits.links_per_s_per_address, limits.link_burst_per_address
        )


log = logging.getLogger("stillhere.server")

SERVER_KEY = web.AppKey("stillhere.server", Server)


REFUSAL_DELAY_S = 1.0  # before a link over an address's limits is refused


class TooManyLinks(Exception):
    """An address already has `--max-links-per-address` links open, or opened new ones
    faster than `--links-per-s-per-address` allows."""


class address_slot:
    """Hold one of the links the request's address may have open for as long as the link
    is; raise TooManyLinks when they are all taken, or when the address opens links faster
    than its rate (checked before any upgrade or stream, so a flood from one address costs
    a refused request each). A class with slots rather than a generator-based context
    manager: one is held by every open link, and a suspended generator costs several
    times as much."""

    __slots__ = ("_address", "_counts")

    def __init__(self, server: Server, request: web.Request) -> None:
        address = request.remote or ""
        limits = server.settings.limits
        limit = limits.max_links_per_address
        counts = server.address_links
        if limit and counts[address] >= limit:
            log.info("refused a link from %s: %d links open from there", address, counts[address])
            raise TooManyLinks(f"this address has {limit} links open; close one first")
        if limits.links_per_s_per_address and not server.address_rates.allow(address):
            log.info("refused a link from %s: opening links too fast", address)
            raise TooManyLinks(
                f"this address opens links faster than {limits.links_per_s_per_address:g} a "
                "second; wait before the next"
            )
        self._address, self._counts = address, counts

    def hold(self) -> address_slot:
        self._counts[self._address] += 1
        return self

    def release(self) -> None:
        counts, address = self._counts, self._address
        counts[address] -= 1
        if not counts[address]:
            del counts[address]

    def __enter__(self) -> None:
        self.hold()

    def __exit__(self, *exc: object) -> None:
        self.release()


async def refuse_link(refused: TooManyLinks) -> web.Response:
    """429 `too_many_links`, after REFUSAL_DELAY_S: a flood that reconnects as soon as it is
    refused then costs the server a connection per loop and second, not as many as it can
    send; the wait itself costs a sleeping coroutine."""
    await asyncio.sleep(REFUSAL_DELAY_S)
    return error_response(429, "too_many_links", str(refused))


async def close_links(app: web.Application) -> None:
    """On shutdown, close every link with `moved` (`bye`, close 4001): phones reconnect at
    once, to another node if there is one; the conversations are handed over next."""
    for link in list(app[SERVER_KEY].links):
        link.send(MOVED)
        link.end(CLOSE_MOVED)


def close_revoked(directory: Directory, person: str) -> None:
    """Close a just-revoked person's live links: `error` `revoked`, then close 4403."""
    live = directory.get(person)
    if live is not None:
        revoked = error_frame("revoked", "this account or device has been revoked")
        live.stream.farewell(revoked, CLOSE_REVOKED)
