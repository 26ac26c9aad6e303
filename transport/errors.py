"""Every answer of the main and admin listeners is JSON, errors included.

Routing refusals (an unknown path, a method the path does not take), a body over the
listener's size limit, and anything a handler did not expect all reach a client as the
protocol's `error` object with a stable code, like every refusal a handler makes itself.
An unexpected failure is logged with its traceback, which never goes in the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from storage.pool import STORAGE_FULL, UNAVAILABLE, DiskSpace, storage_fault
from transport.protocol import error_frame

log = logging.getLogger("stillhere.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Where a request refused for lack of disk space is noted (`Store.space`), once the store is
# open: `/readyz` reads it.
DISK_SPACE_KEY = web.AppKey("stillhere.disk_space", DiskSpace)

# Statuses aiohttp raises itself, and the code each is answered with.
_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
}


# A request PostgreSQL could not serve now, on any route: the client may try again.
_STORAGE_MESSAGES = {
    "unavailable": "the database cannot be reached; try again",
    "storage_full": "the database's disk is full; try again once it has space",
}


def json_errors(not_found_hint: str) -> Any:
    """A middleware answering what no handler answered as a JSON error object;
    `not_found_hint` ends the message of a 404 (where to look instead)."""

    @web.middleware
    async def answer_json(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as refused:
            if refused.status < 400:
                raise
            return _refusal(request, refused, not_found_hint)
        except (*UNAVAILABLE, STORAGE_FULL) as failure:
            code, what = storage_fault(failure)
            log.warning("%s %s: PostgreSQL %s", request.method, request.path, what)
            space = request.app.get(DISK_SPACE_KEY)
            if space is not None:
                space.note(failure)
            return error_response(503, code, _STORAGE_MESSAGES[code])
        except Exception:
            log.exception("unexpected failure answering %s %s", request.method, request.path)
            return error_response(
                500, "internal_error", "the server failed unexpectedly; nothing more is known"
            )

    return answer_json


def _refusal(request: web.Request, refused: web.HTTPException, hint: str) -> web.Response:
    if isinstance(refused, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(refused.allowed_methods))
        return error_response(
            405,
            "method_not_allowed",
            f"{request.method} is not allowed on {request.path}: use {allowed}",
            headers={"Allow": allowed},
        )
    if isinstance(refused, web.HTTPNotFound):
        return error_response(404, "not_found", f"no endpoint {request.path}; {hint}")
    code = _CODES.get(refused.status, f"http_{refused.status}")
    # aiohttp's own text says what was wrong ("Maximum request body size 262144 exceeded…").
    return error_response(refused.status, code, refused.text or refused.reason)


def error_response(
    status: int,
    code: str,
    message: str,
    id_: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    """The protocol's `error` object as an HTTP answer: `id_` the say's it refuses, if any;
    `extra` fields say more (e.g. which `ids`)."""
    return web.Response(
        body=orjson.dumps({**error_frame(code, message, id_), **extra}),
        status=status,
        content_type="application/json",
        headers=headers,
    )
