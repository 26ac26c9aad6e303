"""OpenAIChat against a fake OpenAI-compatible server over real HTTP."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from providers.chat import ChatEvent, ChatMessage, ModelError, TextDelta, ToolCall, ToolSpec
from providers.openai import OpenAIChat
from tests.fakes.openai_server import Empty, Fail, FakeOpenAI, Garbage, Hang, Reply

KEY = "sk-test-secret-0123456789"

WEATHER = ToolSpec(
    name="weather",
    description="Current weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def model(fake: FakeOpenAI) -> AsyncIterator[OpenAIChat]:
    chat = OpenAIChat(fake.url, "test-model", KEY)
    yield chat
    await chat.close()


async def collect(
    chat: OpenAIChat, text: str = "hello", tools: list[ToolSpec] | None = None
) -> list[ChatEvent]:
    return [e async for e in chat.stream([ChatMessage("user", text)], tools or [])]


def joined(events: list[ChatEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def failure(chat: OpenAIChat) -> ModelError:
    with pytest.raises(ModelError) as info:
        await collect(chat)
    return info.value


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_label_names_model_and_url() -> None:
    chat = OpenAIChat("http://127.0.0.1:11434/v1", "llama3")
    assert chat.label == "openai-compatible llama3 at http://127.0.0.1:11434/v1"
    await chat.close()


async def test_text_arrives_as_several_deltas(fake: FakeOpenAI, model: OpenAIChat) -> None:
    fake.queue(Reply("The quick brown fox jumps.", chunk=5))
    events = await collect(model)
    assert all(isinstance(e, TextDelta) for e in events)
    assert len(events) == 6
    assert joined(events) == "The quick brown fox jumps."


async def test_unscripted_requests_echo_the_user(fake: FakeOpenAI, model: OpenAIChat) -> None:
    assert joined(await collect(model, "are you there?")) == "echo: are you there?"


async def test_script_is_consumed_in_order_then_default(fake: FakeOpenAI) -> None:
    fake.default = lambda body: Reply(f"default for {body['model']}")
    fake.queue(Reply("first"), Reply("second"))
    chat = OpenAIChat(fake.url, "m")
    try:
        answers = [joined(await collect(chat)) for _ in range(3)]
    finally:
        await chat.close()
    assert answers == ["first", "second", "default for m"]
    assert fake.pending == 0
    assert len(fake.requests) == 3


async def test_tool_calls_are_assembled_from_fragments(fake: FakeOpenAI, model: OpenAIChat) -> None:
    fake.queue(
        Reply(
            "Let me check.",
            tool_calls=[("weather", {"city": "Lyon", "days": 3}), ("clock", {})],
        )
    )
    events = await collect(model, tools=[WEATHER])
    assert joined(events) == "Let me check."
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.name, c.arguments) for c in calls] == [
        ("weather", {"city": "Lyon", "days": 3}),
        ("clock", {}),
    ]
    assert calls[0].id and calls[1].id and calls[0].id != calls[1].id
    # Tool calls come whole, after all the text.
    assert isinstance(events[-1], ToolCall) and isinstance(events[-2], ToolCall)


async def test_empty_stream_yields_nothing(fake: FakeOpenAI, model: OpenAIChat) -> None:
    fake.queue(Empty())
    assert await collect(model) == []


async def test_messages_and_tools_are_sent_in_openai_format(
    fake: FakeOpenAI, model: OpenAIChat
) -> None:
    call = ToolCall("call_7", "weather", {"city": "Lyon"})
    history = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather in Lyon?"),
        ChatMessage("assistant", "", tool_calls=[call]),
        ChatMessage("tool", '{"temp": 21}', tool_call_id="call_7"),
    ]
    events = [e async for e in model.stream(history, [WEATHER])]
    assert joined(events) == "echo: Weather in Lyon?"

    body = fake.requests[-1]
    assert body["model"] == "test-model"
    assert body["stream"] is True
    assert body["messages"][:2] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Lyon?"},
    ]
    assistant = body["messages"][2]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"] == [
        {
            "id": "call_7",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city":"Lyon"}'},
        }
    ]
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_7",
        "content": '{"temp": 21}',
    }
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Current weather in a city.",
                "parameters": WEATHER.parameters,
            },
        }
    ]
    assert fake.headers[-1]["Authorization"] == f"Bearer {KEY}"


async def test_no_tools_key_and_no_auth_without_them(fake: FakeOpenAI) -> None:
    chat = OpenAIChat(fake.url + "/", "m")
    try:
        await collect(chat)
    finally:
        await chat.close()
    assert "tools" not in fake.requests[-1]
    assert "Authorization" not in fake.headers[-1]


async def test_http_error_has_status_code_and_body(fake: FakeOpenAI, model: OpenAIChat) -> None:
    fake.queue(Fail(500, "overloaded, try later " + "x" * 500))
    error = await failure(model)
    assert error.code == "http_500"
    assert "overloaded, try later" in str(error)
    assert "x" * 201 not in str(error)


async def test_hang_times_out_and_stop_does_not_hang() -> None:
    fake = FakeOpenAI()
    await fake.start()
    fake.queue(Hang())
    chat = OpenAIChat(fake.url, "m", KEY, read_timeout=0.2)
    try:
        error = await failure(chat)
        assert error.code == "timeout"
    finally:
        await chat.close()
        await asyncio.wait_for(fake.stop(), 30)  # a hung request must not hold the server


async def test_stall_after_headers_times_out(fake: FakeOpenAI) -> None:
    fake.queue(Reply("slow words", chunk=2, delay=0.5))
    chat = OpenAIChat(fake.url, "m", read_timeout=0.2)
    received: list[ChatEvent] = []
    try:
        with pytest.raises(ModelError) as info:
            async for event in chat.stream([ChatMessage("user", "hi")], []):
                received.append(event)
    finally:
        await chat.close()
    assert info.value.code == "timeout"
    assert received == []  # the first chunk itself came too late


async def test_refused_connection() -> None:
    chat = OpenAIChat(f"http://127.0.0.1:{closed_port()}/v1", "m", KEY)
    try:
        error = await failure(chat)
    finally:
        await chat.close()
    assert error.code == "connect"


async def test_garbage_is_a_bad_response(fake: FakeOpenAI, model: OpenAIChat) -> None:
    fake.queue(Garbage())
    assert (await failure(model)).code == "bad_response"


async def test_non_object_tool_arguments_are_a_bad_response(
    fake: FakeOpenAI, model: OpenAIChat
) -> None:
    # Arguments that are valid JSON but not an object cannot be passed to a tool.
    fake.queue(Reply("", tool_calls=[("weather", [1, 2])]))  # type: ignore[list-item]
    assert (await failure(model)).code == "bad_response"


@pytest.mark.parametrize(
    "response",
    [Fail(401, f"Incorrect API key provided: {KEY}"), Fail(500), Hang(), Garbage(), None],
    ids=["http_401", "http_500", "timeout", "bad_response", "connect"],
)
async def test_key_never_appears_in_errors(fake: FakeOpenAI, response: Any) -> None:
    url = fake.url if response is not None else f"http://127.0.0.1:{closed_port()}/v1"
    if response is not None:
        fake.queue(response)
    chat = OpenAIChat(url, "m", KEY, read_timeout=0.2)
    try:
        error = await failure(chat)
    finally:
        await chat.close()
    assert KEY not in str(error)
    assert KEY not in repr(error.args)


async def test_session_is_reused_and_recreated_after_close(fake: FakeOpenAI) -> None:
    chat = OpenAIChat(fake.url, "m")
    await collect(chat)
    await collect(chat)
    await chat.close()
    assert joined(await collect(chat, "again")) == "echo: again"
    await chat.close()
    await chat.close()  # closing twice is harmless


async def test_abandoned_stream_releases_the_connection(fake: FakeOpenAI) -> None:
    fake.queue(Reply("a long answer that nobody reads to the end", chunk=1, delay=0.01))
    chat = OpenAIChat(fake.url, "m")
    try:
        stream = chat.stream([ChatMessage("user", "hi")], [])
        first = await anext(stream)
        assert first == TextDelta("a")
        await stream.aclose()  # type: ignore[attr-defined]
        await asyncio.sleep(0)
        assert joined(await collect(chat, "next")) == "echo: next"
    finally:
        await chat.close()
