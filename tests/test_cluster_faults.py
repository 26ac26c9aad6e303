"""A node that stops or dies while it owns a person, in a real `stillhere cluster`.

Real node processes on the cluster's embedded PostgreSQL; the phones speak to each node
directly (node-i listens on the cluster's port + i), so which node serves a hello is the
test's choice, not HAProxy's. The nodes run with a short lease, so a paused owner's people
are taken over soon, and a slow rehearsal model, so a reply is still streaming when its
node is killed.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest

from bench.flap_db import dsn_of, stillhere_person
from tests.test_cluster import Cluster, start_cluster, stop_cluster
from tests.test_deploy import HAPROXY, needs_haproxy
from tests.test_restart import Client

LEASE = "1s"
WORDS_PER_S = "8"  # a story (about 100 words) streams for over ten seconds
# The longest a node may wait for a person whose owner hangs (docs/architecture.md).
TAKEOVER_BOUND_S = 10.0
STORY = "Tell me a story about a lighthouse."

# Everything stored for a person, in an order that does not depend on how it was read.
PERSON_ROWS = {
    "conversations": "SELECT * FROM conversations WHERE person = $1 ORDER BY id",
    "turns": "SELECT * FROM turns WHERE person = $1 ORDER BY id",
    "events": "SELECT e.* FROM events e JOIN conversations c ON c.id = e.conversation"
    " WHERE c.person = $1 ORDER BY e.conversation, e.seq",
    "cards": "SELECT * FROM cards WHERE person = $1 ORDER BY id",
    "reminders": "SELECT * FROM reminders WHERE person = $1 ORDER BY id",
    "owners": "SELECT node, epoch FROM owners WHERE person = $1",  # its expiry is renewed
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if HAPROXY is None:
        pytest.skip("HAProxy is not installed (apt-get install haproxy)")
    serve = ["--lease", LEASE, "--rehearsal-rate", WORDS_PER_S]
    running = start_cluster(tmp_path_factory.mktemp("faults"), "cluster.log", *serve)
    yield running
    stop_cluster(running)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def db(cluster: Cluster) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn_of(cluster.data / "pgdata"))
    yield conn
    await conn.close()


def person_of(cluster: Cluster, device: str) -> str:
    return stillhere_person((cluster.data / "secret").read_text().strip(), device)


async def node_hello(
    http: aiohttp.ClientSession, cluster: Cluster, node: int, **fields: Any
) -> tuple[Client, dict[str, Any]]:
    """A WebSocket straight to node-`node`, its hello answered (within the takeover bound)."""
    ws = await http.ws_connect(f"ws://127.0.0.1:{cluster.port + node}/v1/ws")
    client = Client(ws)
    await client.send({"type": "hello", "v": 1, **fields})
    return client, await client.expect("welcome", timeout=TAKEOVER_BOUND_S)


async def rows(db: asyncpg.Connection, person: str) -> dict[str, list[tuple[Any, ...]]]:
    return {
        name: [tuple(r) for r in await db.fetch(sql, person)] for name, sql in PERSON_ROWS.items()
    }


async def stored(db: asyncpg.Connection, conversation: str, *seqs: int) -> None:
    """Until the events `seqs` of `conversation` are in the event log: an event is written
    beside its frame, not before it leaves (a reply's turn in the same statement)."""
    query = "SELECT count(*) FROM events WHERE conversation = $1 AND seq = ANY($2::bigint[])"
    async with asyncio.timeout(TAKEOVER_BOUND_S):
        while await db.fetchval(query, uuid.UUID(conversation), list(seqs)) < len(seqs):
            await asyncio.sleep(0.02)


async def link_end(client: Client) -> tuple[list[dict[str, Any]], int | None]:
    """The frames a link still brings until it ends, and the code its close frame carried
    (aiohttp's `close_code` turns to 1006 when its answer to that frame cannot be written)."""
    async with asyncio.timeout(TAKEOVER_BOUND_S):
        while (message := await client.ws.receive()).type == aiohttp.WSMsgType.TEXT:
            client.frames.append(orjson.loads(message.data))
    closed = message.type == aiohttp.WSMsgType.CLOSE
    return client.frames, message.data if closed else client.ws.close_code


async def until_ready(http: aiohttp.ClientSession, cluster: Cluster, node: int) -> None:
    """Until node-`node` answers `/readyz` 200 (the cluster may be starting it again)."""
    async with asyncio.timeout(120):
        while True:
            try:
                async with http.get(f"http://127.0.0.1:{cluster.port + node}/readyz") as answer:
                    if answer.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)


