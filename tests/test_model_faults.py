"""Every way the chat model fails, through the whole server: the person gets a `reply.end`
with an `error` code, what is stored is exactly what that `reply.end` said, no tool acted
on a broken call, and the next say is answered as usual."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from tests.conftest import Harness
from tests.fakes.openai_server import (
    Cut,
    Endless,
    Fail,
    FakeOpenAI,
    Garbage,
    Reply,
    Response,
    Stall,
)
from tests.test_openai_client import closed_port

CAP = 500
BROKEN_CALL = Reply("", tool_calls=[("remember", '{"text": "Owen lives in Bris')])

# (script of the fake model, the error code the person gets, model requests made)
FAULTS: dict[str, tuple[list[Response], str, int]] = {
    "http 500, retried once": ([Fail(500), Fail(500)], "http_500", 2),
    "429 asking too long a wait to retry": ([Fail(429, retry_after="120")], "http_429", 1),
    "stall mid-stream": ([Stall("Let me see")], "timeout", 1),
    "malformed chunks": ([Garbage(), Garbage()], "bad_response", 2),
    "broken tool-call JSON": ([BROKEN_CALL, BROKEN_CALL], "bad_response", 2),
    "endless reply": ([Endless()], "too_long", 1),
    "stream cut after it began": ([Cut("Let me see")], "stream_cut", 1),
}


async def rows(db: asyncpg.Connection) -> tuple[list[tuple[str, str]], int]:
    turns = await db.fetch("SELECT role, text FROM turns ORDER BY place")
    return [(t["role"], t["text"]) for t in turns], await db.fetchval("SELECT count(*) FROM cards")


@pytest.mark.parametrize(("script", "code", "requests"), FAULTS.values(), ids=FAULTS.keys())
async def test_a_failing_model_gives_a_coded_reply_end_and_the_conversation_goes_on(
    harness: Harness,
    fake_llm: FakeOpenAI,
    db: asyncpg.Connection,
    script: list[Response],
    code: str,
    requests: int,
) -> None:
    await harness.start(llm_url=fake_llm.url, llm_timeout=0.3, max_reply_chars=CAP)
    fake_llm.queue(*script)
    phone = await harness.phone()
    await phone.say("Plan my week.")
    failed = await phone.reply()
    assert len(fake_llm.requests) == requests
    await phone.say("Are you there?")
    after = await phone.reply()
    await harness.recorded()

    assert failed["error"] == code and failed["text"]
    assert len(failed["text"]) <= CAP + 250  # the endless one: cut at its cap
    assert "error" not in after and after["text"].endswith("Are you there?")
    turns, cards = await rows(db)
    assert turns == [
        ("user", "Plan my week."),
        ("assistant", failed["text"]),
        ("user", "Are you there?"),
        ("assistant", after["text"]),
    ]
    assert cards == 0  # the broken call acted on nothing


async def test_a_model_that_refuses_connections_still_answers_each_say(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start(llm_url=f"http://127.0.0.1:{closed_port()}/v1")
    phone = await harness.phone()
    ends: list[dict[str, Any]] = []
    for text in ("Plan my week.", "Are you there?"):
        await phone.say(text)
        ends.append(await phone.reply())
    await harness.recorded()

    assert [e["error"] for e in ends] == ["connect", "connect"]
    turns, _ = await rows(db)
    assert [role for role, _ in turns] == ["user", "assistant", "user", "assistant"]
