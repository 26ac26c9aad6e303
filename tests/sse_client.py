"""A small server-sent-events client for `GET /v1/events` plus `POST /v1/...`, over aiohttp.

It parses the event stream the way a browser's EventSource does (`event:`, `id:`, `data:`
lines, a blank line ends an event, `:` lines are comments) and records every event it
receives, so tests can check order, ids and replay across reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

NO_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=10)


@dataclass(frozen=True, slots=True)
class Event:
    """One dispatched server-sent event."""

    event: str
    id: str | None
    data: dict[str, Any]

    @property
    def type(self) -> str:
        return self.data.get("type", "")

    @property
    def seq(self) -> int | None:
        return self.data.get("seq")


def credentials(how: str, secret: str) -> tuple[dict[str, str], dict[str, str]]:
    """(headers, query) presenting `secret` as a device (query or header) or a token."""
    if how == "query":
        return {}, {"device": secret}
    if how == "header":
        return {"X-Stillhere-Device": secret}, {}
    if how == "bearer":
        return {"Authorization": f"Bearer {secret}"}, {}
    if how == "token-query":
        return {}, {"token": secret}
    if how == "none":
        return {}, {}
    raise ValueError(how)


class EventStream:
    """One open `GET /v1/events` response, read by a background task.

    `stop_after`, if given, is checked on every event: once it matches, the reader records
    that event, then drops the connection at once, as a train tunnel would, without
    reading anything the server sent after it.
    """

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        stop_after: Callable[[Event], bool] | None = None,
    ) -> None:
        self.response = response
        self.events: list[Event] = []
        self.ended = asyncio.Event()  # the server ended the stream (EOF)
        self.dropped = asyncio.Event()  # we dropped it (stop_after or drop())
        self._stop_after = stop_after
        self._inbox: asyncio.Queue[Event] = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        fields: dict[str, str] = {}
        data: list[str] = []
        try:
            while True:
                raw = await self.response.content.readline()
                if not raw:
                    break
                line = raw.decode("utf-8").rstrip("\r\n")
                if line == "":
                    if data:
                        event = Event(
                            event=fields.get("event", "message"),
                            id=fields.get("id"),
                            data=orjson.loads("\n".join(data)),
                        )
                        self.events.append(event)
                        self._inbox.put_nowait(event)
                        if self._stop_after is not None and self._stop_after(event):
                            self._abort()
                            return
                    fields, data = {}, []
                    continue
                if line.startswith(":"):
                    continue  # a comment: the server's keep-alive ping
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data":
                    data.append(value)
                elif name in ("event", "id"):
                    fields[name] = value
        except (aiohttp.ClientError, ConnectionError):
            pass
        finally:
            if not self.dropped.is_set():
                self.ended.set()

    def _abort(self) -> None:
        self.dropped.set()
        connection = self.response.connection
        if connection is not None and connection.transport is not None:
            connection.transport.abort()
        self.response.close()

    async def next(self, timeout: float = 10.0) -> Event:
        async with asyncio.timeout(timeout):
            return await self._inbox.get()

    async def expect(
        self, type_: str, match: Callable[[Event], bool] | None = None, timeout: float = 10.0
    ) -> Event:
        """The next event of this type (and matching), skipping others."""
        async with asyncio.timeout(timeout):
            while True:
                event = await self._inbox.get()
                if event.type == type_ and (match is None or match(event)):
                    return event

    async def wait_dropped(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            await self.dropped.wait()
        await self._stop_reader()

    async def wait_ended(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            await self.ended.wait()

    async def drop(self) -> None:
        """The link dies without goodbye: abort the TCP connection."""
        self._abort()
        await self._stop_reader()

    async def close(self) -> None:
        if not self._reader.done():
            self._abort()
        await self._stop_reader()

    async def _stop_reader(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    @property
    def last_id(self) -> str | None:
        return next((e.id for e in reversed(self.events) if e.id is not None), None)


class SseClient:
    """A person's SSE client: opens event streams and POSTs, with one set of credentials."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        url: Callable[[str], str],
        secret: str | None = None,
        how: str = "query",
    ) -> None:
        self.http = http
        self.url = url
        self.secret = secret or "device-" + uuid.uuid4().hex
        self.how = how
        self.streams: list[EventStream] = []

    async def open(
        self,
        *,
        last_event_id: str | None = None,
        conversation: str | None = None,
        how: str | None = None,
        stop_after: Callable[[Event], bool] | None = None,
    ) -> EventStream:
        headers, query = credentials(how or self.how, self.secret)
        headers = {"Accept": "text/event-stream", **headers}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        if conversation is not None:
            query["conversation"] = conversation
        response = await self.http.get(
            self.url("/v1/events"), headers=headers, params=query, timeout=NO_TIMEOUT
        )
        stream = EventStream(response, stop_after)
        self.streams.append(stream)
        return stream

    async def post(
        self, path: str, body: Any = None, *, how: str | None = None, raw: bytes | None = None
    ) -> tuple[int, dict[str, Any]]:
        """POST a JSON body (or raw bytes); the status and the JSON answer."""
        headers, query = credentials(how or self.how, self.secret)
        data = raw if raw is not None else orjson.dumps(body if body is not None else {})
        headers = {"Content-Type": "application/json", **headers}
        async with self.http.post(
            self.url(path), data=data, headers=headers, params=query
        ) as response:
            return response.status, orjson.loads(await response.read())

    async def say(
        self, text: str, id_: str | None = None, *, conversation: str | None = None
    ) -> dict[str, Any]:
        """Say something (to `conversation` only, if named); the ack the POST answers with."""
        id_ = id_ or uuid.uuid4().hex
        body = {"id": id_, "text": text}
        if conversation is not None:
            body["conversation"] = conversation
        status, answer = await self.post("/v1/say", body)
        assert status == 200, (status, answer)
        return answer

    async def close(self) -> None:
        for stream in self.streams:
            await stream.close()
