"""The group-committed says against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest

from storage.records import StoredSay
from storage.store import ConversationEnded, Store
from tests.conftest import own

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


async def test_says_of_many_conversations_share_a_batch_and_each_gets_its_answer(
    store: Store, db: asyncpg.Connection
) -> None:
    pa, pb, pc = [await own(store, p) for p in ("pa", "pb", "pc")]
    a = await store.create_conversation("pa", NOW, pa)
    ended = await store.create_conversation("pb", NOW, pb)
    await store.archive(ended, "leave", NOW, "pb", pb)
    c = await store.create_conversation("pc", NOW, pc)
    await store.add_say(c, "pc", "old", "stored before", NOW, 1, pc)
    later = NOW + timedelta(minutes=5)
    queued = [
        store.says.add(a, "pa", "new", "one night or two?", later, 1, pa),
        store.says.add(ended, "pb", "late", "too late", later, 1, pb),
        store.says.add(c, "pc", "old", "stored before", later, 1, pc),
        store.says.add(a, "pa", "new", "one night or two?", later, 1, pa),  # its id, again
    ]
    new, late, old, again = await asyncio.gather(*queued)
    assert (new["live"], new["text"], new["client_id"]) == (True, "one night or two?", "new")
    assert (late["live"], late["id"]) == (False, None)
    assert (old["live"], old["id"]) == (True, None)
    assert again is new  # queued once: the write that stored it answers it again
    count = "SELECT count(*) FROM turns WHERE person = $1 AND client_id = $2"
    assert [await db.fetchval(count, p, i) for p, i in [("pa", "new"), ("pb", "late")]] == [1, 0]
    for person in ("pa", "pc"):  # c's say came again: no turn, but activity all the same
        record = await store.active_conversation(person, 5)
        assert record is not None and record.last_activity == later
    assert await db.fetchval("SELECT count(*) FROM turns WHERE person = 'pc'") == 1
    assert await db.fetchval("SELECT last_activity FROM conversations WHERE id = $1", ended) == NOW


async def test_store_says_answers_as_before(store: Store, db: asyncpg.Connection) -> None:
    epoch = await own(store, "pd")
    a = await store.create_conversation("pd", NOW, epoch)
    first = await store.add_say(a, "pd", "s1", "hello", NOW, 1, epoch)
    assert not first.duplicate and first.turn.text == "hello" and first.generation == 0
    unacked = await store.add_say(a, "pd", "s1", "hello", NOW, 1, epoch)
    assert not unacked.duplicate  # stored, never acked: to be acked and answered now
    ack = orjson.dumps({"type": "ack", "seq": 2, "id": "s1"}).decode()
    await db.execute("INSERT INTO events VALUES ($1, 2, $2::jsonb)", a, ack)
    again = await store.add_say(a, "pd", "s1", "hello", NOW, 1, epoch)
    assert (again.duplicate, again.ack_seq, again.turn.text) == (True, 2, "hello")
    await store.archive(a, "leave", NOW, "pd", epoch)
    with pytest.raises(ConversationEnded):
        await store.add_say(a, "pd", "s2", "anyone?", NOW, 1, epoch)


async def test_a_refused_batch_fails_its_says_and_the_next_goes_through(store: Store) -> None:
    epoch = await own(store, "pe")
    a = await store.create_conversation("pe", NOW, epoch)
    bad = store.says.add(a, "pe", "nul", "a NUL \x00 PostgreSQL refuses", NOW, 1, epoch)
    with_it = store.says.add(a, "pe", "fine", "queued in the same step", NOW, 1, epoch)
    for refused in (bad, with_it):
        with pytest.raises(asyncpg.PostgresError):
            await refused
    after = await store.add_say(a, "pe", "fine", "queued in the same step", NOW, 1, epoch)
    assert not after.duplicate  # nothing of the refused batch was stored


async def test_a_refused_say_nobody_waits_for_any_more_reports_nothing(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The say's caller gave up (its store timeout) and said so: a refusal that comes
    after is no second report ("exception was never retrieved")."""
    epoch = await own(store, "pf")
    a = await store.create_conversation("pf", NOW, epoch)
    store.says.add(a, "pf", "nul", "a NUL \x00 PostgreSQL refuses", NOW, 1, epoch)
    await asyncio.sleep(0)  # its batch goes alone; the next say's is written after it
    await store.add_say(a, "pf", "fine", "said next", NOW, 1, epoch)
    gc.collect()  # an error never retrieved is reported when its future is collected
    await asyncio.sleep(0)
    assert "exception was never retrieved" not in caplog.text


async def _waiting_on_locks(store: Store) -> int:
    """Statements of this database waiting for a lock another transaction holds."""
    return await store.pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )


async def test_a_resend_waits_on_its_say_s_write_still_queued_or_in_flight(
    store: Store, db: asyncpg.Connection
) -> None:
    """Two says whose callers gave up: one's write in flight (held back by a lock on its
    conversation's row), the other's queued behind it. Each is resent twice meanwhile, the
    first resend giving up too: no resend adds a write, and once the writes land, the
    resend still waiting gets its say as new (to ack and answer), stored once."""
    epoch = await own(store, "pg")
    a = await store.create_conversation("pg", NOW, epoch)
    joined: list[str] = []
    store.says.on_joined = lambda: joined.append("joined")

    def say(id_: str, text: str) -> Coroutine[Any, Any, StoredSay]:
        return store.add_say(a, "pg", id_, text, NOW, 1, epoch)

    async def given_up(id_: str, text: str) -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(say(id_, text), 0.2)

    async with db.transaction():
        await db.execute("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE", a)
        await given_up("s1", "in flight")
        async with asyncio.timeout(10):  # s1's batch, sent and held back (on a busy machine,
            while await _waiting_on_locks(store) != 1:  # it may take more than the 0.2 s)
                await asyncio.sleep(0.01)
        await given_up("s2", "queued behind it")
        for id_ in ("s1", "s2"):
            await given_up(id_, "resent")
        last = [asyncio.ensure_future(say(id_, "resent again")) for id_ in ("s1", "s2")]
        await asyncio.sleep(0.1)
        assert not any(resend.done() for resend in last)
        assert joined == ["joined"] * 4
    s1, s2 = await asyncio.gather(*last)

    assert (s1.duplicate, s1.turn.text, s2.duplicate, s2.turn.text) == (
        False,
        "in flight",
        False,
        "queued behind it",
    )
    count = "SELECT client_id, count(*) FROM turns WHERE person = 'pg' GROUP BY client_id"
    assert sorted(tuple(r) for r in await db.fetch(count)) == [("s1", 1), ("s2", 1)]
    await say("s1", "resent once it landed")
    assert len(joined) == 4  # its write is over: this resend has one of its own
