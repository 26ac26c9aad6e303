"""A WebSocket connection once its handshake is done (RFC 6455): the phone's frames read,
its pings answered, the close handshake, and nothing else.

aiohttp answers the upgrade request; the connection is then taken from it (`take_over`).
Served by aiohttp, an open WebSocket keeps the upgrade request, its parser, the HTTP
protocol object, the WebSocket reader and writer and two tasks for as long as it lasts,
some 12 KB a phone (docs/scaling.md). Here an idle connection is this object and its
transport: a partly read frame is the only buffer it holds, and only until it is whole.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Protocol, cast

from aiohttp import web

# Opcodes (RFC 6455 5.2).
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
DATA_OPCODES = frozenset({CONTINUATION, TEXT, BINARY})
# Close codes (RFC 6455 7.4.1).
NORMAL, PROTOCOL_ERROR, INVALID_DATA, TOO_BIG = 1000, 1002, 1007, 1009
# What a phone may send in its close frame: the registered codes an endpoint may send, and
# the ranges for libraries and applications (RFC 6455 7.4.2; 1004 to 1006 and 1015 never).
_SENDABLE = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})


class Handler(Protocol):
    """The link a connection reports to, on the loop."""

    def message(self, data: bytes) -> None:
        """A whole text or binary message, its text valid UTF-8."""

    def heard(self) -> None:
        """Any frame came in: the phone is there."""

    def lost(self) -> None:
        """The connection is gone, from either side; nothing more is reported."""


class WireError(Exception):
    """A frame the protocol forbids: the connection is failed with `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class WebSocketWire(asyncio.Protocol):
    """The protocol object of one taken-over connection."""

    __slots__ = (
        "_abort",
        "_buffer",
        "_drained",
        "_handler",
        "_max_size",
        "_opcode",
        "_parts",
        "closing",
        "transport",
    )

    def __init__(self, transport: asyncio.Transport, handler: Handler, max_size: int) -> None:
        self.transport: asyncio.Transport | None = transport
        self._handler: Handler | None = handler
        self._max_size = max_size  # of a message: past it, close 1009
        self._buffer = b""  # a frame not yet whole
        self._parts: list[bytes] | None = None  # a fragmented message's frames so far
        self._opcode = TEXT  # the fragmented message's
        self.closing = False  # a close frame was sent: no data frame may follow it
        self._abort: asyncio.TimerHandle | None = None  # a phone that never answers a close
        self._drained: asyncio.Future[None] | None = None  # while the socket's buffer is full

    # asyncio.Protocol

    def data_received(self, data: bytes) -> None:
        handler = self._handler
        if handler is None or self.transport is None:
            return
        handler.heard()
        buffer = self._buffer + data if self._buffer else data
        try:
            taken = self._frames(buffer)
        except WireError as bad:
            self._buffer, self._parts = b"", None
            self.close(bad.code, str(bad).encode(), within=0.0)
            return
        self._buffer = buffer[taken:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._buffer, self._parts = b"", None
        if self._abort is not None:
            self._abort.cancel()
            self._abort = None
        self.resume_writing()  # a writer waiting for the socket finds it gone
        handler, self._handler = self._handler, None
        if handler is not None:
            handler.lost()

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    # Writing

    async def drained(self) -> None:
        """Until the socket's buffer is below its high-water mark again."""
        if self._drained is not None:
            await self._drained
        if self.transport is None:
            raise ConnectionError("the connection was lost")

    def close(self, code: int, reason: bytes = b"", within: float = 2.0) -> None:
        """Send the close frame (once), then drop the connection once the phone answers
        it, or after `within` seconds if it does not; at once with `within` 0 (a phone that
        answered ours, or broke the protocol: what it sends next is not read)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not self.closing:
            self.closing = True
            transport.write(close_frame(code, reason))
        if within <= 0:
            transport.close()
        elif self._abort is None:
            self._abort = asyncio.get_running_loop().call_later(within, transport.abort)

    # Reading

    def _frames(self, buffer: bytes) -> int:
        """Handle every whole frame at the start of `buffer`; the bytes taken."""
        at, size = 0, len(buffer)
        while self.transport is not None and not self.transport.is_closing():
            head = _header(buffer, at, size)
            if head is None:
                return at
            fin, opcode, length, start = head
            if opcode in DATA_OPCODES and self._message_size(opcode) + length > self._max_size:
                raise WireError(TOO_BIG, "message too big")
            if start + length > size:
                return at
            payload = _unmask(buffer[start - 4 : start], buffer[start : start + length])
            at = start + length
            self._frame(fin, opcode, payload)
        return at

    def _message_size(self, opcode: int) -> int:
        """The bytes of the message a data frame with `opcode` adds to; checks its place."""
        if opcode == CONTINUATION:
            if self._parts is None:
                raise WireError(PROTOCOL_ERROR, "a continuation frame with no message to continue")
            return sum(map(len, self._parts))
        if self._parts is not None:
            raise WireError(PROTOCOL_ERROR, "a new message before the last one ended")
        return 0

    def _frame(self, fin: bool, opcode: int, payload: bytes) -> None:
        if opcode == PING:
            if not self.closing and self.transport is not None:
                self.transport.write(_control(0x8A, payload))
        elif opcode == CLOSE:
            self._closed_by_phone(payload)
        elif opcode == PONG:
            pass  # heard, which is all a pong says
        elif not fin:
            if self._parts is None:
                self._opcode, self._parts = opcode, []
            self._parts.append(payload)
        elif opcode == CONTINUATION:
            parts, self._parts = cast(list[bytes], self._parts), None
            self._deliver(self._opcode, b"".join([*parts, payload]))
        else:
            self._deliver(opcode, payload)

    def _deliver(self, opcode: int, data: bytes) -> None:
        if opcode == TEXT:
            try:
                data.decode()
            except UnicodeDecodeError:
                raise WireError(INVALID_DATA, "a text message that is not UTF-8") from None
        if not self.closing and self._handler is not None:  # after our close: not read
            self._handler.message(data)

    def _closed_by_phone(self, payload: bytes) -> None:
        """Answer the phone's close with its code, unless it answers ours, and end."""
        code = NORMAL
        if len(payload) == 1:
            raise WireError(PROTOCOL_ERROR, "a close frame of one byte")
        if payload:
            code = int.from_bytes(payload[:2])
            if code not in _SENDABLE and not 3000 <= code <= 4999:
                raise WireError(PROTOCOL_ERROR, "an invalid close code")
            try:
                payload[2:].decode()
            except UnicodeDecodeError:
                raise WireError(INVALID_DATA, "a close reason that is not UTF-8") from None
        self.close(code, within=0.0)


def _header(buffer: bytes, at: int, size: int) -> tuple[bool, int, int, int] | None:
    """A frame's fin bit, opcode, payload length and where its payload starts (after the
    masking key, which precedes it); None while the header is not all there."""
    if size - at < 2:
        return None
    first, second = buffer[at], buffer[at + 1]
    if first & 0x70:
        raise WireError(PROTOCOL_ERROR, "reserved bits set with no extension agreed")
    if not second & 0x80:
        raise WireError(PROTOCOL_ERROR, "a phone's frame must be masked")
    fin, opcode, length = bool(first & 0x80), first & 0x0F, second & 0x7F
    if opcode not in DATA_OPCODES and opcode not in (CLOSE, PING, PONG):
        raise WireError(PROTOCOL_ERROR, f"unknown opcode {opcode}")
    if opcode >= CLOSE and (not fin or length > 125):
        raise WireError(PROTOCOL_ERROR, "a control frame fragmented or over 125 bytes")
    extra = 2 if length == 126 else 8 if length == 127 else 0
    if size - at < 2 + extra + 4:
        return None
    if extra:
        length = int.from_bytes(buffer[at + 2 : at + 2 + extra])
    return fin, opcode, length, at + 2 + extra + 4


def _unmask(key: bytes, data: bytes) -> bytes:
    """XOR with the repeated masking key, as one integer operation rather than a byte at
    a time."""
    size = len(data)
    if not size:
        return data
    mask = (key * (size // 4 + 1))[:size]
    return (int.from_bytes(data, "little") ^ int.from_bytes(mask, "little")).to_bytes(
        size, "little"
    )


def _control(first: int, payload: bytes) -> bytes:
    return bytes((first, len(payload))) + payload


PING_FRAME = _control(0x89, b"")  # a server's ping, final, empty (RFC 6455 5.5.2)


def close_frame(code: int, reason: bytes = b"") -> bytes:
    """A server's close frame (RFC 6455 5.5.1): final, unmasked, the code and the reason."""
    return struct.pack("!BBH", 0x88, 2 + len(reason), code) + reason


def text_frame(payload: bytes) -> bytes:
    """A whole text frame as a server sends it (RFC 6455 5.2: final, unmasked). orjson's
    bytes are UTF-8 already, so the JSON goes out without a round trip through str."""
    size = len(payload)
    if size < 126:
        return struct.pack("!BB", 0x81, size) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", 0x81, 126, size) + payload
    return struct.pack("!BBQ", 0x81, 127, size) + payload


def take_over(request: web.Request, wire: WebSocketWire) -> None:
    """Move the upgraded connection from aiohttp to `wire`, made on its transport.

    Done at once after the 101 is written, with no wait in between: a phone sends its first
    frame only once it has read the 101, so every frame reaches the wire. aiohttp is then
    told the connection is lost, with its transport unset first so it closes nothing: it
    forgets the connection, and the handler's response, already sent, ends its request."""
    cast(asyncio.Transport, request.transport).set_protocol(wire)
    aiohttp_side = request.protocol
    aiohttp_side.transport = None
    aiohttp_side.connection_lost(None)
