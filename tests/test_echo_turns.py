"""The echo guard in the stream: a real server and PostgreSQL, the chat model faked over HTTP.

What the guard holds back or cuts must never reach a `reply.delta`, the replay after a drop,
or the stored reply; anything else must reach them unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.echo import NO_REPEAT
from actors.turn import FALLBACK
from tests.conftest import Harness, Phone
from tests.fakes.openai_server import Empty, FakeOpenAI, Reply, Response
from tests.sse_client import SseClient

ROUGH = "I had a rough day at work."
SORRY = "Sorry to hear that. What happened?"
ASKED = "Would you like me to set a reminder for the dentist?"


def deltas(phone: Phone, end: dict[str, Any]) -> str:
    return "".join(
        f["text"] for f in phone.frames if f["type"] == "reply.delta" and f["reply"] == end["reply"]
    )


async def stored_reply(harness: Harness, db: asyncpg.Connection) -> str:
    await harness.recorded()
    return await db.fetchval(
        "SELECT text FROM turns WHERE role = 'assistant' ORDER BY place DESC LIMIT 1"
    )


async def counted(harness: Harness) -> dict[str, float]:
    """The echo counters as `GET /metrics` serves them."""
    async with harness.http.get(harness.url("/metrics")) as response:
        text = await response.text()
    return {
        ":".join([sample.name, *sample.labels.values()]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("stillhere_echo")
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def system_notes(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "system"]


async def answer(harness: Harness, fake_llm: FakeOpenAI, say: str, *replies: Response) -> Phone:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(*replies)
    phone = await harness.phone()
    await phone.say(say)
    return phone


async def test_an_echo_of_the_person_is_cut_from_deltas_reply_and_record(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    phone = await answer(harness, fake_llm, ROUGH, Reply(f"{ROUGH} {SORRY}", chunk=3))
    end = await phone.reply()
    assert deltas(phone, end) == end["text"] == SORRY
    assert await stored_reply(harness, db) == SORRY
    assert await counted(harness) == {
        "stillhere_echo_cuts_total:person": 1,
        "stillhere_echo_cuts_total:assistant": 0,
        "stillhere_echo_regenerations_total": 0,
    }
    assert "echo cut: 27 chars repeating the person's message" in caplog.text


async def test_an_echo_of_the_assistant_own_message_is_cut(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    phone = await answer(harness, fake_llm, "My tooth hurts.", Reply(ASKED))
    await phone.reply()
    fake_llm.queue(Reply(f"{ASKED.lower()} Just let me know.", chunk=5))
    await phone.say("Hmm, not sure yet.")
    end = await phone.reply()
    assert deltas(phone, end) == end["text"] == "Just let me know."
    assert await stored_reply(harness, db) == "Just let me know."
    assert (await counted(harness))["stillhere_echo_cuts_total:assistant"] == 1


async def test_a_partial_echo_that_diverges_is_released_unchanged(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    reply = "I had a rough day too, honestly. Tell me yours first."
    phone = await answer(harness, fake_llm, ROUGH, Reply(reply, chunk=2, delay=0.01))
    end = await phone.reply()
    assert deltas(phone, end) == end["text"] == reply
    assert await stored_reply(harness, db) == reply
    assert (await counted(harness))["stillhere_echo_cuts_total:person"] == 0


async def test_a_reply_that_is_only_an_echo_is_asked_for_again_once(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    phone = await answer(harness, fake_llm, ROUGH, Reply(ROUGH.upper()), Reply(SORRY))
    end = await phone.reply()
    assert deltas(phone, end) == end["text"] == SORRY
    assert len(fake_llm.requests) == 2
    first, second = fake_llm.requests
    assert NO_REPEAT not in system_notes(first)
    assert system_notes(second)[-1] == NO_REPEAT
    assert await stored_reply(harness, db) == SORRY
    assert (await counted(harness))["stillhere_echo_regenerations_total"] == 1


async def test_a_second_echo_only_reply_ends_with_the_fallback(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    phone = await answer(harness, fake_llm, ROUGH, Reply(ROUGH), Reply(ROUGH), Reply("never"))
    end = await phone.reply()
    assert (end["text"], end["error"]) == (FALLBACK, "echo")
    assert deltas(phone, end) == "" and len(fake_llm.requests) == 2


async def test_an_echo_then_an_empty_answer_is_not_retried_on_top(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    """Asked for again once, the model is not asked a third time when that fails."""
    phone = await answer(harness, fake_llm, ROUGH, Reply(ROUGH), Empty(), Reply("never"))
    end = await phone.reply()
    assert (end["text"], end["error"]) == (FALLBACK, "empty")
    assert len(fake_llm.requests) == 2


@pytest.mark.parametrize(
    ("earlier", "say", "reply"),
    [
        (None, "Good night!", "Good night! Sleep well."),
        ("Good night! Sleep well.", "Night night, off to bed now.", "Good night! Sleep well."),
    ],
    ids=["returned", "own-short-phrase-again"],
)
async def test_good_night_is_not_cut_where_it_is_no_echo(
    harness: Harness, fake_llm: FakeOpenAI, earlier: str | None, say: str, reply: str
) -> None:
    await harness.start(llm_url=fake_llm.url)
    phone = await harness.phone()
    if earlier is not None:
        fake_llm.queue(Reply(earlier))
        await phone.say("I'm going to sleep.")
        await phone.reply()
    fake_llm.queue(Reply(reply))
    await phone.say(say)
    end = await phone.reply()
    assert deltas(phone, end) == end["text"] == reply
    assert len(fake_llm.requests) == (2 if earlier else 1)


async def test_nothing_held_is_replayed_after_a_drop_mid_hold(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    """The phone drops while the echo is held back, and comes back with its last seq: the
    replay and the rest of the stream carry the reply without the echo."""
    slow = Reply(f"{ROUGH} {SORRY}", chunk=2, delay=0.03)  # the echo takes some 400 ms
    phone = await answer(harness, fake_llm, ROUGH, slow)
    start = await phone.expect("reply.start")
    await asyncio.sleep(0.15)
    assert harness.server.directory.get(harness.person(phone)).stream.last_seq == start["seq"]
    await phone.drop()
    again = await harness.phone(
        phone.device, conversation=phone.welcome["conversation"], last_seq=start["seq"]
    )
    end = await again.reply()
    assert deltas(again, end) == end["text"] == SORRY
    assert not [f for f in phone.frames if f["type"] == "reply.delta"]
    assert await stored_reply(harness, db) == SORRY


async def test_nothing_held_is_replayed_over_sse_after_a_drop_mid_hold(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply(f"{ROUGH} {SORRY}", chunk=2, delay=0.03))
    client = SseClient(harness.http, harness.url)
    try:
        first = await client.open()
        await client.say(ROUGH)
        start = await first.expect("reply.start")
        await asyncio.sleep(0.15)
        await first.drop()
        second = await client.open(last_event_id=str(start.seq))
        end = await second.expect("reply.end", timeout=10)
    finally:
        await client.close()
    assert not [e for e in first.events if e.type == "reply.delta"], "dropped mid-hold"
    sent = [e.data["text"] for e in second.events if e.type == "reply.delta"]
    assert "".join(sent) == end.data["text"] == SORRY


async def test_an_interrupt_mid_hold_stores_what_was_sent_nothing(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    slow = Reply(f"{ROUGH} {SORRY}", chunk=2, delay=0.03)
    phone = await answer(harness, fake_llm, ROUGH, slow, Reply("Okay."))
    await phone.expect("reply.start")
    await asyncio.sleep(0.15)
    await phone.send({"type": "interrupt"})
    end = await phone.reply()
    assert end["interrupted"] is True and end["text"] == "" == deltas(phone, end)
    assert await stored_reply(harness, db) == ""


async def test_with_the_guard_off_an_echo_goes_out(harness: Harness, fake_llm: FakeOpenAI) -> None:
    await harness.start(llm_url=fake_llm.url, echo_guard=False)
    fake_llm.queue(Reply(f"{ROUGH} {SORRY}"))
    phone = await harness.phone()
    await phone.say(ROUGH)
    end = await phone.reply()
    assert deltas(phone, end) == end["text"] == f"{ROUGH} {SORRY}"
