"""Who the client is behind a proxy, and HSTS on every answer over HTTPS.

Behind HAProxy or nginx, the peer of every connection is the proxy: the per-address limits
would count all phones as one, and the logs would name the proxy. A proxy says who it
serves in `X-Forwarded-For` (the addresses a request passed, the client's first, each proxy
appending the one it heard from) and `X-Forwarded-Proto` (`https` when it terminated TLS).
Any client can send those headers too, so they count only on a connection from one of
`--trusted-proxies`; then the client is the last address in `X-Forwarded-For` that is not
itself a trusted proxy: what a client wrote before the proxy appended its peer is never
taken. Without trusted proxies, or from any other peer, the headers are ignored.

Every answer this server sends over TLS itself (`--tls-cert`) carries
`Strict-Transport-Security`: the browser then uses HTTPS for this host for two years, even
when given an `http://` link. A proxy that terminates TLS sends its own (deploy/).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

from aiohttp import web

from transport.config import Network

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]
HSTS = "max-age=63072000"  # two years, as the deploy/ configurations send it
SCHEMES = frozenset({"http", "https"})


def _within(address: str, trusted: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def client_address(forwarded_for: list[str], trusted: tuple[Network, ...]) -> str | None:
    """The client's address in a trusted proxy's `X-Forwarded-For` headers: the last one
    that is no trusted proxy; None if there is none, or it is no IP address."""
    hops = [hop.strip() for header in forwarded_for for hop in header.split(",")]
    for hop in reversed(hops):
        if not _within(hop, trusted):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return None
    return None


def forwarded(trusted: tuple[Network, ...]) -> Middleware:
    """The middleware: a trusted proxy's request seen with the client's address as
    `request.remote` and the client's scheme as `request.scheme`."""

    @web.middleware
    def real_client(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
        # Not a coroutine: it hands back the handler's awaitable, so a link (whose request
        # lasts as long as it is open) does not hold this middleware's frame meanwhile.
        if not trusted or not _within(request.remote or "", trusted):
            return handler(request)
        changes: dict[str, str] = {}
        client = client_address(request.headers.getall("X-Forwarded-For", []), trusted)
        if client is not None:
            changes["remote"] = client
        scheme = request.headers.get("X-Forwarded-Proto", "").strip().lower()
        if scheme in SCHEMES:
            changes["scheme"] = scheme
        return handler(request.clone(**changes) if changes else request)

    return real_client


async def strict_transport(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """`on_response_prepare`: HSTS on an answer sent over this server's own TLS."""
    transport = request.transport
    if transport is not None and transport.get_extra_info("sslcontext") is not None:
        response.headers["Strict-Transport-Security"] = HSTS
