"""A client link: the stream hands it frames (sync, on the loop); a slow phone never holds
up the conversation or the other links.

A frame goes straight into the socket's transport when the link is idle and the phone is
keeping up: no wake-up of another task, so a streamed delta or a welcome leaves in the loop
step that made it. Otherwise (a write already waiting, a phone falling behind) frames queue
for the link's writer task, which takes everything queued since it last ran as one batch and
waits for the phone as long as it must.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from abc import ABC, abstractmethod
from typing import cast

from actors.replay import Frame

log = logging.getLogger("stillhere.link")

_numbers = itertools.count(1)

# Bytes a transport may hold for its socket before frames wait for the writer task instead.
BACKLOG_BYTES = 64 * 1024


class QueuedLink(ABC):
    kind = "link"

    def __init__(self, transport: asyncio.BaseTransport | None) -> None:
        self.name = f"{self.kind}-{next(_numbers)}"
        self.transport = transport  # the socket's, for the writes that need not wait
        self._frames: list[Frame] = []
        self._close_code: int | None = None  # set by `end`: close once the frames are out
        self._writing = False  # the writer task is waiting on a write: later frames queue
        self._queued = asyncio.Event()  # something to do: frames, or the close
        self._writer = asyncio.get_running_loop().create_task(self._write_all())

    def send(self, frame: Frame) -> None:
        if self._close_code is not None:
            return
        if not self._frames and not self._writing and self.write_now([frame]):
            return
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
            if self.write_now(batch):
                continue
            self._writing = True
            try:
                await self.write(batch)
            except (ConnectionError, RuntimeError) as gone:
                log.info("%s dropped while writing: %s", self.name, gone)
                return
            finally:
                self._writing = False
        assert self._close_code is not None  # the loop only ends once `end` was called
        with contextlib.suppress(ConnectionError, RuntimeError):  # already gone: fine
            await self.close(self._close_code)

    def _ready_transport(self) -> asyncio.WriteTransport | None:
        """The transport, if the link is open and its phone reads what it is sent (little
        waits for the socket). Not an isinstance check: uvloop's transports have the
        methods of `asyncio.WriteTransport` but are not registered as its subclasses."""
        transport = cast(asyncio.WriteTransport | None, self.transport)
        if (
            transport is not None
            and not transport.is_closing()
            and transport.get_write_buffer_size() <= BACKLOG_BYTES
        ):
            return transport
        return None

    @abstractmethod
    def write_now(self, frames: list[Frame]) -> bool:
        """Write `frames` at once if the link takes them without waiting (open, and the
        phone keeping up); False leaves them to `write`."""

    @abstractmethod
    async def write(self, frames: list[Frame]) -> None:
        """Write `frames` in order, waiting for the phone if need be; raise
        ConnectionError when the link is gone."""

    @abstractmethod
    async def close(self, code: int) -> None: ...

    async def drain(self, code: int = 1000) -> None:
        """Write what is queued, then close."""
        self.end(code)
        await self._writer
