"""`GET /healthz` and `GET /readyz`: what a load balancer or a Kubernetes probe asks.

`/healthz` (liveness) answers from the event loop itself: an answer at all means the process
and its loop are alive; restarting a server whose database is down would not help, so it
does not look further. `/readyz` (readiness) says whether a request could be served now:
PostgreSQL answers a trivial query within `READY_TIMEOUT_S`, and the chat model, the
analysis model and the memory's embedder are in place. Neither needs credentials, and
neither names a secret: the models are named by their labels, which carry no key.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from transport.errors import error_response
from transport.server import SERVER_KEY
from transport.sse import dumps

log = logging.getLogger("stillhere.health")

# Long enough for a loaded PostgreSQL, short enough to answer before a probe's own timeout
# (Kubernetes' default is 1 s).
READY_TIMEOUT_S = 0.8


async def healthz_handler(request: web.Request) -> web.Response:
    """The loop answered: alive."""
    return web.json_response({"status": "alive"}, dumps=dumps)


async def readyz_handler(request: web.Request) -> web.Response:
    """200 with what was checked, or 503 with a code saying what is missing."""
    rt = request.app[SERVER_KEY].runtime
    models = {
        "chat": rt.model.label,
        "analysis": rt.analysis.label,
        "embeddings": getattr(rt.memory.embedder, "label", rt.memory.embedder.name)
        if rt.memory is not None
        else None,
    }
    missing = sorted(name for name, label in models.items() if label is None)
    if missing:
        return error_response(503, "models_missing", f"not configured: {', '.join(missing)}")
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await rt.store.ping()
    except Exception as failure:  # refused, reset, timed out, shutting down: all "not now"
        log.warning("not ready: PostgreSQL did not answer (%s)", type(failure).__name__)
        return error_response(
            503,
            "database_unreachable",
            f"PostgreSQL did not answer within {READY_TIMEOUT_S:g} s ({type(failure).__name__})",
        )
    return web.json_response({"status": "ready", "database": "ok", "models": models}, dumps=dumps)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/healthz", healthz_handler)
    router.add_get("/readyz", readyz_handler)