@needs_haproxy
async def test_a_paused_owner_is_taken_over_and_once_continued_writes_nothing(
    cluster: Cluster, http: aiohttp.ClientSession, db: asyncpg.Connection
) -> None:
    """node-1 owns a person and is SIGSTOPped; their hello on node-2 is welcomed once the
    lease has run out, with the conversation. A say sent meanwhile on the old link waits
    in node-1's socket; continued, node-1 finds it lost the person: it stores and acks
    nothing (every row of the person is as node-2 left it) and ends the stale link."""
    await until_ready(http, cluster, 1)
    device = "device-" + uuid.uuid4().hex
    person = person_of(cluster, device)
    stale, welcome = await node_hello(http, cluster, 1, device=device)
    _, first = await stale.say("Hello from the first node.")
    await stored(db, welcome["conversation"], first["seq"])
    paused = cluster.node("node-1")
    paused.send_signal(signal.SIGSTOP)
    try:
        await stale.send({"type": "say", "id": "stale-say", "text": "Said to a paused node."})
        moved, again = await node_hello(
            http, cluster, 2, device=device, conversation=welcome["conversation"], last_seq=0
        )
        assert again["resumed"] is True and again["conversation"] == welcome["conversation"]
        assert again["history"][0]["text"] == "Hello from the first node."
        assert await db.fetchval("SELECT node FROM owners WHERE person = $1", person) == "node-2"
        ack, answered = await moved.say("Hello from the second node.")
        assert ack["seq"] > max(stale.seqs)
        await stored(db, welcome["conversation"], answered["seq"])
        before = await rows(db, person)
    finally:
        seen = len(stale.frames)
        paused.send_signal(signal.SIGCONT)

    frames, code = await link_end(stale)
    assert not [f for f in frames[seen:] if "seq" in f]  # no event streamed, the say unacked
    byes = [f for f in frames if f["type"] == "bye"]
    assert code == 4001 and [b["reason"] for b in byes] in ([], ["moved"]), (code, frames)
    # node-1 renews its leases every third of one: two leases more find it settled.
    await asyncio.sleep(2 * float(LEASE.rstrip("s")))
    assert await rows(db, person) == before
    assert await db.fetchval("SELECT count(*) FROM turns WHERE client_id = 'stale-say'") == 0
    ack, _ = await moved.say("Still here?")  # node-2 goes on as before
    assert ack["seq"] > answered["seq"]
    await moved.ws.close()


@needs_haproxy
async def test_a_node_killed_mid_reply_leaves_its_stored_part_to_the_new_owner(
    cluster: Cluster, http: aiohttp.ClientSession, db: asyncpg.Connection
) -> None:
    """node-1 streams a long reply and is killed with SIGKILL; the person's hello on
    node-2 is welcomed with the conversation, and the replay from the hello's `last_seq`
    brings what node-1 stored of that turn (the say's ack, the reply's start), never a
    seq it sent already; the conversation then goes on on node-2."""
    await until_ready(http, cluster, 1)
    device = "device-" + uuid.uuid4().hex
    old, welcome = await node_hello(http, cluster, 1, device=device)
    await old.send({"type": "say", "id": "story", "text": STORY})
    ack = await old.expect("ack", lambda f: f["id"] == "story")
    start = await old.expect("reply.start", lambda f: "story" in f["in_reply_to"])
    await old.expect("reply.delta")
    await stored(db, welcome["conversation"], ack["seq"], start["seq"])
    cluster.node("node-1").send_signal(signal.SIGKILL)
    frames, _ = await link_end(old)
    assert not [f for f in frames if f["type"] == "reply.end"]  # killed mid-reply
    sent = max(old.seqs)

    new, again = await node_hello(
        http, cluster, 2, device=device, conversation=welcome["conversation"],
        last_seq=welcome["seq"],
    )  # fmt: skip
    assert again["resumed"] is True and again["conversation"] == welcome["conversation"]
    assert again["seq"] >= sent
    assert [t["text"] for t in again["history"]] == [STORY]
    replayed = await new.expect("reply.start")
    assert replayed["reply"] == start["reply"]
    assert [(f["type"], f["seq"]) for f in new.frames[1:]] == [
        ("ack", ack["seq"]),
        ("reply.start", start["seq"]),
    ]

    next_ack, end = await new.say("And then?")
    assert next_ack["seq"] > sent
    assert end["seq"] > next_ack["seq"] and end["text"]
    assert (
        await db.fetchval("SELECT node FROM owners WHERE person = $1", person_of(cluster, device))
        == "node-2"
    )
    await new.ws.close()


@needs_haproxy
async def test_a_reminder_fires_once_when_its_person_moves_and_resends(
    cluster: Cluster, http: aiohttp.ClientSession, db: asyncpg.Connection
) -> None:
    """A reminder scheduled on node-1 while its reply streams; the person's next hello
    reaches node-2, which takes them over, and the phone resends the say (as an outbox
    that lost the ack would). node-2 replays the stored `reminder` and acks the resend
    with its first seq: one row, one event, nothing scheduled again."""
    await until_ready(http, cluster, 1)
    await until_ready(http, cluster, 2)
    device = "device-" + uuid.uuid4().hex
    person = person_of(cluster, device)
    old, welcome = await node_hello(http, cluster, 1, device=device)
    say = {"type": "say", "id": "remind", "text": "Remind me to call Mum tomorrow at 9."}
    await old.send(say)
    ack = await old.expect("ack", lambda f: f["id"] == "remind")
    fired = await old.expect("reminder")
    await stored(db, welcome["conversation"], fired["seq"])

    new, again = await node_hello(
        http, cluster, 2, device=device, conversation=welcome["conversation"],
        last_seq=welcome["seq"],
    )  # fmt: skip
    assert again["resumed"] is True
    _, code = await link_end(old)
    assert code == 4001
    await new.send(say)
    assert (await new.expect("ack", lambda f: f["id"] == "remind"))["seq"] == ack["seq"]
    await new.expect("reply.end")

    replayed = [f for f in new.frames if f["type"] == "reminder"]
    assert [(f["seq"], f["reminder"]["id"]) for f in replayed] == [
        (fired["seq"], fired["reminder"]["id"])
    ]
    assert fired["reminder"]["due"] == "tomorrow at 9"
    assert await db.fetchval("SELECT count(*) FROM reminders WHERE person = $1", person) == 1
    events = (
        "SELECT count(*) FROM events e JOIN conversations c ON c.id = e.conversation"
        " WHERE c.person = $1 AND e.frame->>'type' = 'reminder'"
    )
    assert await db.fetchval(events, person) == 1
    await new.ws.close()
