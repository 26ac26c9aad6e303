"""`GET /v1/ws`: protocol v1 over WebSocket text frames."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from typing import Any, cast

import orjson
from aiohttp import WSMessage, WSMsgType, web

from actors.directory import CLOSE_MOVED
from transport.config import Limits
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
PING = struct.pack("!BB", 0x89, 0)  # a WebSocket ping, final, empty (RFC 6455 5.5.2)


class WebSocketLink(QueuedLink):
    kind = "ws"
    __slots__ = ("_closing", "_ws", "heard", "pinged_at", "reading")

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
        # The heartbeat's (`keep_pinging`): when the phone last sent a frame (any: a ping,
        # a pong), and when it was pinged since, if it was; loop time.
        self.heard = asyncio.get_running_loop().time()
        self.pinged_at: float | None = None

    def heard_from(self, now: float) -> None:
        self.heard, self.pinged_at = now, None

    def beat(self, now: float, ping_after: float, pong_within: float) -> None:
        """Ping the phone if it has been silent `ping_after` seconds; drop the connection if
        it has not answered a ping in `pong_within`."""
        transport = cast(asyncio.WriteTransport | None, self.transport)
        if transport is None or transport.is_closing():
            return
        if self.pinged_at is None:
            if now - self.heard >= ping_after:
                self.pinged_at = now
                if self._ready_transport() is not None and not self._ws.closed:
                    transport.write(PING)
        elif now - self.pinged_at >= pong_within:
            log.info("%s dropped: no pong within %g s of a ping", self.name, pong_within)
            transport.abort()

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
    """A link's whole life, in one coroutine: its frame is held for as long as the phone
    stays connected, and each coroutine nested in it would hold one more (some 300 bytes
    a phone), so the steps it takes are plain functions or `_next_frame`'s short wait."""
    server = request.app[SERVER_KEY]
    limits = server.settings.limits
    try:
        slot = address_slot(server, request)
    except TooManyLinks as refused:
        return await refuse_link(refused)
    with slot:
        ws = _response(limits)
        await ws.prepare(request)
        link = WebSocketLink(ws, request.transport, limits.link_buffer)
        server.links.add(link)
        session = Session(server, link)
        rate = RateLimiter(limits)
        loop = asyncio.get_running_loop()
        late: asyncio.TimerHandle | None = loop.call_later(
            limits.hello_timeout, _no_hello, session, link
        )
        try:
            while (message := await _next_frame(ws, link)) is not None:
                if not await _on_frame(server, session, link, rate, message.data):
                    break
                if late is not None and session.person is not None:
                    # Identified: the timer has nothing left to do, and a cancelled
                    # handle still holds some 200 bytes for as long as the link lasts.
                    late.cancel()
                    late = None
        except ConnectionError as gone:  # the phone aborted mid-write: a drop, not an error
            log.info("%s dropped: %s", link.name, gone)
        finally:
            if late is not None:
                late.cancel()
            await _ended(session, link, ws)
        return ws


async def _ended(session: Session, link: WebSocketLink, ws: web.WebSocketResponse) -> None:
    """The link is over: detach it, write what it still holds, close, let go."""
    session.close()
    await link.drain()
    await link.closed_by_handler()
    release_cycles(ws)


def _response(limits: Limits) -> web.WebSocketResponse:
    """The aiohttp side of a link. It closes the link on a frame over max_msg_size: a hard
    backstop, frames between our limit and it are answered with a coded error instead.
    No permessage-deflate: a compressor per link would hold some 256 KB (zlib's window and
    state), several times what a whole idle conversation may cost, for frames mostly too
    small to gain from it. Uncompressed frames also let `write_now` frame them itself.
    No aiohttp heartbeat (a timer per link, rescheduled as frames arrive): one loop-wide
    sweep pings every link (`keep_pinging`), and the handler answers pings itself."""
    return web.WebSocketResponse(
        max_msg_size=limits.max_frame_bytes * 4,
        autoping=False,
        compress=False,
        timeout=CLOSE_WAIT_S,
    )


async def _next_frame(ws: web.WebSocketResponse, link: WebSocketLink) -> WSMessage | None:
    """The phone's next text or binary frame; None once the link closes, from either side
    (`link.close` ends the wait early). Its pings are answered, and any frame is heard."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(None) as link.reading:
            while True:
                message = await ws.receive()
                link.heard_from(loop.time())
                if message.type is WSMsgType.PING:
                    await ws.pong(message.data)
                elif message.type is not WSMsgType.PONG:
                    break
    except TimeoutError:
        return None
    finally:
        link.reading = None
    return message if message.type in (WSMsgType.TEXT, WSMsgType.BINARY) else None


async def keep_pinging(server: Server) -> None:
    """The WebSocket heartbeat (docs/protocol.md): every `server.pong_within` / 3 seconds,
    each link whose phone has sent nothing for `server.ping_after` is pinged, and one that
    has not answered `server.pong_within` after is dropped. One sweep for all links rather
    than aiohttp's `heartbeat`, a timer per link that each frame received reschedules: a
    held link costs two floats instead. Until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(server.pong_within / 3)
        now = loop.time()
        for link in list(server.links):
            if isinstance(link, WebSocketLink):
                link.beat(now, server.ping_after, server.pong_within)


def _no_hello(session: Session, link: WebSocketLink) -> None:
    """`--hello-timeout` after connecting: close a link that has not said hello (or is
    not saying one now), so a connection that never does holds nothing for long."""
    if session.person is None:
        log.info("%s closed: no hello in time", link.name)
        link.send(error_frame("hello_timeout", "no hello in time; connect again and say hello"))
        link.end(CLOSE_HELLO_TIMEOUT)


def release_cycles(ws: web.WebSocketResponse) -> None:
    """Break the reference cycles aiohttp leaves around a WebSocket it has served, so that
    reference counting frees the link's objects as its handler returns.

    Left alone, they are freed only by the garbage collector: under `python -m bench.flap
    --clients 2000` every dropped WebSocket link leaves about 50 objects in cycles, and each
    young collection walks them, with the loop stopped. The cycle (aiohttp 3.14): a close
    written into a dead socket keeps its error, whose traceback holds the frames that hold
    the response. It is cut once the link is over; the error stays readable, without its
    traceback. (aiohttp's heartbeat would add another, through the data callback it sets on
    the connection's protocol: it is off, `keep_pinging` pings instead.)"""
    error, seen = ws.exception(), set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__


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
