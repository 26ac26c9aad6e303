"""A client link: the stream hands it frames (sync, on the loop); a slow phone never holds
up the conversation or the other links.

Frames sent in one loop step leave together at its end, in one write straight into the
socket's transport when the phone is keeping up: a turn's ack and `reply.start`, or a
reply's last delta and its `reply.end`, cost one system call and one packet, not one each,
and no task wakes for them. Otherwise (a phone falling behind) frames queue for a writer
task, made only then, which writes everything queued since it last wrote as one batch,
waits for the phone as long as it must, and ends once the queue is empty. Most links never
need one, and a link is a few objects fewer for every one it does not hold.

A phone that stops reading while replies stream costs what its link holds for it: past
`--link-buffer` bytes the link is cut off (close code 4503), the conversation and its
other links untouched. A frame is encoded once, as it is sent, and its bytes are counted
where they are: waiting in the link, or in the socket's buffer once written there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from abc import ABC, abstractmethod
from typing import cast

from actors.replay import Frame
from transport.protocol import CLOSE_SLOW_READER

log = logging.getLogger("stillhere.link")

_numbers = itertools.count(1)

# Bytes a transport may hold for its socket before frames wait for the writer task instead.
BACKLOG_BYTES = 64 * 1024
# A phone cut off for not reading has this long to read what its socket holds and the close
# that follows it, before the connection is aborted and its memory freed.
CUT_OFF_GRACE_S = 5.0


class QueuedLink(ABC):
    kind = "link"
    # Slots, not a dict: a held link is an object of these for every connected phone.
    __slots__ = (
        "__weakref__",  # the server's WeakSet of links
        "_buffer_limit",
        "_close_code",
        "_dropped",
        "_frames",
        "_queued_bytes",
        "_writer",
        "_writing_bytes",
        "name",
        "transport",
    )

    def __init__(self, transport: asyncio.BaseTransport | None, buffer_limit: int) -> None:
        self.name = f"{self.kind}-{next(_numbers)}"
        self.transport = transport  # the socket's, for the writes that need not wait
        # Encoded frames waiting for the step's end or the writer, oldest first.
        self._frames: list[bytes] = []
        self._close_code: int | None = None  # set by `end`: close once the frames are out
        self._dropped = False  # a write found the link gone: later frames go nowhere
        self._writer: asyncio.Task[None] | None = None  # only while there is work for it
        # What a phone that is behind costs: the bytes of the frames queued for the writer
        # and of the batch it is writing not yet in the socket's buffer, beside that buffer
        # (`held`): a byte is counted in one place at a time.
        self._buffer_limit = buffer_limit
        self._queued_bytes = 0
        self._writing_bytes = 0

    def send(self, frame: Frame) -> None:
        if self._close_code is not None or self._dropped:
            return
        encoded = self.encode(frame)
        self._frames.append(encoded)
        if self._writer is not None:  # behind: what waits for the writer is counted
            self._queued_bytes += len(encoded)
        if self._over_limit():
            return
        if self._writer is None and len(self._frames) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def _over_limit(self) -> bool:
        """Cut the link off (True) if it holds more than its limit. Checked as each frame
        is sent and after each of the writer's writes, so a link never holds more than its
        limit and the frames of one loop step; the socket's buffer is counted, as aiohttp's
        writes wait for a phone only every 64 KB. Not right after a write at the end of a
        step: a welcome with its replay may be large, and the phone has not had a chance to
        read it yet. True also once the link is gone."""
        if self._dropped:
            return True
        if self.held() <= self._buffer_limit:
            return False
        self._cut_off()
        return True

    def held(self) -> int:
        """Bytes this link holds for its phone: frames waiting, and the socket's buffer (none
        once it closes: asyncio's TLS transport, closed, has no buffer left to ask about)."""
        transport = cast(asyncio.WriteTransport | None, self.transport)
        buffered = 0
        if transport is not None and not transport.is_closing():
            buffered = transport.get_write_buffer_size()
        return self._queued_bytes + self._writing_bytes + buffered

    def _cut_off(self) -> None:
        """The phone stopped reading: drop what waits, close with CLOSE_SLOW_READER after
        whatever the socket already holds, and abort after a grace if it still has not
        read it. The conversation and its other links go on; the phone resumes later."""
        log.warning(
            "%s closed: its phone stopped reading (%d bytes held, limit %d)",
            self.name,
            self.held(),
            self._buffer_limit,
        )
        self._frames.clear()
        self._queued_bytes = 0
        self._dropped = True  # nothing more is written, and the writer does not close
        transport = cast(asyncio.WriteTransport | None, self.transport)
        if transport is not None and not transport.is_closing():
            transport.write(self.closing_bytes(CLOSE_SLOW_READER))
            transport.close()  # after what the socket holds, if the phone reads it
            asyncio.get_running_loop().call_later(CUT_OFF_GRACE_S, transport.abort)

    def flush(self) -> None:
        """Write the frames sent so far: at the end of the loop step that sent them, or now
        for those that must not wait for it (a welcome: a resume is timed to it). At once if
        the phone keeps up, else by a writer (a running one, e.g. started by `end`, has them)."""
        if self._writer is not None or not self._frames:
            return
        if self.write_now(self._frames):
            self._frames = []
        else:
            self._start_writer()

    def end(self, code: int = 1000) -> None:
        """Close the link after the frames already queued (e.g. after `bye`)."""
        if self._close_code is None:
            self._close_code = code
            self._start_writer()

    def _start_writer(self) -> None:
        """A running writer takes whatever was queued meanwhile before it ends."""
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_all())

    async def _write_all(self) -> None:
        try:
            await self._write_queued()
            if self._close_code is not None and not self._dropped:
                with contextlib.suppress(ConnectionError, RuntimeError):  # gone: fine
                    await self.close(self._close_code)
        finally:
            self._writer = None

    async def _write_queued(self) -> None:
        try:
            while self._frames:
                batch, self._frames = self._frames, []
                # Frames queued before the writer began were not counted: they are now.
                self._writing_bytes, self._queued_bytes = sum(map(len, batch)), 0
                if not self.write_now(batch):
                    await self.write(batch)
                self._writing_bytes = 0  # all in the socket's buffer, or read already
                if self._over_limit():
                    return
        except (ConnectionError, RuntimeError) as gone:
            log.info("%s dropped while writing: %s", self.name, gone)
            self._dropped = True
            self._frames.clear()
        finally:
            self._writing_bytes = self._queued_bytes = 0

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

    def _in_socket(self, size: int) -> None:
        """`size` bytes of the batch being written went into the socket's buffer, where
        `held` counts them: called by `write` as it hands them over."""
        self._writing_bytes -= size

    @abstractmethod
    def encode(self, frame: Frame) -> bytes:
        """The frame as `write_now` and `write` take it: encoded once, as it is sent."""

    @abstractmethod
    def write_now(self, frames: list[bytes]) -> bool:
        """Write the encoded `frames` at once if the link takes them without waiting (open,
        and the phone keeping up); False leaves them to `write`."""

    @abstractmethod
    async def write(self, frames: list[bytes]) -> None:
        """Write the encoded `frames` in order, waiting for the phone if need be, telling
        `_in_socket` what goes into the socket's buffer before each wait; raise
        ConnectionError when the link is gone."""

    @abstractmethod
    async def close(self, code: int) -> None: ...

    @abstractmethod
    def closing_bytes(self, code: int) -> bytes:
        """What ends the link on the wire, written straight into the socket when a phone
        is cut off (a WebSocket close frame, the last chunk of an event stream)."""

    async def drain(self, code: int = 1000) -> None:
        """Write what is queued, then close."""
        self.end(code)
        if self._writer is not None:
            await self._writer
