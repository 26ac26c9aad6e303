"""The `Origin` check: another web site cannot drive a person's conversation from their browser.

A page on any site can open a WebSocket to this server, or send it a "simple" POST (a
`text/plain` body needs no CORS preflight, and the POST handlers read any body as JSON),
and the browser attaches the `Origin` header of the page that did it. A device secret in
the app's storage is out of such a page's reach, but an account token or a secret it learnt
otherwise would not be: so the endpoints that act on a conversation or change stored data
(the WebSocket, the event stream, and every non-GET request under `/v1/`) refuse a request
whose `Origin` is present and is neither this server's own (the host and port it was
reached at, the `Host` header) nor one of `--allowed-origins`. Requests without `Origin`
(phone apps, the Python client, curl) are not browsers' cross-site requests and pass.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from transport.errors import error_response

log = logging.getLogger("stillhere.origin")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]
LINK_PATHS = frozenset({"/v1/ws", "/v1/events"})  # GETs that open a link
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def normalise(origin: str) -> str:
    """`scheme://host[:port]`, lowercased, without a trailing slash (as browsers send it)."""
    return origin.strip().rstrip("/").lower()


def guarded(request: web.Request) -> bool:
    """Whether the request acts: opens a link, or is a write under `/v1/`."""
    if not request.path.startswith("/v1/"):
        return False
    return request.path in LINK_PATHS or request.method not in SAFE_METHODS


def allowed(origin: str, host: str | None, extra: frozenset[str]) -> bool:
    """Same host and port as the request was sent to, or in the allow list."""
    if normalise(origin) in extra:
        return True
    netloc = urlsplit(origin.strip()).netloc.lower()
    return bool(netloc) and host is not None and netloc == host.lower()


async def _answer(response: web.StreamResponse) -> web.StreamResponse:
    return response


def origin_check(extra: frozenset[str]) -> Middleware:
    """The middleware; `extra` are the normalised `--allowed-origins`."""

    @web.middleware
    def check(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
        # Not a coroutine: it hands back the handler's awaitable, so a link (whose request
        # lasts as long as it is open) does not hold this middleware's frame meanwhile.
        origin = request.headers.get("Origin")
        if origin is not None and guarded(request) and not allowed(origin, request.host, extra):
            log.info("refused %s %s from origin %.200s", request.method, request.path, origin)
            return _answer(
                error_response(
                    403, "origin_refused", "requests from this web origin are not accepted"
                )
            )
        return handler(request)

    return check
