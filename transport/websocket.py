"""`GET /v1/ws`: protocol v1 over WebSocket text frames."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
from collections import deque
from typing import Any, cast

import orjson
from aiohttp import hdrs, web

from actors.directory import CLOSE_MOVED
from providers.slices import in_slices
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
from transport.ws_wire import PING_FRAME, WebSocketWire, close_frame, take_over, text_frame

log = logging.getLogger("stillhere.ws")

# After its close frame, how long the server waits for the phone's before dropping the
# connection: a round trip, with room for a phone that is busy.
CLOSE_WAIT_S = 2.0
WEBSOCKET_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 1.3
# Messages waiting to be handled before the link stops reading from its socket: a phone
# sending faster than its frames are handled waits in TCP, not in the server's memory.
INBOX_LIMIT = 8
# Links the heartbeat's sweep visits between two yields to the loop: a millisecond or so.
BEAT_SLICE = 1_000


class WebSocketLink(QueuedLink):
    """A WebSocket link and the dialogue on it: the wire (`ws_wire.py`) reports each
    message, and a task made only while messages wait handles them in order, so an idle
    link holds no task and no coroutine."""

    kind = "ws"
    __slots__ = (
        "_inbox",
        "_late",
        "_lost",
        "_reader",
        "_server",
        "_session",
        "_slot",
        "heard_at",
        "pinged_at",
        "rate",
        "wire",
    )

    def __init__(self, server: Server, slot: address_slot, transport: asyncio.Transport) -> None:
        limits = server.settings.limits
        super().__init__(transport, limits.link_buffer)
        self._server, self._slot = server, slot
        # Let go of at the end (`_finish`): the session refers to the link too, and a
        # cycle would leave the pair to the garbage collector.
        self._session: Session | None = Session(server, self)
        self.rate = RateLimiter(limits)
        # The protocol object the connection is handed to (`take_over`); it reports here.
        # A message over 4 x `--max-frame-bytes` closes the link (1009): a hard backstop,
        # frames between our limit and it are answered with a coded error instead. No
        # permessage-deflate: a compressor per link would hold some 256 KB (zlib's window
        # and state), many times what a whole idle phone costs, for frames mostly too small
        # to gain from it.
        self.wire = WebSocketWire(transport, self, limits.max_frame_bytes * 4)
        self._inbox: deque[bytes] | None = None  # messages not yet handled, while any are
        self._reader: asyncio.Task[None] | None = None  # handles them, while any are
        self._lost = False  # the connection is gone; the reader finishes the link
        loop = asyncio.get_running_loop()
        self._late: asyncio.TimerHandle | None = loop.call_later(
            limits.hello_timeout, self._no_hello
        )
        # The heartbeat's (`keep_pinging`): when the phone last sent a frame (any: a ping,
        # a pong), and when it was pinged since, if it was; loop time.
        self.heard_at = loop.time()
        self.pinged_at: float | None = None

    # The wire's reports (ws_wire.Handler)

    def heard(self) -> None:
        self.heard_at, self.pinged_at = asyncio.get_running_loop().time(), None

    def message(self, data: bytes) -> None:
        if self._inbox is None:
            self._inbox = deque()
        self._inbox.append(data)
        if len(self._inbox) == INBOX_LIMIT and self.transport is not None:
            cast(asyncio.ReadTransport, self.transport).pause_reading()
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read_all())

    def lost(self) -> None:
        self._lost = True
        if self._reader is None:
            self._finish()

    async def _read_all(self) -> None:
        """Handle the waiting messages in order; the link ends when one says so (a leave,
        refused credentials) or once the connection is lost."""
        inbox, session = cast(deque[bytes], self._inbox), cast(Session, self._session)
        try:
            while inbox and not self._lost:
                if len(inbox) == INBOX_LIMIT and self.transport is not None:
                    cast(asyncio.ReadTransport, self.transport).resume_reading()
                if not await _on_frame(self._server, session, self, inbox.popleft()):
                    self.end()
                    break
                self._identified(session)
        except ConnectionError as gone:  # the phone aborted mid-write: a drop, not an error
            log.info("%s dropped: %s", self.name, gone)
            self.end()
        finally:
            self._reader, self._inbox = None, None
            if self._lost:
                self._finish()

    def _identified(self, session: Session) -> None:
        """Once the person is known the hello timer has nothing left to do, and a
        cancelled handle still holds some 200 bytes for as long as the link lasts."""
        if self._late is not None and session.person is not None:
            self._late.cancel()
            self._late = None

    def _finish(self) -> None:
        """The connection is gone: detach from the conversation, let go of the address's
        slot."""
        if self._late is not None:
            self._late.cancel()
            self._late = None
        session, self._session = self._session, None
        if session is not None:
            session.close()
        self._slot.release()
        self._server.links.discard(self)

    def _no_hello(self) -> None:
        """`--hello-timeout` after connecting: close a link that has not said hello (or is
        not saying one now), so a connection that never does holds nothing for long."""
        self._late = None
        if self._session is not None and self._session.person is None:
            log.info("%s closed: no hello in time", self.name)
            self.send(error_frame("hello_timeout", "no hello in time; connect again and say hello"))
            self.end(CLOSE_HELLO_TIMEOUT)

    # Heartbeat and writing

    def beat(self, now: float, ping_after: float, pong_within: float) -> None:
        """Ping the phone if it has been silent `ping_after` seconds; drop the connection if
        it has not answered a ping in `pong_within`."""
        transport = cast(asyncio.WriteTransport | None, self.transport)
        if transport is None or transport.is_closing():
            return
        if self.pinged_at is None:
            if now - self.heard_at >= ping_after:
                self.pinged_at = now
                if self._ready_transport() is not None and self._open():
                    transport.write(PING_FRAME)
        elif now - self.pinged_at >= pong_within:
            log.info("%s dropped: no pong within %g s of a ping", self.name, pong_within)
            transport.abort()

    def _open(self) -> bool:
        """Data frames may still be written: no close frame was sent."""
        return not self.wire.closing

    def encode(self, frame: Frame) -> bytes:
        return orjson.dumps(frame)

    def write_now(self, frames: list[bytes]) -> bool:
        transport = self._ready_transport()
        if not self._open() or transport is None:
            return False
        transport.write(b"".join(map(text_frame, frames)))
        return True

    async def write(self, frames: list[bytes]) -> None:
        for payload in frames:
            transport = self.wire.transport
            if transport is None or not self._open():
                raise ConnectionError("closed")
            self._in_socket(len(payload))
            transport.write(text_frame(payload))
            await self.wire.drained()

    async def close(self, code: int) -> None:
        """Send the close frame; the wire waits CLOSE_WAIT_S at most for the phone's, then
        drops the connection."""
        reason = b"moved" if code == CLOSE_MOVED else b""
        self.wire.close(code, reason, within=CLOSE_WAIT_S)

    def closing_bytes(self, code: int) -> bytes:
        return close_frame(code)


class _Switched(web.StreamResponse):
    """The 101 that hands the connection over. aiohttp finishes every response it is given
    once the handler returns; by then the connection is no longer aiohttp's, and there is
    nothing left to write."""

    async def write_eof(self, data: bytes = b"") -> None:
        return None


async def websocket_handler(request: web.Request) -> web.StreamResponse:
    """Answer the upgrade, then take the connection from aiohttp (`ws_wire.take_over`): the
    link lives on as the wire and the link objects, with no request, task or coroutine
    held for it."""
    server = request.app[SERVER_KEY]
    try:
        slot = address_slot(server, request)
    except TooManyLinks as refused:
        return await refuse_link(refused)
    switched = _Switched(status=101, headers=_accepted(request))
    await switched.prepare(request)
    request.writer.send_headers()  # raises ConnectionError if the phone has gone
    transport = cast(asyncio.Transport, request.transport)
    link = WebSocketLink(server, slot.hold(), transport)
    take_over(request, link.wire)
    server.links.add(link)
    return switched


def _accepted(request: web.Request) -> dict[str, str]:
    """The 101's headers for a valid upgrade (RFC 6455 4.2.1); else 400 with the reason."""
    headers = request.headers
    if headers.get(hdrs.UPGRADE, "").strip().lower() != "websocket":
        raise web.HTTPBadRequest(text='can "Upgrade" only to "websocket"')
    if "upgrade" not in {t.strip().lower() for t in headers.get(hdrs.CONNECTION, "").split(",")}:
        raise web.HTTPBadRequest(text="no Connection: upgrade header")
    version = headers.get(hdrs.SEC_WEBSOCKET_VERSION, "")
    if version != "13":
        raise web.HTTPBadRequest(text=f"unsupported WebSocket version {version[:20]!r}")
    key = headers.get(hdrs.SEC_WEBSOCKET_KEY, "")
    try:
        valid = len(base64.b64decode(key, validate=True)) == 16
    except binascii.Error:
        valid = False
    if not valid:
        raise web.HTTPBadRequest(text="Sec-WebSocket-Key must be 16 bytes in base64")
    digest = hashlib.sha1(key.encode() + WEBSOCKET_GUID).digest()
    return {
        hdrs.UPGRADE: "websocket",
        hdrs.CONNECTION: "upgrade",
        hdrs.SEC_WEBSOCKET_ACCEPT: base64.b64encode(digest).decode(),
    }


async def keep_pinging(server: Server) -> None:
    """The WebSocket heartbeat (docs/protocol.md): every `server.pong_within` / 3 seconds,
    each link whose phone has sent nothing for `server.ping_after` is pinged, and one that
    has not answered `server.pong_within` after is dropped. One sweep for all links rather
    than a timer per link that each frame received would reschedule: a held link costs two
    floats instead. The sweep yields to the loop after every `BEAT_SLICE` links: at 10,000
    links one sweep in a piece held the loop 8 to 35 ms, some 200 at worst, and every say
    arriving meanwhile waited for it. Until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(server.pong_within / 3)
        links = [link for link in server.links if isinstance(link, WebSocketLink)]
        async for part in in_slices(links, BEAT_SLICE):
            now = loop.time()
            for link in part:
                link.beat(now, server.ping_after, server.pong_within)


async def _on_frame(server: Server, session: Session, link: WebSocketLink, raw: bytes) -> bool:
    """Handle one frame; False when the link must close."""
    try:
        if not link.rate.allow():
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
