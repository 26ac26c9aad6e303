"""A chat model reached over the OpenAI chat completions API.

The same wire format is spoken by OpenAI, Ollama, vLLM and llama.cpp, so one adapter
covers hosted and local models alike. Replies are always streamed: the phone should see
text as it is written, and a long silence on the socket is the only reliable sign that a
local model has stalled.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from providers.chat import ChatEvent, ChatMessage, ModelError, TextDelta, ToolCall, ToolSpec
from providers.http import BODY_EXCERPT, ApiClient, excerpt


class OpenAIChat:
    """A `ChatModel` backed by any OpenAI-compatible `/chat/completions` endpoint."""

    def __init__(
        self,
        url: str,
        model: str,
        key: str | None = None,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
    ) -> None:
        self.label = f"openai-compatible {model} at {url}"
        self._model = model
        # No total timeout: a long answer may legitimately stream for minutes. What must
        # not happen is a silent socket, which sock_read catches between any two reads.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self._api = ApiClient(f"{url.rstrip('/')}/chat/completions", key, timeout)

    async def close(self) -> None:
        await self._api.close()

    async def stream(
        self, messages: list[ChatMessage], tools: list[ToolSpec]
    ) -> AsyncGenerator[ChatEvent, None]:
        body: dict[str, Any] = {
            "model": self._model,
            "stream": True,
            "messages": [_message_to_wire(m) for m in messages],
        }
        if tools:
            # Some servers reject an empty tools list, so the key is left out entirely.
            body["tools"] = [_tool_to_wire(t) for t in tools]
        api = self._api
        with api.network_failures(ModelError):
            async with api.session().post(
                api.endpoint, data=orjson.dumps(body), headers=api.headers("text/event-stream")
            ) as response:
                if not 200 <= response.status < 300:
                    failure = api.http_error(ModelError, response.status, await response.read())
                    failure.retry_after = _seconds(response.headers.get("Retry-After"))
                    raise failure
                calls = _ToolCallAssembler()
                with api.answer_cut(ModelError):
                    async for payload in _sse_data(response):
                        for event in self._parse_chunk(payload, calls):
                            yield event
                for call in calls.finish():
                    yield call

    def _parse_chunk(self, payload: bytes, calls: _ToolCallAssembler) -> list[ChatEvent]:
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise ModelError(
                "bad_response", self._api.scrub(f"stream data is not JSON: {excerpt(payload)}")
            ) from None
        if not isinstance(chunk, dict):
            raise ModelError(
                "bad_response", self._api.scrub(f"stream data is not an object: {excerpt(payload)}")
            )
        if chunk.get("error"):
            # Servers that fail after the 200 has been sent can only say so in the stream.
            raise ModelError(
                "bad_response", self._api.scrub(f"model reported an error: {excerpt(payload)}")
            )
        events: list[ChatEvent] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            content = delta.get("content")
            if isinstance(content, str) and content:
                events.append(TextDelta(content))
            for fragment in delta.get("tool_calls") or []:
                if isinstance(fragment, dict):
                    calls.add(fragment)
        return events


@dataclass(slots=True)
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _ToolCallAssembler:
    """Collects tool call fragments, which arrive split across many stream chunks."""

    def __init__(self) -> None:
        self._calls: dict[int, _PartialCall] = {}

    def add(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index")
        if not isinstance(index, int):
            # Servers that omit the index send each call whole, so a new id means a new call.
            fid = fragment.get("id")
            last = max(self._calls, default=-1)
            new = last < 0 or (fid and self._calls[last].id and self._calls[last].id != fid)
            index = last + 1 if new else last
        call = self._calls.setdefault(index, _PartialCall())
        call.id = _joined(call.id, fragment.get("id"))
        function = fragment.get("function")
        if isinstance(function, dict):
            call.name = _joined(call.name, function.get("name"))
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call.arguments.append(arguments)
            elif isinstance(arguments, dict):
                # Some local servers send the arguments already decoded.
                call.arguments.append(orjson.dumps(arguments).decode())

    def finish(self) -> list[ToolCall]:
        calls = []
        for index in sorted(self._calls):
            partial = self._calls[index]
            if not partial.name:
                raise ModelError("bad_response", f"tool call {index} has no function name")
            text = "".join(partial.arguments)
            try:
                arguments = orjson.loads(text) if text.strip() else {}
            except orjson.JSONDecodeError:
                raise ModelError(
                    "bad_response",
                    f"arguments of tool call {partial.name} are not JSON: {text[:BODY_EXCERPT]}",
                ) from None
            if not isinstance(arguments, dict):
                raise ModelError(
                    "bad_response",
                    f"arguments of tool call {partial.name} are not an object: "
                    f"{text[:BODY_EXCERPT]}",
                )
            # The id is echoed back with the tool result; invent one if the server did not.
            calls.append(ToolCall(partial.id or f"call_{index}", partial.name, arguments))
        return calls


def _joined(sofar: str, fragment: object) -> str:
    """Extend an id or name with its next fragment.

    OpenAI sends them once, but some servers split them and others repeat them whole in
    every chunk; a repeat must not double the name.
    """
    if not isinstance(fragment, str) or not fragment or fragment == sofar:
        return sofar
    return sofar + fragment


async def _sse_data(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """Yield the payload of each `data:` line until `[DONE]` or the end of the body.

    Lines are split by hand rather than with `readline`, which refuses lines longer than
    its buffer, and a tool call's arguments may well arrive as one long line.
    """
    buffer = b""
    seen_data = False
    async for chunk in response.content.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            payload = _data_of(line)
            if payload is None:
                continue
            if payload == b"[DONE]":
                return
            seen_data = True
            yield payload
    payload = _data_of(buffer)
    if payload is not None and payload != b"[DONE]":
        seen_data = True
        yield payload
    if not seen_data:
        # A server that ignored `stream: true` answers one JSON document; reading it as an
        # empty reply would silently lose the answer.
        raise ModelError("bad_response", "the answer was not an event stream")


def _seconds(header: str | None) -> float | None:
    """A `Retry-After` in seconds; an HTTP date or anything else is taken as unsaid."""
    try:
        return max(0.0, float(header)) if header is not None else None
    except ValueError:
        return None


def _data_of(line: bytes) -> bytes | None:
    """The payload of an SSE `data:` line; None for comments, other fields and blanks."""
    line = line.rstrip(b"\r")
    if not line.startswith(b"data:"):
        return None
    payload = line[5:]
    return payload[1:] if payload.startswith(b" ") else payload


def _message_to_wire(message: ChatMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": orjson.dumps(call.arguments).decode()},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    return wire


def _tool_to_wire(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }
