"""`GET /healthz` and `GET /readyz`: what a load balancer or a Kubernetes probe asks.

`/healthz` (liveness) answers from the event loop itself: an answer at all means the process
and its loop are alive; restarting a server whose database is down would not help, so it
does not look further. `/readyz` (readiness) says whether a request could be served now:
PostgreSQL answers a trivial query within `READY_TIMEOUT_S`, its disk has room for writes
(`Store.disk_full`), and the chat model, the analysis model and the memory's embedder are
in place. A node draining (SIGTERM) answers `draining` before anything else, so that
balancers stop sending it links. Neither needs credentials, and neither names a secret:
the models are named by their labels, which carry no key.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref

from aiohttp import web

from storage.store import Store
from transport.errors import error_response
from transport.server import SERVER_KEY
from transport.sse import dumps

log = logging.getLogger("stillhere.health")

# The check under way for each store (a server has one), so probes never pile up.
_PINGS: weakref.WeakKeyDictionary[Store, asyncio.Future[None]] = weakref.WeakKeyDictionary()

# Long enough for a loaded PostgreSQL, short enough to answer before a probe's own timeout
# (Kubernetes' default is 1 s).
READY_TIMEOUT_S = 0.8


async def healthz_handler(request: web.Request) -> web.Response:
    """The loop answered: alive."""
    return web.json_response({"status": "alive"}, dumps=dumps)


async def readyz_handler(request: web.Request) -> web.Response:
    """200 with what was checked, or 503 with a code saying what is missing; both name the
    node (`--node-id`), so whoever asked through a balancer knows which one answered."""
    server = request.app[SERVER_KEY]
    server.readyz_asked_at = time.monotonic()
    node = server.directory.ownership.node
    if server.directory.draining:
        return error_response(503, "draining", "this node is stopping", node=node)
    rt = server.runtime
    models = {
        "chat": rt.model.label,
        "analysis": rt.analysis.label,
        "embeddings": getattr(rt.memory.embedder, "label", rt.memory.embedder.name)
        if rt.memory is not None
        else None,
    }
    missing = sorted(name for name, label in models.items() if label is None)
    if missing:
        return error_response(
            503, "models_missing", f"not configured: {', '.join(missing)}", node=node
        )
    problem = await _database_problem(rt.store)
    if problem is not None:
        log.warning("not ready: PostgreSQL did not answer (%s)", problem)
        return error_response(
            503,
            "database_unreachable",
            f"PostgreSQL did not answer within {READY_TIMEOUT_S:g} s ({problem})",
            node=node,
        )
    if await rt.store.disk_full():
        log.warning("not ready: PostgreSQL's disk is full")
        return error_response(
            503, "storage_full", "PostgreSQL's disk is full: writes fail", node=node
        )
    ready = {"status": "ready", "node": node, "database": "ok", "models": models}
    return web.json_response(ready, dumps=dumps)


async def _database_problem(store: Store) -> str | None:
    """None if PostgreSQL answers within `READY_TIMEOUT_S`, else what went wrong.

    The query runs as a task of its own, left to finish rather than awaited once cancelled:
    asyncpg cancels a query by talking to the server, and a paused server would hold the
    probe (and the next ones) as long as it is paused. One check at a time per store: a
    probe that finds one still under way is answered at once."""
    pending = _PINGS.get(store)
    if pending is not None and not pending.done():
        return "the previous check is still waiting"
    ping = asyncio.ensure_future(store.ping())
    _PINGS[store] = ping
    done, _ = await asyncio.wait({ping}, timeout=READY_TIMEOUT_S)
    if not done:
        ping.cancel()
        return "timed out"
    failure = ping.exception()
    return None if failure is None else f"{type(failure).__name__}: {failure}"


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/healthz", healthz_handler)
    router.add_get("/readyz", readyz_handler)
