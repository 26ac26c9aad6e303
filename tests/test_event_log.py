"""The group-committed event log against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from uuid import uuid4

import asyncpg
import pytest

from storage.event_log import ReplyRow
from storage.moods import Nudge
from storage.records import Turn
from storage.store import Store
from tests.conftest import own

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


async def test_events_of_many_conversations_share_one_write(store: Store) -> None:
    pa, pb = await own(store, "pa"), await own(store, "pb")
    a = await store.create_conversation("pa", NOW, pa)
    b = await store.create_conversation("pb", NOW, pb)
    await store.add_say(a, "pa", "say-1", "one night or two?", NOW, 1, pa)
    first = store.events.append(a, "pa", pa, {"type": "ack", "id": "say-1", "seq": 5})
    second = store.events.append(b, "pb", pb, {"type": "reply.start", "seq": 9, "reply": "r"})
    assert first is second  # queued in the same step: one batch, one statement
    assert await first
    later = store.events.append(a, "pa", pa, {"type": "reply.end", "seq": 6, "text": "Two."})
    assert later is not first and await later
    assert await store.events_between(a, 0, 100) == [
        {"type": "ack", "id": "say-1", "seq": 5},
        {"type": "reply.end", "seq": 6, "text": "Two."},
    ]
    assert [f["seq"] for f in await store.events_between(b, 0, 100)] == [9]
    again = await store.add_say(a, "pa", "say-1", "one night or two?", NOW, 1, pa)
    assert again.duplicate and again.ack_seq == 5  # read back from the written ack


async def test_an_event_written_twice_is_kept_once(store: Store) -> None:
    epoch = await own(store, "pc")
    a = await store.create_conversation("pc", NOW, epoch)
    frame = {"type": "reply.start", "seq": 3, "reply": "r"}
    assert await store.events.append(a, "pc", epoch, frame)
    assert await store.events.append(a, "pc", epoch, {**frame, "reply": "other"})
    assert await store.events_between(a, 0, 10) == [frame]


async def test_a_failed_write_is_logged_and_the_next_one_goes_through(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    epoch = await own(store, "pd")
    a = await store.create_conversation("pd", NOW, epoch)
    with caplog.at_level(logging.ERROR, logger="stillhere.events"):
        failed = store.events.append(uuid4(), "pd", epoch, {"type": "ack", "id": "x", "seq": 1})
        assert await failed is False  # no such conversation: the batch is refused whole
    assert "1 stream events and 0 replies could not be written" in caplog.text
    assert await asyncio.wait_for(
        store.events.append(a, "pd", epoch, {"type": "bye", "seq": 2}), 10
    )
    assert [f["seq"] for f in await store.events_between(a, 0, 10)] == [2]


async def test_a_reply_rides_in_the_events_statement(store: Store, db: asyncpg.Connection) -> None:
    epoch = await own(store, "pe")
    a = await store.create_conversation("pe", NOW, epoch)
    await store.add_say(a, "pe", "say-1", "one night or two?", NOW, 1, epoch)
    event = store.events.append(a, "pe", epoch, {"type": "reply.start", "seq": 4, "reply": "r"})
    reply = Turn("assistant", "Two nights, then.", NOW, interrupted=True)
    row = ReplyRow(a, "pe", uuid4(), reply, ["say-1", "say-2"], 2, epoch=epoch)
    stored = store.events.add_reply(row)
    assert stored is event and await stored  # one batch, one statement
    turns = await store.all_turns(a)
    assert [(t.role, t.text, t.interrupted) for t in turns] == [
        ("user", "one night or two?", False),
        ("assistant", "Two nights, then.", True),
    ]
    in_reply_to = "SELECT in_reply_to FROM turns WHERE role = 'assistant'"
    assert await db.fetchval(in_reply_to) == ["say-1", "say-2"]


async def test_a_reply_in_a_refused_batch_is_reported_not_stored(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    epoch = await own(store, "pf")
    reply = Turn("assistant", "Lost.", NOW)
    row = ReplyRow(uuid4(), "pf", uuid4(), reply, [], 2, epoch=epoch)
    with caplog.at_level(logging.ERROR, logger="stillhere.events"):
        assert await store.events.add_reply(row) is False
    assert "0 stream events and 1 replies could not be written" in caplog.text


def _nudged(fondness: float, *nudges: Nudge) -> float:
    for nudge in nudges:
        fondness += nudge.share * (nudge.toward - fondness)
    return fondness


async def test_the_mood_moves_in_the_replys_statement_once_per_reply(store: Store) -> None:
    """Each reply's nudge is applied, in order, even two of one person in one batch; a
    person's first one starts from its `start`."""
    epoch = await own(store, "pg")
    a = await store.create_conversation("pg", NOW, epoch)
    warmer, cooler = Nudge(0.5, 1.0, 0.1, NOW), Nudge(0.5, 0.0, 0.3, NOW)

    def row(nudge: Nudge) -> ReplyRow:
        reply = Turn("assistant", "Right.", NOW)
        return ReplyRow(a, "pg", uuid4(), reply, [], 2, epoch=epoch, mood=nudge)

    assert await store.events.add_reply(row(warmer))
    assert await store.moods.fondness("pg") == pytest.approx(_nudged(0.5, warmer))
    together = [store.events.add_reply(row(n)) for n in (cooler, warmer, warmer)]
    assert all(await asyncio.gather(*together))
    expected = _nudged(0.5, warmer, cooler, warmer, warmer)
    assert await store.moods.fondness("pg") == pytest.approx(expected, abs=1e-6)


async def test_a_reply_under_a_lost_epoch_moves_no_mood(store: Store) -> None:
    stale = await own(store, "ph")
    a = await store.create_conversation("ph", NOW, stale)
    await own(store, "ph")  # taken again: `stale` no longer holds
    told: list[tuple[str, int]] = []
    store.on_fenced = lambda person, epoch: told.append((person, epoch))
    reply = Turn("assistant", "Lost.", NOW)
    row = ReplyRow(a, "ph", uuid4(), reply, [], 2, epoch=stale, mood=Nudge(0.5, 1.0, 0.1, NOW))
    assert await store.events.add_reply(row)
    assert await store.moods.fondness("ph") is None
    assert await store.all_turns(a) == []
    assert told == [("ph", stale)]
