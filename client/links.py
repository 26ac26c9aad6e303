"""One link to the server, over WebSocket or over SSE + POST, behind one small interface.

A link lives from one connection attempt to the moment it ends; the phone makes a new one
for every reconnect. Keeping the two transports behind the same methods (`open`, `frames`,
`say`, ...) is what lets the phone's reconnect, replay and outbox logic be written once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import struct
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import orjson

from client.sse_parser import SseParser

log = logging.getLogger("stillhere.client")

Frame = dict[str, Any]

CLOSE_TIMEOUT_S = 2.0
POST_TIMEOUT_S = 10.0
SAY_FAILURES_TO_KEEP = frozenset({401, 429})  # retried; so is any 5xx or network error


class Refused(Exception):
    """The server refused our credentials: retrying with the same ones cannot help."""

    def __init__(self, frame: Frame) -> None:
        super().__init__(frame.get("message", "unauthorized"))
        self.frame = frame


class LinkFailed(Exception):
    """The link could not be set up (closed before welcome, unexpected answer)."""


class Transient(Exception):
    """A client frame could not be delivered now; keep it and send it again later."""


@dataclass(slots=True)
class Credentials:
    """The person: a device secret, an account token, or both (the token wins); and the
    routing key the server gave last (`welcome`'s `route`), sent on every request as `r` so
    that a load balancer sends the person to the node that has their conversation."""

    device: str | None = None
    token: str | None = None
    route: str | None = None

    def hello(self) -> Frame:
        fields: Frame = {}
        if self.token:
            fields["token"] = self.token
        if self.device:
            fields["device"] = self.device
        return fields

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.device:
            headers["X-Stillhere-Device"] = self.device
        return headers


def verifying(ca_file: str | os.PathLike[str] | None = None) -> ssl.SSLContext | bool:
    """How `https://` and `wss://` links check the server: against `ca_file` (a private CA,
    a test's) when given, else the system's certificate authorities (aiohttp's `True`).
    Never unchecked: a phone that skips verification talks to whoever answers."""
    return True if ca_file is None else ssl.create_default_context(cafile=os.fspath(ca_file))


def endpoint(base_url: str, path: str, creds: Credentials) -> str:
    url = base_url.rstrip("/") + path
    return url if creds.route is None else f"{url}?{urlencode({'r': creds.route})}"


def _loads(raw: str | bytes) -> Frame | None:
    """A server frame, or None for anything that is not a JSON object (ignored)."""
    try:
        frame = orjson.loads(raw)
    except orjson.JSONDecodeError:
        log.debug("ignored a frame that is not JSON: %.80r", raw)
        return None
    return frame if isinstance(frame, dict) and isinstance(frame.get("type"), str) else None


def _transport(response: aiohttp.ClientResponse | None) -> asyncio.Transport | None:
    connection = response.connection if response is not None else None
    return connection.transport if connection is not None else None


def _abort(response: aiohttp.ClientResponse | None) -> None:
    """Drop the TCP connection under a response at once: no close handshake, no FIN."""
    if response is None:
        return
    transport = _transport(response)
    if transport is not None:
        transport.abort()
    response.close()


class HeldConnection:
    """A link's TCP connection, kept open after the link was dropped: as in a real tunnel,
    the server hears nothing (no FIN, no reset, no pong) until `reset()`."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    def of(cls, response: aiohttp.ClientResponse | None) -> HeldConnection | None:
        """A second handle on the connection under `response`: aborting the link then
        closes only the link's own, and the connection stays up, unread and unwritten."""
        transport = _transport(response)
        raw = transport.get_extra_info("socket") if transport is not None else None
        return None if raw is None else cls(socket.socket(fileno=os.dup(raw.fileno())))

    def reset(self) -> None:
        """End it with a reset, as the phone's stack answers the server's next packet once
        the tunnel is over (the app forgot the connection when it dropped it)."""
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._sock.close()


class Posts:
    """`POST /v1/say|interrupt|leave`: the client frames of SSE, and the leave of last resort.

    POSTs need no open stream, so a phone can end its conversation (leave) even when its
    WebSocket is gone; `POST /v1/leave` never starts a conversation, so it is safe to send
    when we do not know whether the leave frame got through.
    """

    def __init__(self, http: aiohttp.ClientSession, base_url: str, creds: Credentials) -> None:
        self._http = http
        self._base_url = base_url
        self._creds = creds

    async def post(self, path: str, body: Frame) -> tuple[int, Frame]:
        """The status and JSON answer; Transient for network errors."""
        headers = {"Content-Type": "application/json", **self._creds.headers()}
        try:
            async with self._http.post(
                endpoint(self._base_url, path, self._creds),
                data=orjson.dumps(body),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=POST_TIMEOUT_S),
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, OSError, TimeoutError) as failed:
            raise Transient(f"POST {path}: {failed!r}") from failed
        answer = _loads(raw)
        if answer is None:
            text = raw[:200].decode("utf-8", errors="replace")
            answer = {"type": "error", "code": f"http_{status}", "message": text}
        return status, answer

    async def say(self, id_: str, text: str, conversation: str | None) -> Frame:
        """The ack, or an error frame the say can never get past as sent (kept: Transient).

        The say names the `conversation` its stream is attached to, and goes there or
        nowhere: once that has ended the answer is 409 `conversation_ended`, and the stream
        must be reopened (a retry would open a conversation the stream is not attached to)."""
        body = {"id": id_, "text": text, "conversation": conversation}
        status, answer = await self.post("/v1/say", body)
        if status == 200 and answer.get("type") == "ack":
            return answer
        if status in SAY_FAILURES_TO_KEEP or status >= 500:
            raise Transient(f"say {id_}: HTTP {status} {answer.get('code')}")
        return {**answer, "id": answer.get("id", id_)}  # 409: the link must go; 400, 413: refused

    async def interrupt(self) -> None:
        status, answer = await self.post("/v1/interrupt", {})
        if status != 200:
            raise Transient(f"interrupt: HTTP {status} {answer.get('code')}")

    async def leave(self) -> Frame:
        """The `bye` the server answers with."""
        status, answer = await self.post("/v1/leave", {})
        if status != 200 or answer.get("type") != "bye":
            raise Transient(f"leave: HTTP {status} {answer.get('code')}")
        return answer


class Link(ABC):
    """One connection: `open` (hello -> welcome), then `frames` until it ends."""

    kind: str = "link"

    def __init__(self, http: aiohttp.ClientSession, base_url: str, creds: Credentials) -> None:
        self.http = http
        self.base_url = base_url
        self.creds = creds

    @abstractmethod
    async def open(self, conversation: str | None, last_seq: int) -> Frame:
        """Connect and identify; the welcome. Refused, LinkFailed or a network error."""

    @abstractmethod
    def frames(self) -> AsyncIterator[Frame]:
        """Server frames after the welcome, in order, until the link ends."""

    @abstractmethod
    async def say(self, id_: str, text: str) -> Frame | None:
        """Send a say. The answer if the transport gives one at once (SSE: ack or a refusal),
        None if it comes on the link (WebSocket). Transient if it did not go out."""

    @abstractmethod
    async def interrupt(self) -> None: ...

    @abstractmethod
    async def confirm(self, seq: int) -> None:
        """Tell the server we have every event up to `seq`, so it can let them go."""

    @abstractmethod
    async def leave(self) -> Frame | None:
        """Ask to end the conversation: the bye if the answer is immediate, else None."""

    @abstractmethod
    def _response(self) -> aiohttp.ClientResponse | None:
        """The response whose connection carries the link (the stream, for SSE)."""

    def abort(self) -> None:
        """Cut the connection under the link now (no close handshake)."""
        _abort(self._response())

    def hold(self) -> HeldConnection | None:
        """Keep the connection under the link open past an `abort`, silent, as a tunnel."""
        return HeldConnection.of(self._response())

    @abstractmethod
    async def close(self) -> None:
        """Close politely (the app goes away; the conversation stays resumable)."""


class WebSocketLink(Link):
    """`GET /v1/ws`: JSON text frames both ways; the hello carries the credentials."""

    kind = "ws"

    def __init__(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        creds: Credentials,
        *,
        heartbeat: float | None = 20.0,
    ) -> None:
        super().__init__(http, base_url, creds)
        self._heartbeat = heartbeat
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    async def open(self, conversation: str | None, last_seq: int) -> Frame:
        # The client's ping/pong heartbeat notices a dead link that never says so (a real
        # tunnel sends no RST): no pong within heartbeat / 2 closes the WebSocket.
        self._ws = await self.http.ws_connect(
            endpoint(self.base_url, "/v1/ws", self.creds), heartbeat=self._heartbeat, autoping=True
        )
        hello: Frame = {"type": "hello", "v": 1, **self.creds.hello()}
        if conversation is not None:
            hello["conversation"] = conversation
            hello["last_seq"] = last_seq
        await self._send(hello)
        while (frame := await self._receive()) is not None:
            if frame["type"] == "welcome":
                return frame
            if frame["type"] == "error":
                if frame.get("code") == "unauthorized":
                    raise Refused(frame)
                raise LinkFailed(f"hello refused: {frame.get('code')} {frame.get('message')}")
        raise LinkFailed("the WebSocket closed before welcome")

    async def frames(self) -> AsyncIterator[Frame]:
        while (frame := await self._receive()) is not None:
            yield frame

    async def _receive(self) -> Frame | None:
        assert self._ws is not None
        while True:
            message = await self._ws.receive()
            if message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                frame = _loads(message.data)
                if frame is not None:
                    return frame
            elif message.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSING,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.ERROR,
            ):
                log.debug("ws link ended: %s %r", message.type.name, message.data)
                return None

    async def _send(self, frame: Frame) -> None:
        ws = self._ws
        if ws is None or ws.closed:
            raise Transient("the WebSocket is closed")
        try:
            await ws.send_str(orjson.dumps(frame).decode())
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as failed:
            raise Transient(f"send failed: {failed!r}") from failed

    async def say(self, id_: str, text: str) -> Frame | None:
        await self._send({"type": "say", "id": id_, "text": text})
        return None

    async def interrupt(self) -> None:
        await self._send({"type": "interrupt"})

    async def confirm(self, seq: int) -> None:
        await self._send({"type": "ack", "seq": seq})

    async def leave(self) -> Frame | None:
        await self._send({"type": "leave"})
        return None

    def _response(self) -> aiohttp.ClientResponse | None:
        # aiohttp keeps the upgraded connection on the handshake's response
        return self._ws._response if self._ws is not None else None

    async def close(self) -> None:
        if self._ws is None:
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._ws.close()
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            self.abort()


class EventStreamLink(Link):
    """`GET /v1/events` for server frames, `POST /v1/...` for client frames.

    The resume point travels as `conversation` (query) and `Last-Event-ID` (header), as a
    reconnecting EventSource would send it; credentials go in headers, never the URL.
    """

    kind = "sse"

    def __init__(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        creds: Credentials,
        *,
        read_timeout: float | None = 45.0,
    ) -> None:
        super().__init__(http, base_url, creds)
        self.posts = Posts(http, base_url, creds)
        self._read_timeout = read_timeout  # the server pings every 15 s: silence is death
        self._stream: aiohttp.ClientResponse | None = None
        self._parser = SseParser()
        self._pending: deque[Frame] = deque()
        self._conversation: str | None = None  # the welcome's: every say is for it

    async def open(self, conversation: str | None, last_seq: int) -> Frame:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        headers.update(self.creds.headers())
        params: dict[str, str] = {}
        if conversation is not None:
            params["conversation"] = conversation
            headers["Last-Event-ID"] = str(last_seq)
        self._stream = response = await self.http.get(
            endpoint(self.base_url, "/v1/events", self.creds),
            headers=headers,
            params=params,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=self._read_timeout),
        )
        if response.status != 200:
            answer = _loads(await response.read()) or {}
            response.release()
            if response.status == 401:
                refusal = {"type": "error", "code": "unauthorized", "message": "refused"}
                raise Refused({**refusal, **answer})
            raise LinkFailed(f"GET /v1/events: HTTP {response.status} {answer.get('code')}")
        first = await self._next()
        if first is None:
            raise LinkFailed("the event stream ended before welcome")
        if first["type"] != "welcome":
            raise LinkFailed(f"the event stream began with {first['type']}, not welcome")
        self._conversation = first.get("conversation")
        return first

    async def _next(self) -> Frame | None:
        assert self._stream is not None
        while not self._pending:
            chunk = await self._stream.content.readany()
            if not chunk:
                return None
            for event in self._parser.feed(chunk):
                frame = _loads(event.data)
                if frame is not None:
                    self._pending.append(frame)
        return self._pending.popleft()

    async def frames(self) -> AsyncIterator[Frame]:
        while (frame := await self._next()) is not None:
            yield frame
        log.debug("the event stream ended")

    async def say(self, id_: str, text: str) -> Frame | None:
        return await self.posts.say(id_, text, self._conversation)

    async def interrupt(self) -> None:
        await self.posts.interrupt()

    async def confirm(self, seq: int) -> None:
        """No frame for it over SSE: the next hello's Last-Event-ID says it."""

    async def leave(self) -> Frame | None:
        return await self.posts.leave()

    def _response(self) -> aiohttp.ClientResponse | None:
        return self._stream

    async def close(self) -> None:
        # An event stream has no close handshake: closing the connection is the goodbye.
        if self._stream is not None:
            self._stream.close()
