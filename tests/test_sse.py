"""The SSE transport: `GET /v1/events` carries the stream, `POST /v1/...` the client's frames.

The same train tunnel as over WebSocket: the event stream dies, the conversation does not,
and `Last-Event-ID` brings back exactly what was missed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.conftest import Harness
from tests.sse_client import Event, EventStream, SseClient

OWEN = "Note that Owen arrives Friday evening, he is staying with us."
SPARE_BED = "And remind me to get the spare bed out on Thursday."
STORY = "tell me a story about trains"


@pytest.fixture
async def client(harness: Harness) -> AsyncIterator[SseClient]:
    sse = SseClient(harness.http, harness.url)
    yield sse
    await sse.close()


async def welcome_of(stream: EventStream) -> Event:
    """The stream's first event, which must be the welcome."""
    first = await stream.next()
    assert first.event == "welcome", first
    assert first.type == "welcome"
    return first


def numbered(events: list[Event]) -> list[Event]:
    """The events that belong to the conversation's stream (all but welcome carry seq)."""
    return [e for e in events if e.type != "welcome" and e.seq is not None]


def assert_consecutive(seqs: list[int]) -> None:
    assert seqs, "no numbered events"
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs


async def test_train_tunnel_story_over_sse(harness: Harness, client: SseClient) -> None:
    await harness.start()
    first = await client.open()
    welcome = await welcome_of(first)
    assert welcome.data["resumed"] is False
    assert welcome.id is None
    conversation = welcome.data["conversation"]

    ack = await client.say(OWEN, "say-owen")
    assert ack["type"] == "ack"
    assert ack["id"] == "say-owen"
    assert isinstance(ack["seq"], int)
    on_stream = await first.expect("ack")
    assert on_stream.data == ack
    card = await first.expect("card")
    assert "Owen arrives Friday evening" in card.data["card"]["text"]
    await first.expect("reply.end")
    await first.stream_closed_check() if False else None  # noqa: SIM108 (placeholder removed)
