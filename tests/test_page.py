"""`page` events: what should not become a memory (weather, opening hours, traffic) goes to
the phone as a page, through the `show_page` tool, and is never stored as a memory.

The model is the fake OpenAI-compatible server over real HTTP, so the real client parses the
tool call, the real turn pipeline runs it, and the phone sees it on its stream.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson
import pytest

from actors.tools import BadArgument, page
from tests.conftest import Harness
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.sse_client import SseClient

PAGE_EVENT = "SELECT frame FROM events WHERE frame->>'type' = 'page'"
WEATHER = {"title": "Bristol weather", "body": "Sunny, 21 °C, a light westerly wind."}


def tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool results a model call was handed, decoded."""
    return [orjson.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]


async def test_a_page_reaches_the_phone_and_is_never_a_memory(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply(tool_calls=[("show_page", WEATHER)]), Reply("Sunny in Bristol."))
    phone = await harness.phone()
    await phone.say("What's the weather like in Bristol?")
    shown = await phone.expect("page")
    end = await phone.reply()

    start = next(f for f in phone.frames if f["type"] == "reply.start")
    assert shown == {"type": "page", "seq": shown["seq"], "page": WEATHER}
    assert start["seq"] < shown["seq"] < end["seq"]
    assert end["text"] == "Sunny in Bristol."
    assert not [f for f in phone.frames if f["type"] == "card"]
    assert await db.fetchval("SELECT count(*) FROM cards") == 0
    assert await db.fetchval("SELECT count(*) FROM memory_generations") == 0
    # The model is told it was shown, and that nothing was stored.
    assert tool_results(fake_llm.requests[1]) == [
        {"shown": True, "note": "Shown on the phone as a page; not stored as a memory."}
    ]
    # The tool is offered to the model, saying what it is for.
    offered = {t["function"]["name"]: t for t in fake_llm.requests[0]["tools"]}
    assert "weather" in offered["show_page"]["function"]["description"]


async def test_a_page_is_replayed_to_a_phone_that_missed_it(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply(tool_calls=[("show_page", WEATHER)]), Reply("Sunny."))
    phone = await harness.phone()
    ack = await phone.say("Weather in Bristol?")
    shown = await phone.expect("page")
    await phone.reply()
    await phone.close()

    # Back through another link: the page is replayed with its seq, and it is stored with
    # the turn-level events, so a replay after a restart carries it too.
    again = await harness.phone(
        phone.device, conversation=phone.welcome["conversation"], last_seq=ack["seq"]
    )
    assert await again.expect("page") == shown
    async with asyncio.timeout(10):  # the stream saves its events in the background
        while (stored := await db.fetchval(PAGE_EVENT)) is None:
            await asyncio.sleep(0.01)
    assert orjson.loads(stored) == shown


async def test_a_page_title_over_three_words_is_refused_and_the_model_told(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    long = {"title": "The weather in Bristol today", "body": "Sunny."}
    fake_llm.queue(
        Reply(tool_calls=[("show_page", long)]),
        Reply(tool_calls=[("show_page", WEATHER)]),
        Reply("There you go."),
    )
    phone = await harness.phone()
    await phone.say("Weather in Bristol?")
    await phone.reply()

    pages = [f["page"] for f in phone.frames if f["type"] == "page"]
    assert pages == [WEATHER]  # the refused one never reached the phone
    refused = tool_results(fake_llm.requests[1])
    assert "too long" in refused[0]["error"] and "two or three words" in refused[0]["error"]
    assert tool_results(fake_llm.requests[2])[-1]["shown"] is True


async def test_a_page_over_sse_is_an_event_named_page(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply(tool_calls=[("show_page", WEATHER)]), Reply("Sunny."))
    client = SseClient(harness.http, harness.url)
    stream = await client.open()
    await stream.expect("welcome")
    await client.say("Weather in Bristol?")
    event = await stream.expect("page")
    await client.close()

    assert event.event == "page" and event.id == str(event.seq)
    assert event.data["page"] == WEATHER


@pytest.mark.parametrize(
    "title",
    [
        "Weather",
        "Bristol weather",
        "M4 traffic westbound",
        "Tesco \u2013 opening hours",
        "Owen's flight",
    ],
)
def test_short_titles_are_shown(title: str) -> None:
    assert page({"title": f"  {title} ", "body": "text"}).title == title


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"title": "Opening hours of the Bristol Tesco", "body": "9 to 5"}, "too long"),
        ({"title": "Extraordinarily-long-hyphenated " * 3, "body": "x"}, "too long"),
        ({"title": " \u2013 ", "body": "x"}, "title is empty"),
        ({"title": "Weather", "body": "   "}, "body is empty"),
        ({"title": "Weather", "body": "x" * 4001}, "over 4000"),
    ],
)
def test_bad_pages_are_refused(args: dict[str, str], why: str) -> None:
    with pytest.raises(BadArgument, match=why):
        page(args)
