"""A scripted OpenAI-compatible chat server, spoken to over real HTTP.

Tests of the model client and of the whole server need a model that answers exactly what
the test says, fails on cue, stalls on cue, and remembers what it was asked. A real socket
keeps the client's streaming, timeouts and error mapping under test too, which a mock of
the client would not.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.analysis_server import FakeAnalysis
from tests.fakes.http_fake import FakeApi


@dataclass(frozen=True, slots=True)
class Reply:
    """A successful streamed answer: text in chunks of `chunk` characters, then tool calls.

    `delay` is slept before every chunk so tests can observe streaming, or overlap a turn
    with something else.
    """

    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    chunk: int = 4
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Fail:
    """An HTTP error before any streaming starts."""

    status: int
    body: str = "overloaded"
    retry_after: str | None = None  # sent as the Retry-After header


@dataclass(frozen=True, slots=True)
class Empty:
    """A well-formed stream that carries nothing: the model said nothing at all."""


@dataclass(frozen=True, slots=True)
class Hang:
    """Accept the request and never answer, to exercise the client's read timeout."""


@dataclass(frozen=True, slots=True)
class Garbage:
    """A 200 stream whose data line is not JSON."""


@dataclass(frozen=True, slots=True)
class Cut:
    """A 200 stream that sends `text`, then drops the connection mid-answer."""

    text: str = "Let me think"


@dataclass(frozen=True, slots=True)
class Stall:
    """A 200 stream that sends `text`, then nothing more (the client's read timeout ends it)."""

    text: str = "Let me think"


@dataclass(frozen=True, slots=True)
class Endless:
    """A 200 stream that never stops sending words (until the client closes it)."""

    word: str = "more "


Response = Reply | Fail | Empty | Hang | Garbage | Cut | Stall | Endless


class FakeOpenAI(FakeApi["Response"]):
    """Serves `POST /v1/chat/completions` from a FIFO script of responses.

    Once the script runs out, `default` decides; without one, the fake echoes the last
    user message, so tests that do not care what the model says need not script it.
    """

    path = "/v1/chat/completions"

    def __init__(self, default: Callable[[dict[str, Any]], Response] | None = None) -> None:
        super().__init__()
        self.default = default
        self._call_ids = itertools.count(1)
        # The analysis model defaults to the chat model's URL: its non-streamed calls are
        # answered here without touching the chat script or `requests`.
        self.analysis = FakeAnalysis()

    @property
    def pending(self) -> int:
        """Scripted responses not consumed yet; a test can assert the model was called."""
        return len(self._script)

    def _next(self, body: dict[str, Any]) -> Response:
        if self._script:
            return self._script.popleft()
        if self.default is not None:
            return self.default(body)
        return Reply(f"echo: {_last_user_text(body)}")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if body.get("stream") is False:
            return await self.analysis.respond(body)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        response = self._next(body)
        if isinstance(response, Fail):
            headers = {"Retry-After": response.retry_after} if response.retry_after else None
            return web.Response(status=response.status, text=response.body, headers=headers)
        if isinstance(response, Hang):
            await self._stopping.wait()
            return web.Response(status=503, text="stopping")
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        try:
            if isinstance(response, Garbage):
                await stream.write(b"data: this is not json\n\n")
            elif isinstance(response, Stall):
                await self._stream_reply(stream, Reply(response.text), body.get("model", "fake"))
                await self._stopping.wait()
            elif isinstance(response, Endless):
                while True:
                    await self._stream_reply(stream, Reply(response.word * 50), "fake")
            elif isinstance(response, Cut):
                await self._stream_reply(stream, Reply(response.text), body.get("model", "fake"))
                assert request.transport is not None
                request.transport.abort()  # no final chunk: the answer breaks off
                return stream
            elif isinstance(response, Reply):
                await self._stream_reply(stream, response, body.get("model", "fake"))
            await stream.write(b"data: [DONE]\n\n")
            await stream.write_eof()
        except ConnectionError:
            # The client gave up (timeout, cancelled turn); nothing left to tell it.
            pass
        return stream

    async def _stream_reply(self, stream: web.StreamResponse, reply: Reply, model: str) -> None:
        async def send(delta: dict[str, Any], finish: str | None = None) -> None:
            if reply.delay:
                await asyncio.sleep(reply.delay)
            chunk = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            await stream.write(b"data: " + orjson.dumps(chunk) + b"\n\n")

        await send({"role": "assistant", "content": ""})
        size = max(1, reply.chunk)
        for start in range(0, len(reply.text), size):
            await send({"content": reply.text[start : start + size]})
        for index, (name, arguments) in enumerate(reply.tool_calls):
            # Split in two like real servers do, so the client must reassemble fragments.
            # A string is sent as it is: arguments that are not JSON, as a broken model sends.
            text = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
            half = len(text) // 2
            call_id = f"call_{next(self._call_ids)}"
            await send(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": text[:half]},
                        }
                    ]
                }
            )
            await send({"tool_calls": [{"index": index, "function": {"arguments": text[half:]}}]})
        await send({}, "tool_calls" if reply.tool_calls else "stop")


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                # The multi-part form: keep only its text parts.
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""
