"""`GET /v1/events` (server-sent events) plus `POST /v1/say|interrupt|leave`.

For clients that cannot hold a WebSocket. Credentials come from headers
(`Authorization: Bearer TOKEN` or `X-Stillhere-Device: SECRET`), or, for a browser's
EventSource which cannot set headers, from the query (`?token=` or `?device=`); the access
log never records query strings. POST bodies may also carry `device` or `token`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from aiohttp import web
from aiohttp_sse import EventSourceResponse

from actors.directory import Draining
from transport.errors import error_response
from transport.identity import Unauthorized
from transport.link import Frame, QueuedLink
from transport.protocol import (
    ProtocolError,
    check_conversation,
    rate_limited,
    validate,
)
from transport.server import SERVER_KEY, Server, TooManyLinks, address_slot, refuse_link
from transport.session import Session

log = logging.getLogger("stillhere.sse")

SEND_TIMEOUT_S = EventSourceResponse.DEFAULT_SEND_TIMEOUT or 120.0


class EventStreamLink(QueuedLink):
    """Events as `id:`/`event:`/`data:` blocks (PROTOCOL.md), a batch in one write.

    aiohttp-sse's `send` formats and writes one event at a time under its own timer; the
    blocks are written here, all at once. A write that must wait for the phone does so under
    the same guard: waiting longer than the response's send timeout ends the stream and
    aborts the connection (on Linux the kernel's TCP user timeout, set by aiohttp-sse, ends
    it too).
    """

    kind = "sse"
    __slots__ = ("_response",)

    def __init__(
        self, request: web.Request, response: EventSourceResponse, buffer_limit: int
    ) -> None:
        super().__init__(request.transport, buffer_limit)
        self._response = response

    def encode(self, frame: Frame) -> bytes:
        return event_block(frame)

    def write_now(self, frames: list[bytes]) -> bool:
        """The blocks as one HTTP chunk, straight into the transport: the same bytes
        `response.write` puts there, without its coroutine and its guard (needed only by a
        write that waits, and this one never does)."""
        response, transport = self._response, self._ready_transport()
        if transport is None or not (response.is_connected() and response.chunked):
            return False
        payload = b"".join(frames)
        transport.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        return True

    async def write(self, frames: list[bytes]) -> None:
        payload = b"".join(frames)
        self._in_socket(len(payload))  # `response.write` puts it there before any wait
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await self._response.write(payload)
        except ConnectionResetError:
            self._response.stop_streaming()
            raise
        except TimeoutError:
            self._response.stop_streaming()
            if self.transport is not None:
                self.transport.abort()
            raise ConnectionError(f"no write for {SEND_TIMEOUT_S:.0f} s") from None

    async def close(self, code: int) -> None:
        self._response.stop_streaming()

    def closing_bytes(self, code: int) -> bytes:
        """The chunked body's last chunk: an event stream has no close code."""
        return b"0\r\n\r\n" if self._response.chunked else b""


def event_block(frame: Frame) -> bytes:
    """One event. orjson escapes every line break, so the JSON is one `data:` line; the
    `id` is the `seq` (welcome's too: Last-Event-ID then covers what follows it)."""
    seq = frame.get("seq")
    id_line = b"" if seq is None else b"id: %d\r\n" % seq
    return b"%sevent: %s\r\ndata: %s\r\n\r\n" % (
        id_line,
        frame["type"].encode(),
        orjson.dumps(frame),
    )


