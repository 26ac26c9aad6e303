"""The stores against a real PostgreSQL: a say stored once and never after the end; the
memory candidates a restatement is compared with."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from storage import owners
from storage.event_log import ReplyRow
from storage.fingerprints import encode
from storage.memories import MemoryStore
from storage.owners import Fenced
from storage.records import MemoryDraft, Turn, reply_place, say_place
from storage.say_log import _ADD_SAYS
from storage.store import ConversationEnded, Store
from tests.conftest import own

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


async def _says(store: Store, person: str) -> list[str]:
    rows = await store._pool.fetch(
        "SELECT client_id FROM turns WHERE person = $1 AND role = 'user' ORDER BY id", person
    )
    return [r["client_id"] for r in rows]


async def test_a_say_is_stored_once(store: Store) -> None:
    epoch = await own(store, "p1")
    conversation = await store.create_conversation("p1", NOW, epoch)
    first = await store.add_say(conversation, "p1", "s-1", "two nights", NOW, 1, epoch)
    assert not first.duplicate and first.turn.text == "two nights"
    ack = {"type": "ack", "id": "s-1", "seq": 7}
    assert await store.events.append(conversation, "p1", epoch, ack)
    again = await store.add_say(conversation, "p1", "s-1", "two nights", NOW, 1, epoch)
    assert again.duplicate and again.ack_seq == 7
    assert await _says(store, "p1") == ["s-1"]


async def test_last_activity_is_the_last_turns_and_the_archive_keeps_it(store: Store) -> None:
    """Says do not update the conversation's row; its activity is read from its turns, by
    the idle sweep and on resume, and written onto the row when it is archived."""
    p7, p8 = await own(store, "p7"), await own(store, "p8")
    quiet = await store.create_conversation("p7", NOW, p7)
    talking = await store.create_conversation("p8", NOW, p8)
    later = NOW + timedelta(minutes=20)
    await store.add_say(talking, "p8", "s-1", "two nights", later, 1, p8)
    record = await store.active_conversation("p8", 5)
    assert record is not None and record.last_activity == later
    idle = await store.idle_conversations(NOW + timedelta(minutes=30))
    assert idle == [(quiet, "p7"), (talking, "p8")]  # the longest idle first
    assert await store.idle_conversations(NOW + timedelta(minutes=15)) == [(quiet, "p7")]
    assert await store.archive(talking, "leave", later + timedelta(minutes=1), "p8", p8)
    activity = "SELECT last_activity FROM conversations WHERE id = $1"
    assert await store._pool.fetchval(activity, talking) == later
    assert await store.idle_conversations(NOW + timedelta(minutes=30)) == [(quiet, "p7")]


async def test_an_archive_waits_for_the_says_being_stored(
    store: Store, db: asyncpg.Connection
) -> None:
    """A batch of says locks its conversations' rows: an ending that comes meanwhile waits,
    then sees them, so no say is stored into a conversation that has ended."""
    epoch = await own(store, "p9")
    conversation = await store.create_conversation("p9", NOW, epoch)
    later = NOW + timedelta(minutes=2)
    batch = db.transaction()
    await batch.start()
    row = await db.fetchrow(
        _ADD_SAYS, [conversation], [later], ["p9"], ["s-1"], ["hi"], [1], [epoch]
    )
    assert row["live"]
    archived = asyncio.ensure_future(store.archive(conversation, "leave", later, "p9", epoch))
    await _until_one_waits_for_a_lock(db)
    assert not archived.done()
    await batch.commit()
    assert await archived
    activity = "SELECT last_activity FROM conversations WHERE id = $1"
    assert await db.fetchval(activity, conversation) == later
    assert await _says(store, "p9") == ["s-1"]


async def _until_one_waits_for_a_lock(db: asyncpg.Connection) -> None:
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    async with asyncio.timeout(10.0):
        while not await db.fetchval(waiting):
            await asyncio.sleep(0.005)


async def test_a_resent_say_is_acked_with_its_own_first_ack(store: Store) -> None:
    """The repeated ack's seq is read from the events: its id's ack after the say's place.
    A say whose ack was never written gets none; a row from before places is found too."""
    epoch = await own(store, "p6")
    conversation = await store.create_conversation("p6", NOW, epoch)
    await store.add_say(conversation, "p6", "s-1", "one night?", NOW, say_place(0), epoch)
    await store.add_say(conversation, "p6", "s-2", "two", NOW, say_place(3), epoch)
    await store.add_say(conversation, "p6", "s-3", "lost ack", NOW, say_place(4), epoch)
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
        assert await store.events.append(conversation, "p6", epoch, frame)
    acks = {
        say: (
            await store.add_say(conversation, "p6", say, "again", NOW, say_place(5), epoch)
        ).ack_seq
        for say in ("s-0", "s-1", "s-2", "s-3")
    }
    assert acks == {"s-0": 1, "s-1": 2, "s-2": 4, "s-3": None}


async def test_a_say_to_an_ended_conversation_is_refused_and_not_stored(store: Store) -> None:
    epoch = await own(store, "p2")
    conversation = await store.create_conversation("p2", NOW, epoch)
    await store.add_say(conversation, "p2", "s-1", "hello", NOW, 1, epoch)
    assert await store.archive(conversation, "leave", NOW, "p2", epoch)
    with pytest.raises(ConversationEnded):
        await store.add_say(conversation, "p2", "s-2", "still there?", NOW, 1, epoch)
    with pytest.raises(ConversationEnded):  # a resend after the end is refused too
        await store.add_say(conversation, "p2", "s-1", "hello", NOW, 1, epoch)
    assert await _says(store, "p2") == ["s-1"]


async def test_turns_are_read_back_by_place_and_those_without_one_first(store: Store) -> None:
    """A reply written after a say can take its place before it; rows from before places
    existed (migration 007) keep their order, ahead of the rest, in a window cut short too."""
    epoch = await own(store, "p5")
    conversation = await store.create_conversation("p5", NOW, epoch)
    await store._pool.execute(
        "INSERT INTO turns (conversation, person, role, client_id, text, at) "
        "VALUES ($1, 'p5', 'user', 'old', 'from before places', $2)",
        conversation,
        NOW,
    )
    await store.add_say(conversation, "p5", "s-1", "plan my Saturday", NOW, say_place(3), epoch)
    await store.add_say(conversation, "p5", "s-2", "Owen comes too", NOW, say_place(5), epoch)
    for text, start_seq in (("Here is a plan.", 4), ("Sure.", 7)):  # each written last
        turn = Turn("assistant", text, NOW)
        row = ReplyRow(conversation, "p5", uuid4(), turn, [], reply_place(start_seq), epoch=epoch)
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


async def _taken_over(store: Store, person: str) -> tuple[UUID, int, int]:
    """A conversation made under `person`'s epoch, then the person taken by another node
    once the lease has run out: (the conversation, the stale epoch, the new one)."""
    epoch = await own(store, person)
    conversation = await store.create_conversation(person, NOW, epoch)
    await store.add_say(conversation, person, "s-1", "before", NOW, say_place(0), epoch)
    assert await store.events.append(conversation, person, epoch, {"type": "bye", "seq": 1})
    await store._pool.execute(
        "UPDATE owners SET expires_at = now() - interval '1 second' WHERE person = $1", person
    )
    taken = await owners.take(store.pool, person, "other", 60)
    assert taken is not None and taken != epoch
    return conversation, epoch, taken


async def _stored(store: Store, person: str) -> dict[str, list[dict[str, Any]]]:
    """Everything stored for the person: their turns, events and conversations."""
    queries = {
        "turns": "SELECT * FROM turns WHERE person = $1 ORDER BY id",
        "events": "SELECT e.* FROM events e JOIN conversations c ON c.id = e.conversation "
        "WHERE c.person = $1 ORDER BY e.conversation, e.seq",
        "conversations": "SELECT * FROM conversations WHERE person = $1 ORDER BY id",
    }
    return {
        table: [dict(r) for r in await store._pool.fetch(query, person)]
        for table, query in queries.items()
    }


async def test_writes_under_a_stale_epoch_change_nothing(store: Store) -> None:
    """Once another node took the person, the old owner's say, events, reply and seq
    reservations are all refused: Fenced, or skipped and reported to `on_fenced`."""
    conversation, stale, _ = await _taken_over(store, "pg")
    fenced: list[tuple[str, int]] = []
    store.on_fenced = lambda person, epoch: fenced.append((person, epoch))
    before = await _stored(store, "pg")
    with pytest.raises(Fenced):
        await store.add_say(conversation, "pg", "s-2", "after", NOW, say_place(2), stale)
    assert fenced == [("pg", stale)]
    event = store.events.append(conversation, "pg", stale, {"type": "bye", "seq": 2})
    turn = Turn("assistant", "Too late.", NOW)
    reply = store.events.add_reply(
        ReplyRow(conversation, "pg", uuid4(), turn, ["s-1"], reply_place(3), epoch=stale)
    )
    assert reply is event
    await event
    assert fenced == [("pg", stale)] * 2  # the batch reports the person once
    with pytest.raises(Fenced):
        await store.raise_seq_ceiling(conversation, "pg", stale, 1000)
    await store.set_seq_ceiling(conversation, "pg", stale, 0)  # quietly nothing
    with pytest.raises(Fenced):
        await store.create_conversation("pg", NOW, stale)
    assert fenced == [("pg", stale)] * 4
    assert await _stored(store, "pg") == before


async def test_an_archive_under_a_stale_epoch_is_fenced_and_the_talk_stays_active(
    store: Store,
) -> None:
    conversation, stale, current = await _taken_over(store, "ph")
    before = await _stored(store, "ph")
    with pytest.raises(Fenced):
        await store.archive(conversation, "leave", NOW + timedelta(minutes=1), "ph", stale)
    assert await _stored(store, "ph") == before
    record = await store.active_conversation("ph", 5)
    assert record is not None and record.id == conversation
    assert await store.archive(conversation, "leave", NOW + timedelta(minutes=1), "ph", current)
    assert await store.active_conversation("ph", 5) is None


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
