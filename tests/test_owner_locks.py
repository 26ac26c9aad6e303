"""A node's lease renewal and another node's take of one of its people happen one after the
other, whichever comes first (storage/owners.py): a take under way when the renewal comes
is committed before the renewal returns, so the read that follows sees it; a take that
comes during the renewal sees the lease renewed and takes nothing. And the renewal locks no
person's row, so it never waits for their writes. Against a real PostgreSQL, each
interleaving forced by holding one side's transaction open."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest
from asyncpg.transaction import Transaction

from storage import nodes, owners
from storage.store import Store

PERSON = "p-of-a"


async def waiting_for_a_lock(db: asyncpg.Connection, query: str) -> bool:
    return bool(
        await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE $1",
            f"%{query}%",
        )
    )


async def until_waiting(db: asyncpg.Connection, query: str) -> None:
    async with asyncio.timeout(10):
        while not await waiting_for_a_lock(db, query):
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def open_transaction(dsn: str) -> AsyncIterator[tuple[asyncpg.Connection, Transaction]]:
    """A connection of its own with a transaction started, for the test to end."""
    conn = await asyncpg.connect(dsn)
    try:
        transaction = conn.transaction()
        await transaction.start()
        yield conn, transaction
    finally:
        await conn.close()


@pytest.fixture
async def node_a(store: Store, dsn: str) -> AsyncIterator[int]:
    """Node a, alive (its lock held) but its lease lapsed, owning PERSON under an epoch
    whose take's own lease has run out too: the epoch."""
    listener = await asyncpg.connect(dsn)
    try:
        assert await owners.hold_node(listener, "a")
        await nodes.started(store.pool, "a", 6.0)
        await store.pool.execute(
            "UPDATE nodes SET last_heartbeat = now() - interval '1 minute' WHERE name = 'a'"
        )
        epoch = await store.pool.fetchval(
            "INSERT INTO owners VALUES ($1, 'a', nextval('owner_epochs'), "
            "now() - interval '1 second') RETURNING epoch",
            PERSON,
        )
        yield epoch
    finally:
        await listener.close()


async def test_a_take_during_a_renewal_sees_the_lease_renewed_and_takes_nothing(
    store: Store, db: asyncpg.Connection, dsn: str, node_a: int
) -> None:
    async with open_transaction(dsn) as (renewing, renewal):
        renewed = await owners.renew(renewing, "a")
        assert renewed is not None and renewed.lapsed
        take = asyncio.create_task(owners.take_over(store.pool, PERSON, "b", 60))
        await until_waiting(db, "INSERT INTO owners")
        await renewal.commit()
        async with asyncio.timeout(10):
            assert await take is None
    assert await owners.held(store.pool, "a", [node_a]) == {node_a}


async def test_a_renewal_waits_for_a_take_under_way_and_the_read_after_it_sees_it(
    store: Store, db: asyncpg.Connection, dsn: str, node_a: int
) -> None:
    async with open_transaction(dsn) as (taking, take):
        taken = await owners.take_over(taking, PERSON, "b", 60)
        assert taken is not None and (taken.previous, taken.expired) == ("a", True)
        renewal = asyncio.create_task(owners.renew(store.pool, "a"))
        await until_waiting(db, "UPDATE nodes")
        await take.commit()
        async with asyncio.timeout(10):
            renewed = await renewal
    assert renewed is not None and renewed.lapsed
    assert await owners.held(store.pool, "a", [node_a]) == set()


async def test_a_renewal_never_waits_for_a_persons_writes(
    store: Store, dsn: str, node_a: int
) -> None:
    async with open_transaction(dsn) as (writing, write):
        # A write under way for the person holds their row (a take would wait for it).
        await writing.execute("SELECT 1 FROM owners WHERE person = $1 FOR UPDATE", PERSON)
        async with asyncio.timeout(10):
            renewed = await owners.renew(store.pool, "a")
        await write.rollback()
    assert renewed is not None and renewed.lapsed
    assert await owners.held(store.pool, "a", [node_a]) == {node_a}
