"""The remember tool end to end through the server: a phone says the same thing twice and
gets one memory, reinforced, instead of a second card.

It needs the server to build a memory keeper at start-up (`Runtime.memory`); until that
hook is in, the tool writes plain cards and these tests are skipped.
"""

from __future__ import annotations

import dataclasses

import asyncpg
import pytest

from actors.runtime import Runtime
from tests.conftest import Harness
from tests.test_memory_api import Api

pytestmark = pytest.mark.skipif(
    "memory" not in {f.name for f in dataclasses.fields(Runtime)},
    reason="the server does not build a memory keeper yet (Runtime.memory)",
)


async def test_saying_it_again_reinforces_instead_of_a_second_card(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start()
    phone = await harness.phone()
    await phone.say("Note that my brother Owen lives in Bristol.")
    first = await phone.expect("card")
    await phone.reply()
    await phone.say("Remember my brother Owen lives in Bristol")
    second = await phone.expect("card")
    await phone.reply()

    assert second["card"]["id"] == first["card"]["id"]
    rows = await db.fetch("SELECT id, mention_count, fingerprint_model FROM cards")
    assert [(str(r["id"]), r["mention_count"]) for r in rows] == [(first["card"]["id"], 2)]
    assert rows[0]["fingerprint_model"] is not None
    trace = await db.fetchrow("SELECT tier, existing, new_id, conversation FROM reinforcements")
    assert trace["existing"] == rows[0]["id"] and trace["new_id"] is None
    assert str(trace["conversation"]) == phone.welcome["conversation"]

    # The session's cards hold the memory once, after a reconnect too.
    await phone.close()
    again = await harness.phone(phone.device)
    assert [c["id"] for c in again.welcome["cards"]] == [str(rows[0]["id"])]


async def test_the_tool_result_tells_the_model_what_happened(
    harness: Harness, db: asyncpg.Connection
) -> None:
    from actors.tools import ToolContext, execute
    from providers.chat import ToolCall

    await harness.start()
    phone = await harness.phone()
    live = harness.server.directory.get(harness.person(phone))
    assert live is not None

    class Screen:
        def __init__(self) -> None:
            self.cards: list[object] = []

        def show_card(self, card: object) -> None:
            self.cards.append(card)

        def schedule(self, reminder: object) -> None:
            pass

    from actors.handles import TurnHandles

    screen = Screen()
    ctx = ToolContext(
        harness.server.runtime,
        live.id,
        live.person,
        live.stream.epoch,
        TurnHandles(screen, screen),
        live,
    )
    args = {"text": "The trip is to Lisbon.", "type": "fact", "themes": ["trip"]}
    created = await execute(ToolCall("c1", "remember", args), ctx)
    again = await execute(ToolCall("c2", "remember", args), ctx)
    other = await execute(
        ToolCall("c3", "remember", {**args, "text": "The trip is to Porto.", "kind": "fact"}), ctx
    )
    bad = await execute(ToolCall("c4", "remember", {**args, "due_at": "next Tuesday"}), ctx)

    assert '"created":true' in created
    assert '"created":false' in again and '"mentions":2' in again
    assert '"possible_contradiction"' in other or '"created":true' in other
    assert "due_at is not an ISO 8601 time" in bad
    assert await db.fetchval("SELECT count(*) FROM cards") == 2


async def test_a_reminder_set_in_conversation_is_a_memory_like_any(
    harness: Harness, db: asyncpg.Connection
) -> None:
    """ "remind me to call Anna tomorrow" is under the Reminder filter, counted by the
    clean-up sheet (reminders, all), muted and forgotten like any memory (seed 001)."""
    await harness.start()
    phone = await harness.phone()
    await phone.say("remind me to call Anna tomorrow")
    assert (await phone.expect("reminder"))["reminder"]["text"] == "call Anna"
    await phone.reply()
    api = Api(harness, phone.device)

    assert await api.listed(type="reminder") == ["call Anna (tomorrow)"]
    sweep = {"categories": ["reminder"], "scope": "all", "dry_run": True}
    status, dry = await api.call("POST", "/v1/memories/cleanup", sweep)
    assert (status, dry["count"]) == (200, 1)
    [memory] = dry["memories"]
    status, _ = await api.call("POST", f"/v1/memories/{memory['id']}/mute")
    assert status == 200 and await api.listed(type="reminder") == []
    forget = f"/v1/memories/{memory['id']}?confirm=forget"
    status, _ = await api.call("DELETE", forget)
    assert status == 200
    assert await db.fetchval("SELECT count(*) FROM cards WHERE kind = 'reminder'") == 0
