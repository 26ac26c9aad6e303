"""The open threads API: `GET /v1/threads`, what the conversations left open to come back to.

A thread is a loose end of kind `thread` (actors/loose_ends.py): a story not finished,
something promised. Listed oldest first, each with who left it open; closed (and gone from
the list) once a later exchange takes it up. Same credentials and error objects as the
memories and rules APIs.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from transport.memory_api import Answer, person_handler
from transport.server import Server


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/v1/threads", list_threads)


@person_handler
async def list_threads(
    request: web.Request, server: Server, person: str, body: dict[str, Any]
) -> Answer:
    threads = await server.runtime.store.loose_ends.threads(person)
    return 200, {"threads": [thread.wire() for thread in threads]}
