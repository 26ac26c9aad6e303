"""A lease renewal and a batch of fenced writes lock owner rows in one order, so neither
waits for the other while holding a row the other waits for: PostgreSQL would end one of
them as a deadlock, the renewal's leases or every say of the batch. Against a real
PostgreSQL, with the interleaving that deadlocked forced by a third transaction."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg

from storage import owners
from storage.store import Store
from tests.conftest import own

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


async def waiting_for_a_lock(db: asyncpg.Connection, query: str) -> bool:
    return bool(
        await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE $1",
            f"%{query}%",
        )
    )


async def test_a_renewal_and_a_batch_of_says_never_deadlock(
    store: Store, db: asyncpg.Connection, dsn: str
) -> None:
    # Taken in this order, the rows lie on disk as b then a: a renewal that locked them in
    # the order it scans them would take b first.
    epoch_b, epoch_a = await own(store, "p-b"), await own(store, "p-a")
    talk_b = await store.create_conversation("p-b", NOW, epoch_b)
    talk_a = await store.create_conversation("p-a", NOW, epoch_a)

    other = await asyncpg.connect(dsn)
    try:
        # Another reader of a's row, in share mode: the says' fence passes it, the renewal
        # waits for it.
        holding = other.transaction()
        await holding.start()
        await other.execute("SELECT 1 FROM owners WHERE person = 'p-a' FOR SHARE")
        renewal = asyncio.create_task(owners.renew(store.pool, "test", [epoch_b, epoch_a], 3600))
        async with asyncio.timeout(10):
            while not await waiting_for_a_lock(db, "UPDATE owners"):
                await asyncio.sleep(0.01)
        says = asyncio.gather(
            store.add_say(talk_a, "p-a", "s-a", "one night", NOW, 1, epoch_a),
            store.add_say(talk_b, "p-b", "s-b", "two nights", NOW, 1, epoch_b),
        )
        # The batch is through, or (locking in another order) waits for the renewal.
        async with asyncio.timeout(10):
            while not says.done() and not await waiting_for_a_lock(db, "INSERT INTO turns"):
                await asyncio.sleep(0.01)
        await holding.commit()
        async with asyncio.timeout(10):
            stored = await says
            renewed = await renewal
    finally:
        await other.close()

    assert [s.duplicate for s in stored] == [False, False]
    assert await db.fetchval("SELECT count(*) FROM turns WHERE role = 'user'") == 2
    assert renewed == {epoch_a, epoch_b}
