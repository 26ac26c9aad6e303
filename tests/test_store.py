"""The stores against a real PostgreSQL: a say stored once and never after the end; the
memory candidates a restatement is compared with."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from storage.event_log import ReplyRow
from storage.fingerprints import encode
from storage.memories import MemoryStore
from storage.records import MemoryDraft, Turn, reply_place, say_place
from storage.store import ConversationEnded, Store

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


async def _says(store: Store, person: str) -> list[str]:
    rows = await store._pool.fetch(
        "SELECT client_id FROM turns WHERE person = $1 AND role = 'user' ORDER BY id", person
    )
    return [r["client_id"] for r in rows]


async def test_a_say_is_stored_once_and_refreshes_last_activity(store: Store) -> None:
    conversation = await store.create_conversation("p1", NOW)
    later = NOW + timedelta(minutes=3)
    first = await store.add_say(conversation, "p1", "s-1", "two nights", later, 1)
    assert not first.duplicate and first.turn.text == "two nights"
    assert await store.events.append(conversation, {"type": "ack", "id": "s-1", "seq": 7})
    again = await store.add_say(conversation, "p1", "s-1", "two nights", later, 1)
    assert again.duplicate and again.ack_seq == 7
    assert await _says(store, "p1") == ["s-1"]
    activity = await store._pool.fetchval(
        "SELECT last_activity FROM conversations WHERE id = $1", conversation
    )
    assert activity == later


async def test_a_resent_say_is_acked_with_its_own_first_ack(store: Store) -> None:
    """The repeated ack's seq is read from the events: its id's ack after the say's place.
    A say whose ack was never written gets none; a row from before places is found too."""
    conversation = await store.create_conversation("p6", NOW)
    await store.add_say(conversation, "p6", "s-1", "one night?", NOW, say_place(0))
    await store.add_say(conversation, "p6", "s-2", "two", NOW, say_place(3))
    await store.add_say(conversation, "p6", "s-3", "lost ack", NOW, say_place(4))
    await store._pool.execute(
        "INSERT INTO turns (conversation, person, role, client_id, text, at) "
        "VALUES ($1, 'p6', 'user', 's-0', 'from before places', $2)",
        conversation,
        NOW,
    )
    frames = [
        {"type": "ack", "id": "s-0", "seq": 1},
        {"type": "ack", "id": "s-1", "seq": 2},
        {"type": "reply.start", "seq": 3, "reply": "r"},
        {"type": "ack", "id": "s-2", "seq": 4},
        {"type": "reply.end", "seq": 5, "reply": "r", "text": "Two nights."},
    ]
    for frame in frames:
        assert await store.events.append(conversation, frame)
    acks = {
        say: (await store.add_say(conversation, "p6", say, "again", NOW, say_place(5))).ack_seq
        for say in ("s-0", "s-1", "s-2", "s-3")
    }
    assert acks == {"s-0": 1, "s-1": 2, "s-2": 4, "s-3": None}


async def test_a_say_to_an_ended_conversation_is_refused_and_not_stored(store: Store) -> None:
    conversation = await store.create_conversation("p2", NOW)
    await store.add_say(conversation, "p2", "s-1", "hello", NOW, 1)
    assert await store.archive(conversation, "leave", NOW)
    with pytest.raises(ConversationEnded):
        await store.add_say(conversation, "p2", "s-2", "still there?", NOW, 1)
    with pytest.raises(ConversationEnded):  # a resend after the end is refused too
        await store.add_say(conversation, "p2", "s-1", "hello", NOW, 1)
    assert await _says(store, "p2") == ["s-1"]


async def test_turns_are_read_back_by_place_and_those_without_one_first(store: Store) -> None:
    """A reply written after a say can take its place before it; rows from before places
    existed (migration 007) keep their order, ahead of the rest, in a window cut short too."""
    conversation = await store.create_conversation("p5", NOW)
    await store._pool.execute(
        "INSERT INTO turns (conversation, person, role, client_id, text, at) "
        "VALUES ($1, 'p5', 'user', 'old', 'from before places', $2)",
        conversation,
        NOW,
    )
    await store.add_say(conversation, "p5", "s-1", "plan my Saturday", NOW, say_place(3))
    await store.add_say(conversation, "p5", "s-2", "Owen comes too", NOW, say_place(5))
    for text, start_seq in (("Here is a plan.", 4), ("Sure.", 7)):  # each written last
        turn = Turn("assistant", text, NOW)
        row = ReplyRow(conversation, "p5", uuid4(), turn, [], reply_place(start_seq))
        assert await store.events.add_reply(row)
    texts = [t.text for t in await store.all_turns(conversation)]
    assert texts == [
        "from before places",
        "plan my Saturday",
        "Here is a plan.",
        "Owen comes too",
        "Sure.",
    ]
    record = await store.active_conversation("p5", 4)
    assert record is not None and [t.text for t in record.window] == texts[1:]
    assert [t.text for t in await store.context.last_turns(conversation, 2)] == texts[3:]


async def test_verbatim_candidates_ignore_case_and_punctuation_and_nothing_else(
    store: Store, dsn: str
) -> None:
    memories = await MemoryStore.open(dsn)
    try:
        owen, _ = await memories.create("p3", MemoryDraft("My brother Owen lives in Bristol."), NOW)
        near, _ = await memories.create("p3", MemoryDraft("My brother Owen lived in Bristol."), NOW)
        await memories.create("p4", MemoryDraft("My brother Owen lives in Bristol."), NOW)
        found, _, generation = await memories.candidates(
            "p3", [], "my brother owen, lives in BRISTOL"
        )
        assert list(found) == [owen.id] and generation == await memories.generation("p3")
        both, _, _ = await memories.candidates("p3", [near.id], "my brother owen, lives in BRISTOL")
        assert set(both) == {owen.id, near.id}  # the fingerprint hits come in the same read
        await memories.set_status("p3", [owen.id], "muted", only_from="active")
        none, _, after = await memories.candidates("p3", [], "My brother Owen lives in Bristol.")
        assert none == {} and after == generation + 1  # no row, and still the generation
        assert await memories.candidates("nobody", [], "x") == ({}, {}, 0)
        # The same read brings the fingerprints the asked model made, and only those.
        vector = encode([0.6, 0.8])
        dog, _ = await memories.create(
            "p3", MemoryDraft("Owen has a dog."), NOW, fingerprint=vector, model="m"
        )
        assert (await memories.candidates("p3", [dog.id], "", "m"))[1] == {dog.id: vector}
        assert (await memories.candidates("p3", [dog.id], "", "other"))[1] == {}
    finally:
        await memories.close()
