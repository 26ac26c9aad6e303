"""`GET /v1/ws`: protocol v1 over WebSocket text frames."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from transport.identity import Unauthorized
from transport.link import Frame, QueuedLink
from transport.protocol import ProtocolError, RateLimiter, decode, error_frame, rate_limited
from transport.server import SERVER_KEY, Server
from transport.session import Session

log = logging.getLogger("stillhere.ws")


class WebSocketLink(QueuedLink):
    kind = "ws"

    def __init__(self, ws: web.WebSocketResponse) -> None:
        super().__init__()
        self._ws = ws

    async def write(self, frames: list[Frame]) -> None:
        for frame in frames:
            if self._ws.closed:
                raise ConnectionError("closed")
            # orjson's bytes are UTF-8 already: sent as a text frame without a round trip
            # through str.
            await self._ws.send_frame(orjson.dumps(frame), WSMsgType.TEXT)

    async def close(self, code: int) -> None:
        await self._ws.close(code=code)


async def websocket_handler(request: web.Request) -> web.WebSocketResponse:
    server = request.app[SERVER_KEY]
    limits = server.settings.limits
    # aiohttp closes the link on a frame over max_msg_size; keep that as a hard backstop
    # and answer frames between our limit and it with a coded error instead.
    ws = web.WebSocketResponse(max_msg_size=limits.max_frame_bytes * 4, heartbeat=30.0)
    await ws.prepare(request)
    link = WebSocketLink(ws)
    server.links.add(link)
    session = Session(server, link)
    rate = RateLimiter(limits)
    try:
        async for message in ws:
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                if not await _on_frame(server, session, link, rate, message.data):
                    break
            elif message.type == WSMsgType.ERROR:
                break
    except ConnectionError as gone:  # the phone aborted mid-write: a drop, not an error
        log.info("%s dropped: %s", link.name, gone)
    finally:
        session.close()
        await link.drain()
    return ws


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
        link.send(error_frame("unauthorized", str(refused)))
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
