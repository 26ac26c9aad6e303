"""A client link: frames are queued by the stream (sync, on the loop) and written by one
writer task, so a slow phone never holds up the conversation or the other links."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from abc import ABC, abstractmethod
from typing import Any

log = logging.getLogger("stillhere.link")

_numbers = itertools.count(1)


class QueuedLink(ABC):
    kind = "link"

    def __init__(self) -> None:
        self.name = f"{self.kind}-{next(_numbers)}"
        # A frame to write, or a close code: close once everything before it is written.
        self._queue: asyncio.Queue[dict[str, Any] | int] = asyncio.Queue()
        self._writer = asyncio.get_running_loop().create_task(self._write_all())

    def send(self, frame: dict[str, Any]) -> None:
        self._queue.put_nowait(frame)

    def end(self, code: int = 1000) -> None:
        """Close the link after the frames already queued (e.g. after `bye`)."""
        self._queue.put_nowait(code)

    async def _write_all(self) -> None:
        while not isinstance(item := await self._queue.get(), int):
            try:
                await self.write(item)
            except (ConnectionError, RuntimeError) as gone:
                log.info("%s dropped while writing: %s", self.name, gone)
                return
        with contextlib.suppress(ConnectionError, RuntimeError):  # already gone: fine
            await self.close(item)

    @abstractmethod
    async def write(self, frame: dict[str, Any]) -> None: ...

    @abstractmethod
    async def close(self, code: int) -> None: ...

    async def drain(self, code: int = 1000) -> None:
        """Write what is queued, then close."""
        self.end(code)
        await self._writer
