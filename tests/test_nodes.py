"""Two nodes on one PostgreSQL: one owner per person, handoffs, fencing, one archive.

Both nodes run in this process (each a whole server: its own pool, notices connection,
ownership and actors), on the test's database; phones speak to one node or the other.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from actors.clock import ManualClock
from storage import owners
from storage.notices import APPLICATION_NAME
from tests.conftest import Harness, Phone, eventually, renewals

ANSWER_S = 0.3  # how long a slow phone takes to answer the server's close


@pytest.fixture
async def nodes(dsn: str, clock: ManualClock, tmp_path: Path) -> AsyncIterator[list[Harness]]:
    pair = [Harness(dsn, clock, tmp_path / name) for name in ("a", "b")]
    for harness, name in zip(pair, ("a", "b"), strict=True):
        await harness.start(node_id=name)
    yield pair
    for harness in pair:
        await harness.stop()
        await harness.http.close()


@pytest.fixture
async def quick(dsn: str, clock: ManualClock, tmp_path: Path) -> AsyncIterator[Harness]:
    """Node a alone, with a short lease: it renews every 0.2 s."""
    a = await Harness(dsn, clock, tmp_path).start(node_id="a", lease=0.6)
    yield a
    await a.stop()
    await a.http.close()


async def owner(db: asyncpg.Connection, harness: Harness, phone: Phone) -> str | None:
    return await db.fetchval("SELECT node FROM owners WHERE person = $1", harness.person(phone))


async def taken_by_another_node(db: asyncpg.Connection, person: str) -> None:
    """Another node took the person while the one running them did not know (as after a
    pause of that node): a new owner and epoch, behind its back."""
    await db.execute(
        "UPDATE owners SET node = 'b', epoch = nextval('owner_epochs') WHERE person = $1", person
    )


async def closed_with(phone: Phone) -> int | None:
    assert phone.ws is not None
    await eventually(lambda: phone.ws is not None and phone.ws.closed)
    return phone.ws.close_code if phone.ws is not None else None


async def test_a_person_moves_to_the_node_they_reach_with_history_and_seq_intact(
    nodes: list[Harness], db: asyncpg.Connection
) -> None:
    a, b = nodes
    first = await a.phone()
    await first.say("one night or two?", "s1")
    await first.reply()
    assert await owner(db, a, first) == "a"
    welcome = first.welcome

    there = Phone(b, first.device)
    moved = await there.connect(conversation=welcome["conversation"], last_seq=first.last_seq)

    assert (await first.expect("bye"))["reason"] == "moved"
    assert await closed_with(first) == 4001
    assert moved["conversation"] == welcome["conversation"] and moved["resumed"] is True
    assert moved["route"] == welcome["route"]  # the person's, whichever node answers
    assert moved["history"][0]["text"] == "one night or two?"
    assert moved["seq"] == first.last_seq  # nothing new meanwhile; it goes on from there
    assert await owner(db, b, there) == "b"
    assert a.server.directory.get(a.person(first)) is None  # let go on the old node

    await there.say("two", "s2")
    end = await there.reply()
    assert end["seq"] > moved["seq"]
    says = await db.fetch("SELECT client_id FROM turns WHERE role = 'user' ORDER BY place")
    assert [r["client_id"] for r in says] == ["s1", "s2"]
    await there.close()


async def test_two_links_racing_onto_two_nodes_end_with_one_owner_and_nothing_doubled(
    nodes: list[Harness], db: asyncpg.Connection
) -> None:
    a, b = nodes
    device = "device-racing-" + "x" * 20
    here, there = Phone(a, device), Phone(b, device)
    await asyncio.gather(here.connect(), there.connect())
    person = a.person(here)

    def settled() -> bool:
        lives = [h.server.directory.get(person) for h in nodes]
        return sum(live is not None for live in lives) == 1

    await eventually(settled)
    rows = await db.fetch("SELECT node FROM owners WHERE person = $1", person)
    assert len(rows) == 1
    winner = {"a": (a, here), "b": (b, there)}[rows[0]["node"]]
    phone = winner[1]
    if phone.ws is None or phone.ws.closed:  # moved after all: the phone comes back
        phone = Phone(winner[0], device)
        await phone.connect()
    await phone.say("just once", "once")
    await phone.reply()
    assert await db.fetchval("SELECT count(*) FROM conversations WHERE person = $1", person) == 1
    count = "SELECT count(*) FROM turns WHERE person = $1 AND client_id = 'once'"
    assert await db.fetchval(count, person) == 1
    for p in (here, there):
        await p.close()


async def test_a_node_that_lost_a_person_writes_nothing_more_and_closes_their_links(
    nodes: list[Harness], db: asyncpg.Connection
) -> None:
    a, _ = nodes
    phone = await a.phone()
    await phone.say("before", "s1")
    await phone.reply()
    await a.recorded()
    person = a.person(phone)
    turns_before = await db.fetch("SELECT * FROM turns ORDER BY id")
    events_before = await db.fetch("SELECT * FROM events ORDER BY seq")
    await taken_by_another_node(db, person)

    await phone.send({"type": "say", "id": "s2", "text": "after"})

    assert (await phone.expect("bye"))["reason"] == "moved"
    assert await closed_with(phone) == 4001
    assert not [f for f in phone.frames if f["type"] == "ack" and f["id"] == "s2"]
    assert await db.fetch("SELECT * FROM turns ORDER BY id") == turns_before
    assert await db.fetch("SELECT * FROM events ORDER BY seq") == events_before
    await eventually(lambda: a.server.directory.get(person) is None)
    assert await db.fetchval("SELECT node FROM owners WHERE person = $1", person) == "b"


async def test_a_person_taken_once_the_nodes_lease_lapsed_is_noticed_at_the_next_renewal(
    quick: Harness, db: asyncpg.Connection
) -> None:
    a = quick
    phone = await a.phone()
    person = a.person(phone)
    await phone.say("before", "s1")
    await phone.reply()
    # Node a's lease lapses (as after a pause of it), and the person's own with it:
    # another node takes them, and a learns it from its next renewal, with no write. A
    # renewal of a's landing between the ageing and the take un-lapses the lease (a is not
    # really paused), and the take rightly finds a live owner: age it again.
    taken = None
    async with asyncio.timeout(10):
        while taken is None:
            await db.execute(
                "UPDATE owners SET expires_at = now() - interval '1 second' WHERE person = $1",
                person,
            )
            await db.execute(
                "UPDATE nodes SET last_heartbeat = now() - interval '1 minute' WHERE name = 'a'"
            )
            taken = await owners.take_over(a.server.runtime.store.pool, person, "b", 60)
    assert (taken.previous, taken.expired) == ("a", True)
    assert (await phone.expect("bye"))["reason"] == "moved"
    assert await closed_with(phone) == 4001
    await eventually(lambda: a.server.directory.get(person) is None)


async def test_a_person_taken_while_the_nodes_lock_was_free_is_noticed_once_it_is_back(
    quick: Harness, db: asyncpg.Connection
) -> None:
    """The node's listening connection ends (its lock with it): another node takes a
    person at once. The node is sure of nobody from its next renewal, and once connected
    again it reads which epochs still hold and lets the person go; the others stay."""
    a = quick
    ownership = a.server.directory.ownership
    phone, stays = await a.phone(), await a.phone()
    person = a.person(phone)
    await eventually(lambda: ownership.sure(person) and ownership.sure(a.person(stays)))
    await db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = $1 AND datname = current_database()",
        APPLICATION_NAME,
    )
    taken = None
    async with asyncio.timeout(10):
        while taken is None:
            taken = await owners.take_over(a.server.runtime.store.pool, person, "b", 60)
    assert (taken.previous, taken.expired) == ("a", False)  # its lease ran on
    await eventually(lambda: not ownership.sure(a.person(stays)))
    assert (await phone.expect("bye"))["reason"] == "moved"
    await eventually(lambda: ownership.sure(a.person(stays)))
    assert a.server.directory.get(a.person(stays)) is not None
    assert stays.ws is not None and not stays.ws.closed


async def test_a_renewal_that_comes_back_late_reads_what_was_taken_meanwhile(
    quick: Harness, db: asyncpg.Connection, dsn: str
) -> None:
    """Node a's renewal is held up in PostgreSQL (a reader holds its row in share mode, as a
    take does) until its lease has lapsed, and another node takes a person meanwhile. The
    renewal's own statement began before the lapse and finds the lease unlapsed: what
    tells a is that the renewal came back after its sure time."""
    a = quick
    phone = await a.phone()
    person = a.person(phone)
    await renewals(db, 1)  # a renewal went through since: the next one reads nothing unless late
    holding = await asyncpg.connect(dsn)
    try:
        async with holding.transaction():
            await holding.execute("SELECT 1 FROM nodes WHERE name = 'a' FOR SHARE")
            await eventually(lambda: not a.server.directory.ownership.sure(person))
            async with asyncio.timeout(10):
                while (taken := await owners.take_over(db, person, "b", 60)) is None:
                    await asyncio.sleep(0.05)  # until both leases, the node's and the take's, end
            assert (taken.previous, taken.expired) == ("a", True)
    finally:
        await holding.close()
    assert (await phone.expect("bye"))["reason"] == "moved"
    await eventually(lambda: a.server.directory.get(person) is None)


async def test_a_renewal_writes_the_nodes_row_alone_whatever_its_people(
    quick: Harness, db: asyncpg.Connection
) -> None:
    a = quick
    phones = [await a.phone() for _ in range(3)]
    rows = "SELECT person, epoch, expires_at, xmin::text AS version FROM owners ORDER BY 1"
    before = await db.fetch(rows)
    await renewals(db, 2)
    assert await db.fetch(rows) == before  # no person's row written
    # Each person's lease is the node's now, later than the one their take gave them.
    leases = await db.fetch(
        f"SELECT o.expires_at AS own, {owners.PERSON_LEASE_END} AS lease,"
        f" (SELECT {owners.LEASE_END} FROM nodes n WHERE n.name = 'a') AS node FROM owners o"
    )
    assert len(leases) == len(phones)
    assert all(r["lease"] == r["node"] > r["own"] for r in leases)


async def test_an_idle_conversation_left_by_a_stopped_node_is_archived_once(
    nodes: list[Harness], db: asyncpg.Connection, clock: ManualClock
) -> None:
    a, b = nodes
    phone = await a.phone()
    await phone.say("see you", "s1")
    await phone.reply()
    person = a.person(phone)
    await phone.close()
    await a.server.directory.hand_over(person)  # as a node that stops: released, not ended
    assert await db.fetchval("SELECT count(*) FROM owners") == 0

    clock.advance(a.server.runtime.settings.resume_window_s + 60)
    reports = await asyncio.gather(a.sweep(), b.sweep())

    assert sum(r["archived"] for r in reports if r is not None) == 1
    status = await db.fetchval("SELECT status FROM conversations WHERE person = $1", person)
    assert status == "archived"
    assert await db.fetchval("SELECT count(*) FROM owners") == 0  # released after


async def test_a_second_process_with_the_same_node_name_is_refused(
    nodes: list[Harness], dsn: str, clock: ManualClock, tmp_path: Path
) -> None:
    twin = Harness(dsn, clock, tmp_path / "twin")
    supervisors = len(supervisor_threads())
    try:
        with pytest.raises(Exception, match="node 'a' already runs"):
            await twin.start(node_id="a")
    finally:
        await twin.http.close()
    assert len(supervisor_threads()) == supervisors  # none left to keep the process alive


def supervisor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("Supervisor")]


async def test_the_route_is_the_persons_and_reveals_nothing(nodes: list[Harness]) -> None:
    a, b = nodes
    one = await a.phone()
    again = Phone(b, one.device)
    await again.connect()
    other = await a.phone()
    route = one.welcome["route"]
    assert again.welcome["route"] == route != other.welcome["route"]
    assert len(route) <= 32 and route.replace("-", "").replace("_", "").isalnum()
    assert route not in (one.device, a.person(one))
    async with b.http.ws_connect(b.url(f"/v1/ws?r={route}")) as ws:  # `r` accepted as is
        await ws.send_json({"type": "hello", "v": 1, "device": one.device})
        assert (await ws.receive_json())["type"] == "welcome"
    for p in (one, again, other):
        await p.close()


async def test_a_phone_slow_to_answer_the_close_still_sees_4001(nodes: list[Harness]) -> None:
    """The old node closes a moved person's link with 4001 and waits for the phone's own
    close frame before dropping the connection: a phone that answers the close a moment
    later still has the code (dropped at once, its library reported 1006)."""
    a, b = nodes
    device = "device-" + uuid.uuid4().hex
    async with a.http.ws_connect(a.url("/v1/ws"), autoclose=False) as ws:
        await ws.send_json({"type": "hello", "v": 1, "device": device})
        welcome = await ws.receive_json()
        await Phone(b, device).connect(conversation=welcome["conversation"])
        message = await ws.receive(timeout=10)
        while message.type is aiohttp.WSMsgType.TEXT:  # the bye
            message = await ws.receive(timeout=10)
        assert (message.type, message.data) == (aiohttp.WSMsgType.CLOSE, 4001)
        await asyncio.sleep(ANSWER_S)  # the phone answers the close a moment later
        await ws.close()
        assert ws.close_code == 4001
