"""`GET /v1/ws`: protocol v1 over WebSocket text frames."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from typing import Any

import orjson
from aiohttp import WSMessage, WSMsgType, web

from actors.directory import CLOSE_MOVED
from transport.identity import Unauthorized
from transport.link import Frame, QueuedLink
from transport.protocol import (
    CLOSE_HELLO_TIMEOUT,
    CLOSE_REVOKED,
    ProtocolError,
    RateLimiter,
    decode,
    error_frame,
    rate_limited,
)
from transport.server import SERVER_KEY, Server, TooManyLinks, address_slot, refuse_link
from transport.session import Session

log = logging.getLogger("stillhere.ws")

# After its close frame, how long the server waits for the phone's before dropping the
# connection: a round trip, with room for a phone that is busy.
CLOSE_WAIT_S = 2.0


class WebSocketLink(QueuedLink):
    kind = "ws"
    __slots__ = ("_closing", "_ws", "reading")

    def __init__(
        self,
        ws: web.WebSocketResponse,
        transport: asyncio.BaseTransport | None,
        buffer_limit: int,
    ) -> None:
        super().__init__(transport, buffer_limit)
        self._ws = ws
        # While the handler waits for the phone's next frame: ended early to close.
        self.reading: asyncio.Timeout | None = None
        self._closing: int | None = None  # a close code left for the handler to send

    def encode(self, frame: Frame) -> bytes:
        return orjson.dumps(frame)

    def write_now(self, frames: list[bytes]) -> bool:
        transport = self._ready_transport()
        if self._ws.closed or transport is None:
            return False
        transport.write(b"".join(map(text_frame, frames)))
        return True

    async def write(self, frames: list[bytes]) -> None:
        for payload in frames:
            if self._ws.closed:
                raise ConnectionError("closed")
            self._in_socket(len(payload))  # send_frame writes it there before any wait
            await self._ws.send_frame(payload, WSMsgType.TEXT)

    async def close(self, code: int) -> None:
        """Send the close frame, wait (CLOSE_WAIT_S at most) for the phone's, then drop the
        connection. aiohttp, asked to close while the handler waits for a frame, drops it
        at once, and a phone then reads the close but cannot answer it (aiohttp's client
        reports 1006): the handler is woken to close instead, once it no longer waits."""
        if self.reading is not None:
            self._closing = code
            self.reading.reschedule(asyncio.get_running_loop().time())
            return
        await self._ws.close(code=code, message=b"moved" if code == CLOSE_MOVED else b"")

    async def closed_by_handler(self) -> None:
        """The close `close` left for the handler, if any (the handler's last step)."""
        if self._closing is not None:
            code, self._closing = self._closing, None
            with contextlib.suppress(ConnectionError, RuntimeError):  # gone: fine
                await self.close(code)

    def closing_bytes(self, code: int) -> bytes:
        """A close frame (RFC 6455 5.5.1): final, unmasked, the code as its payload."""
        return struct.pack("!BBH", 0x88, 2, code)


def text_frame(payload: bytes) -> bytes:
    """A whole text frame as a server sends it (RFC 6455 5.2: final, unmasked). orjson's
    bytes are UTF-8 already, so the JSON goes out without a round trip through str."""
    size = len(payload)
    if size < 126:
        return struct.pack("!BB", 0x81, size) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", 0x81, 126, size) + payload
    return struct.pack("!BBQ", 0x81, 127, size) + payload


async def websocket_handler(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER_KEY]
    try:
        with address_slot(server, request):
            return await _serve_link(server, request)
    except TooManyLinks as refused:
        return await refuse_link(refused)


async def _serve_link(server: Server, request: web.Request) -> web.WebSocketResponse:
    limits = server.settings.limits
    # aiohttp closes the link on a frame over max_msg_size; keep that as a hard backstop
    # and answer frames between our limit and it with a coded error instead.
    # No permessage-deflate: a compressor per link would hold some 256 KB (zlib's window and
    # state), several times what a whole idle conversation may cost, for frames mostly too
    # small to gain from it. Uncompressed frames also let `write_now` frame them itself.
    ws = web.WebSocketResponse(
        max_msg_size=limits.max_frame_bytes * 4,
        heartbeat=30.0,
        compress=False,
        timeout=CLOSE_WAIT_S,
    )
    await ws.prepare(request)
    link = WebSocketLink(ws, request.transport, limits.link_buffer)
    server.links.add(link)
    session = Session(server, link)
    rate = RateLimiter(limits)
    late = asyncio.get_running_loop().call_later(limits.hello_timeout, _no_hello, session, link)
    try:
        while (message := await _next_frame(ws, link)) is not None:
            if not await _on_frame(server, session, link, rate, message.data):
                break
    except ConnectionError as gone:  # the phone aborted mid-write: a drop, not an error
        log.info("%s dropped: %s", link.name, gone)
    finally:
        late.cancel()
        session.close()
        await link.drain()
        await link.closed_by_handler()
        release_cycles(ws, request)
    return ws


async def _next_frame(ws: web.WebSocketResponse, link: WebSocketLink) -> WSMessage | None:
    """The phone's next text or binary frame; None once the link closes, from either side
    (`link.close` ends the wait early)."""
    try:
        async with asyncio.timeout(None) as link.reading:
            message = await ws.receive()
    except TimeoutError:
        return None
    finally:
        link.reading = None
    return message if message.type in (WSMsgType.TEXT, WSMsgType.BINARY) else None


def _no_hello(session: Session, link: WebSocketLink) -> None:
    """`--hello-timeout` after connecting: close a link that has not said hello (or is
    not saying one now), so a connection that never does holds nothing for long."""
    if session.person is None:
        log.info("%s closed: no hello in time", link.name)
        link.send(error_frame("hello_timeout", "no hello in time; connect again and say hello"))
        link.end(CLOSE_HELLO_TIMEOUT)


def release_cycles(ws: web.WebSocketResponse, request: web.Request) -> None:
    """Break the reference cycles aiohttp leaves around a WebSocket it has served, so that
    reference counting frees the link's objects as its handler returns.

    Left alone, they are freed only by the garbage collector: under `python -m bench.flap
    --clients 2000` every dropped WebSocket link leaves about 50 objects in cycles, and each
    young collection walks them, with the loop stopped. Two cycles (aiohttp 3.14):
    - the connection's protocol keeps the response's data callback (set for its heartbeat),
      and the response keeps the request, which keeps the protocol;
    - a close written into a dead socket keeps its error, whose traceback holds the frames
      that hold the response.
    Both are cut once the link is over: no data is read after this, and the error stays
    readable, without its traceback."""
    error, seen = ws.exception(), set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__
    protocol = request.protocol
    if getattr(protocol, "_data_received_cb", None) is not None:
        protocol._data_received_cb = None


async def _on_frame(
    server: Server, session: Session, link: WebSocketLink, rate: RateLimiter, raw: str | bytes
) -> bool:
    """Handle one frame; False when the link must close."""
    try:
        if not rate.allow():
            raise rate_limited()
        frame = decode(raw, server.settings.limits)
        return await _dispatch(session, link, frame)
    except ProtocolError as bad:
        link.send(bad.frame())
        return bad.code != "unauthorized"
    except Unauthorized as refused:
        log.info("refused a hello on %s: %s", link.name, refused)
        link.send(error_frame(refused.code, str(refused)))
        if refused.code == "revoked":
            link.end(CLOSE_REVOKED)
        return False


async def _dispatch(session: Session, link: WebSocketLink, frame: dict[str, Any]) -> bool:
    kind = frame["type"]
    if kind == "ping":
        link.send({"type": "pong"})
    elif kind == "hello":
        if session.live is not None:
            raise ProtocolError("already_hello", "this link has already said hello")
        await session.hello(frame)
    elif kind == "say":
        outcome = await session.say(frame)
        if outcome.duplicate and outcome.ack is not None:
            link.send(outcome.ack)
    elif kind == "interrupt":
        session.interrupt()
    elif kind == "leave":
        await session.leave()
        return False
    elif kind == "ack":
        session.confirm(frame["seq"])
    return True
