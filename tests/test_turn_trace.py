"""The turn's trace: what the model was handed (memories by id, per layer) and which tools
it called, kept for a live conversation's last 20 turns, shown by
`GET /admin/actors/{person}/turns` and `stillhere inspect PERSON --turns`."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from actors.trace import TRACED_TURNS
from cli.main import main
from tests.conftest import Harness
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.test_admin import TOKEN, _get, _start
from tests.test_memory_api import Api
from tests.test_search_api import OWEN


async def traced(harness: Harness, url: str, person: str) -> tuple[int, Any]:
    return await _get(harness, f"{url}/admin/actors/{person}/turns")


async def test_the_trace_lists_the_memories_handed_over_and_the_tool_called(
    harness: Harness, fake_llm: FakeOpenAI, capsys: pytest.CaptureFixture[str]
) -> None:
    url = await _start(harness, llm_url=fake_llm.url)
    phone = await harness.phone()
    person = harness.person(phone)
    ids = [(await Api(harness, phone.device).create(m))["memory"]["id"] for m in OWEN]
    fake_llm.queue(
        Reply("", tool_calls=[("search_memories", {"query": "Owen", "limit": 2})]),
        Reply("He lives in Bristol and works in a lab."),
    )
    await phone.say("What do you know about Owen?", "m1")
    await phone.reply()

    status, answer = await traced(harness, url, person)
    assert status == 200 and answer["conversation"] == phone.welcome["conversation"]
    (turn,) = answer["turns"]
    assert turn["answering"] == ["m1"] and turn["error"] is None
    assert set(turn["memories"]["recent"]) == set(ids)  # mentioned today: the recent layer
    assert turn["memories"]["working"] == [] and turn["conversations"] == []
    assert set(turn["timings_ms"]) == {"conversations", "recent", "sample", "rules", "working"}
    assert turn["problems"] == [] and turn["context_chars"] > 0
    (tool,) = turn["tools"]
    assert tool.startswith('search_memories {"query":"Owen","limit":2} -> 2 found: ')
    assert sum(i in tool for i in ids) == 2

    options = ["--admin-url", url, "--admin-token", TOKEN]
    assert await asyncio.to_thread(main, ["inspect", person[:12], "--turns", *options]) == 0
    shown = capsys.readouterr().out
    assert "1 turn traced" in shown and "answering m1" in shown
    assert "tool           search_memories" in shown
    assert all(i[:8] in shown for i in ids)


async def test_only_the_last_20_turns_are_kept_and_they_go_with_the_conversation(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    url = await _start(harness)
    phone = await harness.phone()
    person = harness.person(phone)
    for n in range(TRACED_TURNS + 2):
        await phone.say(f"message {n}", f"m{n}")
        await phone.reply()
    _, answer = await traced(harness, url, person)
    assert [t["answering"] for t in answer["turns"]] == [[f"m{n}"] for n in range(2, 22)]

    await phone.send({"type": "leave"})
    await phone.expect("bye")
    status, answer = await traced(harness, url, person)
    assert (status, answer["code"]) == (404, "unknown_person")
    options = ["--admin-url", url, "--admin-token", TOKEN]
    assert await asyncio.to_thread(main, ["inspect", "--turns", *options]) == 1
    assert "--turns needs a PERSON" in capsys.readouterr().err


async def test_the_trace_shows_the_open_threads_handed_beside_the_context(
    harness: Harness,
    fake_llm: FakeOpenAI,
    db: asyncpg.Connection,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A promise to go on later that the reply does not take up is a thread (the rules note
    it after the exchange); the next turn is handed it beside its context."""
    url = await _start(harness, llm_url=fake_llm.url)
    phone = await harness.phone()
    person = harness.person(phone)
    fake_llm.queue(Reply("Sure, no rush."), Reply("Nothing else for now."))
    await phone.say("I'll tell you about the boiler quote later", "m0")
    await phone.reply()
    await harness.server.runtime.settle(5.0)  # the exchange's loose ends are noted
    thread = await db.fetchval("SELECT id FROM loose_ends WHERE person = $1", person)
    await phone.say("anything else?", "m1")
    await phone.reply()
    _, answer = await traced(harness, url, person)
    first, second = answer["turns"]
    assert not any("boiler" in note for note in first["notes"])
    assert any('the boiler quote later"' in note for note in second["notes"])
    assert (first["threads"], second["threads"]) == ([], [str(thread)])
    assert second["loose_ends"] == []
    options = ["--admin-url", url, "--admin-token", TOKEN]
    assert await asyncio.to_thread(main, ["inspect", person[:12], "--turns", *options]) == 0
    assert f"  threads        {str(thread)[:8]}" in capsys.readouterr().out
