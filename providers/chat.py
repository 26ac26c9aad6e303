"""The chat model port: what a turn needs from any model, remote or rehearsal.

A model call is an async stream of events. Text arrives as deltas so the reply can be
streamed to the phone as it is written; tool calls arrive whole, once their arguments are
complete, because a half-parsed tool call cannot be executed.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(slots=True)
class ChatMessage:
    """One message of the OpenAI chat format (system, user, assistant or tool)."""

    role: str
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


ChatEvent = TextDelta | ToolCall


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model, described by a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


class ModelError(Exception):
    """The model could not be reached or answered something unusable.

    `code` is stable and short (`timeout`, `http_429`, `bad_response`, ...) so logs and
    clients can tell failures apart without parsing the message. `retry_after` is the wait
    in seconds the model asked for (a 429's or 503's `Retry-After`), if it said.
    """

    def __init__(self, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.retry_after = retry_after


class ChatModel(Protocol):
    """Anything that can answer a list of messages, possibly calling tools."""

    label: str

    def stream(
        self, messages: list[ChatMessage], tools: list[ToolSpec]
    ) -> AsyncGenerator[ChatEvent, None]: ...

    async def close(self) -> None: ...