def credentials(request: web.Request, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `token` and `device` a request presents (header, then body, then query), for
    `Identity.person`; shared by every HTTP endpoint a phone calls."""
    body = body or {}
    auth = request.headers.get("Authorization", "")
    token = auth[7:] if auth.startswith("Bearer ") else None
    return {
        "token": token or body.get("token") or request.query.get("token"),
        "device": request.headers.get("X-Stillhere-Device")
        or body.get("device")
        or request.query.get("device"),
    }


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _last_seq(request: web.Request) -> int | None:
    raw = request.headers.get("Last-Event-ID") or request.query.get("last_seq")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()):  # isdigit alone takes "²", which int() refuses
        raise ProtocolError("invalid_field", "Last-Event-ID / last_seq must be an integer")
    return int(raw)


async def events_handler(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER_KEY]
    try:
        last_seq = _last_seq(request)
    except ProtocolError as bad:
        return error_response(400, bad.code, bad.message)
    hello: dict[str, Any] = {
        "type": "hello",
        "v": 1,
        "conversation": request.query.get("conversation"),
        "last_seq": last_seq,
        **credentials(request),
    }
    try:  # refuse before the stream starts, so an EventSource does not retry forever
        server.identity.person(device=hello["device"], token=hello["token"])
        with address_slot(server, request):
            return await _stream(server, request, hello)
    except Unauthorized as refused:
        log.info("refused an event stream: %s", refused)
        return error_response(refused.status, refused.code, str(refused))
    except TooManyLinks as refused:
        return await refuse_link(refused)


async def _stream(
    server: Server, request: web.Request, hello: dict[str, Any]
) -> web.StreamResponse:
    response = EventSourceResponse()
    await response.prepare(request)
    link = EventStreamLink(request, response, server.settings.limits.link_buffer)
    server.links.add(link)
    session = Session(server, link)
    try:
        # Without `conversation`, Last-Event-ID refers to the conversation being resumed.
        await session.hello(hello, last_seq_alone=True)
        await response.wait()
    finally:
        session.close()
        await link.drain()
    return response


class _NoLink:
    """A POST has no link of its own: its answers go in the HTTP response."""

    name = "post"

    def send(self, frame: dict[str, Any]) -> None:
        raise AssertionError("a POST session never attaches to the stream")

    def flush(self) -> None:
        raise AssertionError("a POST session never attaches to the stream")

    def end(self, code: int = 1000) -> None:
        raise AssertionError("a POST session never attaches to the stream")


async def say_handler(request: web.Request) -> web.Response:
    return await _post(request, "say")


async def interrupt_handler(request: web.Request) -> web.Response:
    return await _post(request, "interrupt")


async def leave_handler(request: web.Request) -> web.Response:
    return await _post(request, "leave")


_STATUS = {
    "conversation_ended": 409,
    "rate_limited": 429,
    "internal_error": 503,
    "unavailable": 503,
    "storage_full": 503,
}


async def _post(request: web.Request, kind: str) -> web.Response:
    """Validate first, then identify, then act: bad input never opens a conversation."""
    server = request.app[SERVER_KEY]
    id_ = None
    try:
        body = await _body(request, server)
        frame = validate({**body, "type": kind}, server.settings.limits)
        id_ = frame.get("id")
        if kind == "say":
            check_conversation(frame)
        person = server.identity.person(**credentials(request, body))
        if not server.post_rates.allow(person):
            raise rate_limited()
        answer = await _perform(server, person, kind, frame)
    except orjson.JSONDecodeError:
        return error_response(400, "bad_json", "the body must be one JSON object")
    except Unauthorized as refused:
        return error_response(refused.status, refused.code, str(refused))
    except ProtocolError as bad:
        status = _STATUS.get(bad.code, 400)
        return error_response(status, bad.code, bad.message, bad.id or id_)
    return web.json_response(answer, dumps=dumps)


async def _body(request: web.Request, server: Server) -> dict[str, Any]:
    raw = await request.read()
    if len(raw) > server.settings.limits.max_frame_bytes:
        raise ProtocolError("frame_too_large", "the body is too large")
    body = orjson.loads(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise ProtocolError("bad_frame", "the body must be a JSON object")
    return body


async def _perform(server: Server, person: str, kind: str, frame: dict[str, Any]) -> dict[str, Any]:
    """A say opens the conversation if needed, unless it names the one it is for (its
    client's event stream's): then it goes there or nowhere. Interrupt and leave never
    start one."""
    directory = server.directory
    named = frame.get("conversation") if kind == "say" else None  # only a say names one
    opens = kind == "say" and named is None
    try:
        opened = await (directory.open(person) if opens else directory.resume(person))
    except Draining:
        raise ProtocolError("unavailable", "this node is stopping; send it again") from None
    if named is not None and (opened is None or str(opened.live.id) != named):
        ended = "this conversation has ended; reopen the event stream"
        raise ProtocolError("conversation_ended", ended, frame["id"])
    if opened is None:
        return {"type": "ack"} if kind == "interrupt" else {"type": "bye", "reason": "leave"}
    session = Session(server, _NoLink())
    session.live = opened.live
    if kind == "say":
        outcome = await session.say(frame)
        assert outcome.ack is not None
        return outcome.ack
    if kind == "interrupt":
        session.interrupt()
        return {"type": "ack"}
    await session.leave()
    return {"type": "bye", "reason": "leave"}
