"""The model's `search_memories` tool, in a whole turn: a fake chat model over real HTTP
calls it, the real server searches the local embedding model's fingerprints in a real
PostgreSQL, and the model answers from what the tool returned."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.conftest import Harness
from tests.fakes.embeddings_server import Fail, FakeEmbeddings
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.memory_support import MODEL
from tests.test_memory_api import Api
from tests.test_search_api import OWEN, TEA


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """What the tools returned, as the model is handed it in this request."""
    return [orjson.loads(m["content"]) for m in body["messages"] if m["role"] == "tool"]


def answer_from_the_tool(body: dict[str, Any]) -> Reply:
    """The fake model's answer: the memories the last tool result gave, nothing else."""
    found = tool_results(body)[-1].get("results", [])
    return Reply("I know that " + " ".join(r["text"] for r in found))


@pytest.fixture
async def served(harness: Harness, fake_llm: FakeOpenAI) -> Harness:
    fake_llm.default = answer_from_the_tool
    return await harness.start(llm_url=fake_llm.url)


async def test_what_do_you_know_about_owen_is_answered_from_the_tool(
    served: Harness, fake_llm: FakeOpenAI
) -> None:
    phone = await served.phone()
    hannah = Api(served, phone.device)
    for memory in [*OWEN, TEA]:
        await hannah.create(memory)
    await Api(served).create({"text": "Owen is my neighbour's dog.", "people": ["owen"]})
    fake_llm.queue(Reply("", tool_calls=[("search_memories", {"query": "Owen", "limit": 3})]))

    await phone.say("What do you know about Owen?")
    end = await phone.reply()

    offered = [t["function"]["name"] for t in fake_llm.requests[0]["tools"]]
    assert "search_memories" in offered
    (result,) = tool_results(fake_llm.requests[1])
    assert {r["text"] for r in result["results"]} == {m["text"] for m in OWEN}
    first = result["results"][0]
    assert set(first) >= {"id", "type", "status", "people", "themes", "dates", "why"}
    assert first["status"] == "active" and "last_mentioned" in first["dates"]
    assert end["text"].startswith("I know that ")
    assert all(m["text"] in end["text"] for m in OWEN)
    assert "neighbour" not in end["text"] and TEA["text"] not in end["text"]


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"query": ""}, "query is empty"),
        ({"query": "x" * 10_240}, "query is limited to 1000 characters"),
        ({"query": 42}, "query must be a string, not a number"),
        ({}, "query is missing"),
        ({"query": "Owen", "limit": "3"}, "limit must be an integer from 1 to 20"),
        ({"query": "Owen", "limit": 0}, "limit must be an integer from 1 to 20"),
    ],
)
async def test_a_bad_query_from_the_model_gets_a_coded_error(
    served: Harness, fake_llm: FakeOpenAI, arguments: dict[str, Any], words: str
) -> None:
    phone = await served.phone()
    fake_llm.queue(Reply("", tool_calls=[("search_memories", arguments)]))
    await phone.say("What do you know about Owen?")
    end = await phone.reply()
    (result,) = tool_results(fake_llm.requests[1])
    assert result == {"error": words, "code": "invalid_argument"}
    assert end["text"] == "I know that "


async def test_a_search_the_embedder_cannot_serve_tells_the_model_so(
    harness: Harness, fake_llm: FakeOpenAI, fake_embeddings: FakeEmbeddings
) -> None:
    fake_llm.default = answer_from_the_tool
    await harness.start(llm_url=fake_llm.url, embed_url=fake_embeddings.url, embed_model=MODEL)
    phone = await harness.phone()
    await Api(harness, phone.device).create(OWEN[0])
    fake_llm.queue(Reply("", tool_calls=[("search_memories", {"query": "Owen"})]))
    fake_embeddings.queue(Fail(503))
    await phone.say("What do you know about Owen?")
    end = await phone.reply()
    (result,) = tool_results(fake_llm.requests[1])
    assert set(result) == {"error"}
    assert result["error"].startswith("memory search is unavailable right now (")
    assert end["text"] == "I know that " and "error" not in end


async def test_the_rehearsal_model_answers_what_it_knows_from_the_search(
    harness: Harness,
) -> None:
    await harness.start()  # no model URL: the built-in rehearsal model
    phone = await harness.phone()
    await phone.say("Remember that Owen works in a lab")
    assert (await phone.reply())["text"] == "Noted: Owen works in a lab."
    await phone.say("What do you know about Owen?")
    end = await phone.reply()
    assert "Here is what I remember: Owen works in a lab" in end["text"]
