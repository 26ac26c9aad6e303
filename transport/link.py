"""A client link: frames are queued by the stream (sync, on the loop) and written by one
writer task, so a slow phone never holds up the conversation or the other links.

The writer takes everything queued since it last ran and writes it as one batch: a streamed
reply queues its frames faster than a busy loop comes back to the writer, and a batch costs
one wake-up of the writer (and, for SSE, one write to the socket) instead of one per frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from abc import ABC, abstractmethod

from actors.replay import Frame

log = logging.getLogger("stillhere.link")

_numbers = itertools.count(1)


class QueuedLink(ABC):
    kind = "link"

    def __init__(self) -> None:
        self.name = f"{self.kind}-{next(_numbers)}"
        self._frames: list[Frame] = []
        self._close_code: int | None = None  # set by `end`: close once the frames are out
        self._queued = asyncio.Event()  # something to do: frames, or the close
        self._writer = asyncio.get_running_loop().create_task(self._write_all())

    def send(self, frame: Frame) -> None:
        if self._close_code is None:
            self._frames.append(frame)
            self._queued.set()

    def end(self, code: int = 1000) -> None:
        """Close the link after the frames already queued (e.g. after `bye`)."""
        if self._close_code is None:
            self._close_code = code
            self._queued.set()

    async def _write_all(self) -> None:
        while self._frames or self._close_code is None:
            if not self._frames:
                self._queued.clear()
                await self._queued.wait()
                continue
            batch, self._frames = self._frames, []
            try:
                await self.write(batch)
            except (ConnectionError, RuntimeError) as gone:
                log.info("%s dropped while writing: %s", self.name, gone)
                return
        assert self._close_code is not None  # the loop only ends once `end` was called
        with contextlib.suppress(ConnectionError, RuntimeError):  # already gone: fine
            await self.close(self._close_code)

    @abstractmethod
    async def write(self, frames: list[Frame]) -> None:
        """Write `frames` in order; raise ConnectionError when the link is gone."""

    @abstractmethod
    async def close(self, code: int) -> None: ...

    async def drain(self, code: int = 1000) -> None:
        """Write what is queued, then close."""
        self.end(code)
        await self._writer
