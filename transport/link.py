"""A client link: frames are queued by the stream (sync, on the loop) and written by one
writer task, so a slow phone never holds up the conversation or the other links."""

from __future__ import annotations

import asyncio
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
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._writer = asyncio.get_running_loop().create_task(self._write_all())

    def send(self, frame: dict[str, Any]) -> None:
        self._queue.put_nowait(frame)

    async def _write_all(self) -> None:
        while (frame := await self._queue.get()) is not None:
            try:
                await self.write(frame)
            except (ConnectionError, RuntimeError) as gone:
                log.info("%s dropped while writing: %s", self.name, gone)
                return

    @abstractmethod
    async def write(self, frame: dict[str, Any]) -> None: ...

    async def drain(self) -> None:
        """Write what is queued, then stop writing."""
        self._queue.put_nowait(None)
        await self._writer
