"""Stream events PostgreSQL could not take now are written once it can: a reply streamed
live while its writes failed is in the record, and replayable, afterwards.

The failure is real and on demand: the test holds the events table against writes, so
each of the server's event writes waits on it, and ends every waiting backend
(`pg_terminate_backend`, what an operator's restart does to a connection), which the
server sees as PostgreSQL unavailable."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from tests.conftest import Harness, Phone

WAITING = (
    "SELECT pid FROM pg_locks WHERE NOT granted AND relation = 'events'::regclass"
    " AND pid <> pg_backend_pid()"
)


async def event_seqs(db: asyncpg.Connection, conversation: str) -> list[int]:
    rows = await db.fetch(
        "SELECT seq FROM events WHERE conversation = $1 ORDER BY seq", uuid.UUID(conversation)
    )
    return [r["seq"] for r in rows]


async def test_a_reply_whose_writes_failed_is_written_once_postgresql_takes_them(
    harness: Harness, dsn: str, db: asyncpg.Connection
) -> None:
    await harness.start(store_timeout=1.0)
    phone = await harness.phone()
    await phone.say("before the writes fail", "s0")
    await phone.reply()
    await harness.recorded()
    conversation = phone.welcome["conversation"]
    before = phone.last_seq
    stored_before = await event_seqs(db, conversation)

    holder = await asyncpg.connect(dsn)
    ended = 0
    try:
        locked = holder.transaction()
        await locked.start()
        await holder.execute("LOCK TABLE events IN SHARE MODE")
        await phone.send({"type": "say", "id": "s1", "text": "said while PostgreSQL refuses"})
        replied = asyncio.ensure_future(phone.reply())
        while not replied.done() or not ended:
            for row in await db.fetch(WAITING):
                ended += await db.fetchval("SELECT pg_terminate_backend($1)", row["pid"])
            await asyncio.sleep(0.05)
        end = await replied
        assert await event_seqs(db, conversation) == stored_before
    finally:
        await locked.rollback()
        await holder.close()

    assert ended >= 1
    # Every event but the deltas, which the stored `reply.end` holds together.
    streamed = [f for f in phone.frames if f.get("seq", 0) > before and f["type"] != "welcome"]
    assert [f["type"] for f in streamed if f["type"] != "reply.delta"] == [
        "ack", "reply.start", "reply.end"
    ]  # fmt: skip
    expected = stored_before + [f["seq"] for f in streamed if f["type"] != "reply.delta"]
    async with asyncio.timeout(10):  # the retry, a second after the last failure
        while await event_seqs(db, conversation) != expected:
            await asyncio.sleep(0.1)

    await phone.drop()
    again = Phone(harness, phone.device)
    await again.connect(conversation=conversation, last_seq=before)
    replayed = await again.expect("reply.end")
    assert replayed["seq"] == end["seq"] and replayed["text"] == end["text"]
    await again.close()
