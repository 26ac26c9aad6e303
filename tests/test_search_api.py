"""`GET /v1/memories/search` over real HTTP, on the local embedding model and a real
PostgreSQL: what it answers, what it never shows, and bad queries refused with a code."""

from __future__ import annotations

import asyncpg
import pytest

from actors.memory.search import RELEVANCE_FLOOR
from tests.conftest import Harness
from tests.fakes.embeddings_server import Fail, FakeEmbeddings
from tests.memory_support import MODEL
from tests.test_memory_api import Api, snapshot

OWEN = [
    {"text": "My brother Owen lives in Bristol.", "people": ["owen"], "themes": ["family"]},
    {"text": "Owen works in a lab.", "people": ["owen"], "themes": ["work"]},
    {"text": "He goes climbing every Sunday morning.", "people": ["Owen"]},
]
TEA = {"text": "Hannah prefers tea to coffee.", "type": "preference", "themes": ["drinks"]}
DENTIST = {"text": "Dentist appointment on Tuesday at 3pm.", "type": "appointment"}


@pytest.fixture
async def hannah(harness: Harness) -> Api:
    await harness.start()  # no --embed-url: the local pair, as on a first run
    return Api(harness)


async def search(api: Api, **params: str) -> tuple[int, dict]:
    return await api.call("GET", "/v1/memories/search", params=params)


async def test_a_name_answers_every_memory_of_that_person_and_no_one_elses(
    hannah: Api, harness: Harness
) -> None:
    for memory in [*OWEN, TEA, DENTIST]:
        await hannah.create(memory)
    stranger = Api(harness)
    await stranger.create({"text": "Owen is my neighbour's dog.", "people": ["owen"]})

    status, answer = await search(hannah, q="What do you know about Owen?", limit="3")
    assert status == 200
    results = answer["results"]
    assert {r["memory"]["text"] for r in results} == {m["text"] for m in OWEN}
    assert all(set(r) == {"memory", "score", "why", "via"} for r in results)
    assert all("person" in r["why"].lower() and r["via"] is None for r in results)
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)

    status, answer = await search(stranger, q="What do you know about Owen?")
    assert [r["memory"]["text"] for r in answer["results"]] == ["Owen is my neighbour's dog."]


async def test_muted_memories_never_come_back(hannah: Api) -> None:
    ids = [(await hannah.create(m))["memory"]["id"] for m in OWEN]
    status, _ = await hannah.call("POST", f"/v1/memories/{ids[1]}/mute")
    assert status == 200
    _, answer = await search(hannah, q="Owen works in a lab.", limit="50")
    assert ids[1] not in [r["memory"]["id"] for r in answer["results"]]
    assert answer["results"][0]["memory"]["id"] in (ids[0], ids[2])


async def test_the_search_path_is_never_taken_for_a_memory_id(hannah: Api) -> None:
    status, answer = await hannah.call("GET", "/v1/memories/search")
    assert (status, answer["code"]) == (400, "invalid_field")
    status, answer = await hannah.call("GET", "/v1/memories/searching")
    assert (status, answer["code"]) == (404, "unknown_memory")


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({}, "q is missing"),
        ({"q": ""}, "q is empty"),
        ({"q": "   "}, "q holds only whitespace"),
        ({"q": "ow\x00en"}, "q holds a NUL character (U+0000) at 2, which no text here may hold"),
        ({"q": "x" * 5_000}, "q is limited to 1000 characters"),
        ({"q": "owen", "limit": "0"}, "limit must be an integer from 1 to 50"),
        ({"q": "owen", "limit": "51"}, "limit must be an integer from 1 to 50"),
        ({"q": "owen", "limit": "five"}, "limit must be an integer from 1 to 50"),
        ({"q": "owen", "limit": "-1"}, "limit must be an integer from 1 to 50"),
    ],
)
async def test_bad_queries_get_a_coded_error_and_change_nothing(
    hannah: Api, db: asyncpg.Connection, params: dict[str, str], words: str
) -> None:
    await hannah.create(OWEN[0])
    before = await snapshot(db)
    status, answer = await search(hannah, **params)
    assert (status, answer["code"], answer["message"]) == (400, "invalid_field", words)
    assert await snapshot(db) == before


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"q": "x" * 10_240}, "q is limited to 1000 characters"),
        ({"q": 42}, "q must be a string, not a number"),
        ({"q": ["owen"]}, "q must be a string, not a list"),
        ({"q": "owen", "limit": "5"}, "limit must be an integer from 1 to 50"),
        ({"q": "owen", "limit": True}, "limit must be an integer from 1 to 50"),
        ({"q": "owen", "limit": 2.5}, "limit must be an integer from 1 to 50"),
    ],
)
async def test_a_posted_query_of_10_kb_or_of_the_wrong_type_is_refused(
    hannah: Api, db: asyncpg.Connection, body: dict[str, object], words: str
) -> None:
    await hannah.create(OWEN[0])
    before = await snapshot(db)
    status, answer = await hannah.call("POST", "/v1/memories/search", body)
    assert (status, answer["code"], answer["message"]) == (400, "invalid_field", words)
    assert await snapshot(db) == before


async def test_a_posted_query_answers_as_the_url_one(hannah: Api) -> None:
    for memory in OWEN:
        await hannah.create(memory)
    status, posted = await hannah.call("POST", "/v1/memories/search", {"q": "Owen", "limit": 2})
    assert status == 200
    assert posted == (await search(hannah, q="Owen", limit="2"))[1]


async def test_a_repeated_query_and_missing_credentials_are_refused(hannah: Api) -> None:
    status, answer = await hannah.call("GET", "/v1/memories/search?q=owen&q=tea")
    assert (status, answer["code"]) == (400, "invalid_field")
    status, answer = await hannah.call("GET", "/v1/memories/search?q=owen", headers={})
    assert (status, answer["code"]) == (401, "unauthorized")


async def test_a_query_the_embedder_cannot_take_gets_503_and_then_is_served(
    harness: Harness, fake_embeddings: FakeEmbeddings
) -> None:
    await harness.start(embed_url=fake_embeddings.url, embed_model=MODEL)
    api = Api(harness)
    await api.create(OWEN[0])
    fake_embeddings.queue(Fail(503))
    status, answer = await search(api, q="Owen")
    assert (status, answer["code"]) == (503, "search_unavailable")
    assert "could not be embedded" in answer["message"]
    status, answer = await search(api, q="Owen")  # the embedder is back
    assert status == 200
    assert [r["memory"]["text"] for r in answer["results"]] == [OWEN[0]["text"]]


async def test_below_the_relevance_floor_nothing_is_a_result(hannah: Api) -> None:
    """A query about nothing the person told finds nothing (it listed every memory, the
    closest first, "Owen arrives Friday" for "cats" at -0.03); a related one still finds."""
    for memory in [{"text": "Owen arrives Friday."}, TEA, DENTIST]:
        await hannah.create(memory)
    status, answer = await search(hannah, q="cats", limit="10")
    assert (status, answer["results"]) == (200, [])
    _, answer = await search(hannah, q="When does Owen arrive?")
    assert [r["memory"]["text"] for r in answer["results"]][:1] == ["Owen arrives Friday."]
    assert all(r["score"] >= RELEVANCE_FLOOR for r in answer["results"])
