"""One person can never read, resume, mute or forget another's conversation, memory, rule
or thread: every person-scoped endpoint, tried with another person's ids, is refused (or
answers only the caller's own), and nothing of the other person's changes."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from tests.conftest import Harness, Phone
from tests.fakes.embeddings_server import FakeEmbeddings
from tests.memory_support import MODEL, Script
from tests.sse_client import EventStream
from tests.test_memory_api import Api
from tests.test_split import reinforced_wrongly

# Every table holding a person's data, read whole: the other person's rows must not move.
_PERSON_TABLES = """
SELECT table_name FROM information_schema.columns
WHERE column_name = 'person' AND table_schema = 'public' ORDER BY table_name
"""


async def rows_of(db: asyncpg.Connection, person: str) -> dict[str, list[tuple[Any, ...]]]:
    tables = [r["table_name"] for r in await db.fetch(_PERSON_TABLES)]
    seen = {}
    for table in tables:
        query = f"SELECT * FROM {table} WHERE person = $1 ORDER BY 1"
        seen[table] = [tuple(r) for r in await db.fetch(query, person)]
    seen["events"] = [
        tuple(r)
        for r in await db.fetch(
            "SELECT e.* FROM events e JOIN conversations c ON c.id = e.conversation"
            " WHERE c.person = $1 ORDER BY e.conversation, e.seq",
            person,
        )
    ]
    return seen


@pytest.fixture
async def anna(harness: Harness, fake_embeddings: FakeEmbeddings) -> Api:
    await harness.start(embed_url=fake_embeddings.url, embed_model=MODEL)
    return Api(harness)


async def test_no_endpoint_reaches_another_persons_data(
    anna: Api, harness: Harness, db: asyncpg.Connection, script: Script
) -> None:
    # Anna: a conversation, a memory said twice (a mention to split), a rule, a thread.
    phone = await harness.phone(anna.device)
    await phone.say("Remember to water the ferns on Sunday")
    await phone.reply()
    conversation = phone.welcome["conversation"]
    memory, mention = await reinforced_wrongly(anna, script)
    await anna.create({"text": "Buy oat milk and lemons.", "type": "memo"})  # for the sweep
    status, rule = await anna.call("POST", "/v1/rules", {"text": "always answer briefly"})
    assert status == 201, rule
    await db.execute(
        "INSERT INTO loose_ends (id, person, conversation, by, kind, text, at)"
        " VALUES (gen_random_uuid(), $1, $2, 'assistant', 'thread', 'the lighthouse story', now())",
        anna.person,
        conversation,
    )
    await harness.recorded()
    before = await rows_of(db, anna.person)
    assert before["cards"] and before["rules"] and before["loose_ends"] and before["turns"]

    mallory = Api(harness)
    own = (await mallory.create({"text": "Mallory's own note.", "type": "memo"}))["memory"]["id"]
    rule_id = rule["rule"]["id"]
    forget = {"confirm": "forget"}
    refused: list[tuple[str, str, Any, dict[str, str] | None]] = [
        ("GET", f"/v1/memories/{memory}", None, None),
        ("DELETE", f"/v1/memories/{memory}", None, forget),
        ("POST", f"/v1/memories/{memory}/mute", {}, None),
        ("POST", f"/v1/memories/{memory}/unmute", {}, None),
        ("POST", f"/v1/memories/{memory}/erroneous", {"corrected_by": own}, None),
        ("POST", f"/v1/memories/{own}/erroneous", {"corrected_by": memory}, None),
        ("POST", f"/v1/memories/{memory}/split", {"mention": mention}, None),
        ("POST", "/v1/memories/bulk", {"action": "mute", "ids": [memory]}, None),
        ("POST", "/v1/memories/bulk", {"action": "forget", "ids": [memory], **forget}, None),
        ("DELETE", f"/v1/rules/{rule_id}", None, None),
    ]
    for method, path, body, params in refused:
        status, answer = await mallory.call(method, path, body, params=params)
        assert (status, answer["type"]) == (404, "error"), (method, path, answer)
        assert "Owen" not in str(answer), (method, path)

    # The lists and searches answer Mallory's own, and nothing of Anna's.
    for method, path, body, params in (
        ("GET", "/v1/memories", None, None),
        ("GET", "/v1/memories/search", None, {"q": "Owen Bristol"}),
        ("POST", "/v1/memories/search", {"q": "Owen Bristol"}, None),
        ("GET", "/v1/rules", None, None),
        ("GET", "/v1/threads", None, None),
    ):
        status, answer = await mallory.call(method, path, body, params=params)
        assert status == 200, (path, answer)
        text = str(answer)
        for anna_own in ("Owen", "oat milk", "briefly", "lighthouse", memory, rule_id):
            assert anna_own not in text, (path, anna_own)
    status, swept = await mallory.call(
        "POST",
        "/v1/memories/cleanup",
        {"categories": ["memo", "muted"], "scope": "all", "confirm": "cleanup"},
    )
    assert (status, swept["count"]) == (200, 1)  # Mallory's own note, not Anna's

    # Resuming Anna's conversation by its id: over WebSocket...
    intruder = Phone(harness, mallory.device)
    welcome = await intruder.connect(conversation=conversation, last_seq=0)
    assert welcome["conversation"] != conversation
    assert (welcome["resumed"], welcome["history"], welcome["cards"]) == (False, [], [])
    # ...over SSE, with Last-Event-ID...
    async with harness.http.get(
        harness.url("/v1/events"),
        params={"conversation": conversation},
        headers={"X-Stillhere-Device": mallory.device, "Last-Event-ID": "0"},
    ) as response:
        stream = EventStream(response)
        seen = (await stream.expect("welcome")).data
        await asyncio.sleep(0.2)  # room for any replay to arrive (there must be none)
        assert seen["conversation"] == welcome["conversation"]  # Mallory's own
        assert [e.type for e in stream.events] == ["welcome"]
    # ...and a POSTed say aimed at it: refused, not stored anywhere.
    status, answer = await mallory.call(
        "POST", "/v1/say", {"id": "m1", "text": "ignore that", "conversation": conversation}
    )
    assert (status, answer["code"]) == (409, "conversation_ended")
    for path in ("/v1/interrupt", "/v1/leave"):  # Mallory's own conversation only
        status, _ = await mallory.call("POST", path, {})
        assert status == 200
    await intruder.close()

    await harness.recorded()
    assert await rows_of(db, anna.person) == before
    live = harness.server.directory.get(anna.person)
    assert live is not None and str(live.id) == conversation and not live.ending
    await phone.say("Still mine?")  # Anna's conversation goes on
    assert (await phone.reply())["text"]
    await phone.close()
