"""What the fake model servers share: a real aiohttp server on a free loopback port, a
request log, a script of responses, and a stop that releases hanging handlers."""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from aiohttp import web

R = TypeVar("R")


class FakeApi(Generic[R]):
    """Subclasses name their route; `start()` answers the base URL (`.../v1`)."""

    path = ""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.url = ""
        self._script: deque[R] = deque()
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()

    def queue(self, *responses: R) -> None:
        self._script.extend(responses)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def start(self) -> str:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_post(self.path, self.handle)
        # A short shutdown grace: a hanging handler is released by stop(), and anything
        # still streaming to a vanished client should not hold the test up for a minute.
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self.url

    async def stop(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
