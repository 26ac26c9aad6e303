"""The database fails over: a primary and a synchronous standby made by `stillhere db`, a
node on both hosts' DSN, a phone talking; the primary is killed with SIGKILL mid-talk and
the standby promoted. Every acked say is on the new primary once, no seq repeats, and the
phone goes on in the same conversation."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import orjson
import psutil
import pytest

from bench.procs import command_line
from storage import replication
from storage.owners import Fenced, hold, take
from storage.pool import DEAD_PEER_S, connect
from storage.store import Store
from tests.test_cluster import NODES, start_cluster, stop_cluster
from tests.test_db_command import DbProcess, running_db
from tests.test_deploy import needs_haproxy
from tests.test_restart import STILLHERE, ServerProcess, free_port

SAY_TIMEOUT_S = 60.0
STORED_SAYS = "SELECT client_id FROM turns WHERE role = 'user' AND conversation = $1"
STORED_ACKS = """
    SELECT frame->>'id' AS id, seq FROM events
    WHERE conversation = $1 AND frame->>'type' = 'ack'
"""
RESEND_PAUSE_S = 0.2
# The node's frame rate in the promotion test, far below the pace of a phone that says back
# to back, on any machine: its says are refused for rate (docs/protocol.md, Limits) from the
# second on, until a second has passed since the last one let through.
FRAME_LIMITS = ("--frames-per-s", "1", "--frame-burst", "2")


@contextlib.asynccontextmanager
async def primary_and_standby(tmp_path: Path) -> AsyncIterator[tuple[DbProcess, DbProcess]]:
    async with running_db(tmp_path / "primary", "--port", str(free_port())) as primary:
        await primary.read_dsn()
        standby_options = ("--port", str(free_port()), "--standby-of", primary.dsn)
        async with running_db(tmp_path / "standby", *standby_options) as standby:
            await standby.read_dsn()
            yield primary, standby


def both_hosts(primary: DbProcess, standby: DbProcess) -> str:
    """The multi-host DSN a node is given: whichever of the two accepts writes."""
    return both_hosts_of(primary.dsn, standby.dsn)


def port_of(dsn: str) -> int:
    port = urlsplit(dsn).port
    assert port is not None
    return port


def both_hosts_of(*dsns: str) -> str:
    hosts = ",".join(dsn.split("@")[1].split("/")[0] for dsn in dsns)
    return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"


async def fetch(dsn: str, query: str, *params: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch(query, *params)
    finally:
        await conn.close()


def answers(id_: str) -> Callable[[dict[str, Any]], bool]:
    """Whether a frame answers the say `id_`: its ack or an error naming it, or `rate_limited`,
    which names no say (the frame was dropped unread) and is the one say in flight's."""

    def answered(frame: dict[str, Any]) -> bool:
        if frame["type"] == "error" and frame["code"] == "rate_limited":
            return True
        return frame.get("id") == id_ and frame["type"] in ("ack", "error")

    return answered


class Phone:
    """Says over one WebSocket, each resent with its id until acked, as the protocol asks
    of a client that is answered `unavailable` or `rate_limited`, or loses its link."""

    def __init__(self, http: aiohttp.ClientSession, base: str) -> None:
        self.http = http
        self.base = base
        self.device = "device-" + uuid.uuid4().hex
        self.conversation: str | None = None
        self.last_seq = 0
        self.acked: dict[str, int] = {}  # say id -> its ack's seq
        self.refused: Counter[str] = Counter()  # error codes its says were answered with
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def connect(self) -> None:
        self.ws = await self.http.ws_connect(self.base + "/v1/ws")
        hello: dict[str, Any] = {"type": "hello", "v": 1, "device": self.device}
        if self.conversation is not None:
            hello |= {"conversation": self.conversation, "last_seq": self.last_seq}
        await self.ws.send_bytes(orjson.dumps(hello))
        welcome = await self._next(lambda f: f["type"] == "welcome")
        self.conversation = welcome["conversation"]

    async def _next(self, wanted: Any) -> dict[str, Any]:
        assert self.ws is not None
        while True:
            message = await self.ws.receive()
            if message.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"link ended: {message.type}")
            frame = orjson.loads(message.data)
            self.last_seq = max(self.last_seq, frame.get("seq") or 0)
            if wanted(frame):
                return frame

    async def say(self, text: str) -> None:
        """Until acked: send, and on `unavailable` or a lost link, send it again."""
        id_ = uuid.uuid4().hex
        async with asyncio.timeout(SAY_TIMEOUT_S):
            while True:
                try:
                    if self.ws is None or self.ws.closed:
                        await self.connect()
                    assert self.ws is not None
                    await self.ws.send_bytes(orjson.dumps({"type": "say", "id": id_, "text": text}))
                    frame = await self._next(answers(id_))
                except (ConnectionError, aiohttp.ClientError, OSError):
                    self.ws = None
                    await asyncio.sleep(RESEND_PAUSE_S)
                    continue
                if frame["type"] == "ack":
                    self.acked[id_] = frame["seq"]
                    return
                assert frame["code"] in ("unavailable", "rate_limited"), frame
                self.refused[frame["code"]] += 1
                await asyncio.sleep(RESEND_PAUSE_S)


async def test_the_standby_is_synchronous_and_read_only(tmp_path: Path) -> None:
    async with primary_and_standby(tmp_path) as (primary, standby):
        [row] = await fetch(
            primary.dsn, "SELECT application_name, sync_state FROM pg_stat_replication"
        )
        assert (row["application_name"], row["sync_state"]) == ("stillhere_standby", "sync")
        [recovery] = await fetch(standby.dsn, "SELECT pg_is_in_recovery() AS standby")
        assert recovery["standby"] is True
        assert await standby.stop(signal.SIGTERM) == 0
        # A standby stopped on purpose no longer holds the primary's commits back.
        [named] = await fetch(primary.dsn, "SHOW synchronous_standby_names")
        assert named["synchronous_standby_names"] == ""


async def test_a_promotion_under_load_loses_no_acked_say(tmp_path: Path) -> None:
    async with (
        primary_and_standby(tmp_path) as (primary, standby),
        aiohttp.ClientSession() as http,
    ):
        node = ServerProcess(both_hosts(primary, standby), tmp_path / "data", tmp_path / "node.log")
        try:
            await node.start(http, ["--store-timeout", "2s", *FRAME_LIMITS])
            phone = Phone(http, node.base)
            for i in range(5):
                await phone.say(f"before the failover, say {i}")
            failover = asyncio.create_task(_fail_over(primary, standby))
            after = 0
            while after < 5:
                await phone.say(f"said while failing over, say {len(phone.acked)}")
                after += failover.done()
            assert await failover == 0
        finally:
            await node.kill()
        conversation = uuid.UUID(phone.conversation)
        says = await fetch(standby.dsn, STORED_SAYS, conversation)
        acks = await fetch(standby.dsn, STORED_ACKS, conversation)
    stored = [row["client_id"] for row in says]
    assert len(set(stored)) == len(stored), "a say stored twice"
    lost = set(phone.acked) - set(stored)
    assert not lost, f"{len(lost)} of {len(phone.acked)} acked says lost"
    # An ack's stream event is written after the ack went out (docs/architecture.md,
    # Durability): one in flight when the primary died may be missing, never different.
    stored_acks = {row["id"]: row["seq"] for row in acks if row["id"] in phone.acked}
    assert all(phone.acked[id_] == seq for id_, seq in stored_acks.items())
    seqs = list(phone.acked.values())
    assert len(set(seqs)) == len(seqs), "a seq repeated"
    assert phone.refused["rate_limited"], "the phone never went over the frame rate"


class FallsSilent:
    """A TCP relay before a PostgreSQL that can fall silent, as a primary whose machine
    vanished does: nothing sent is answered, nothing is refused or closed, and a new
    connection is taken but never spoken to. (This relay's kernel still acknowledges the
    packets, so what finds it out is the node's statement and per-host connect timeouts;
    for a host truly gone its TCP keepalives would too.)"""

    def __init__(self, port: int) -> None:
        self.port = port
        self.silent = False
        self.taken = 0  # connections taken
        self._held: list[asyncio.StreamWriter] = []  # every link's writers, kept open
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.taken += 1
        self._held.append(writer)
        if self.silent:
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._held.append(up_writer)
        await asyncio.gather(self._copy(reader, up_writer), self._copy(up_reader, writer))

    async def _copy(self, source: asyncio.StreamReader, to: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(65536):
                if not self.silent:
                    to.write(data)
        if not self.silent:  # a connection closed while the relay still speaks
            to.close()

    def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._held:
            writer.transport.abort()


async def test_a_host_that_never_answers_is_passed_over_and_the_next_kept(tmp_path: Path) -> None:
    """The first host of the DSN takes connections and never speaks: a connection goes to
    the next one, with keepalives and a user timeout on its socket, and the next connection
    tries that host first."""
    async with running_db(tmp_path / "db", "--port", str(free_port())) as db:
        await db.read_dsn()
        relay = FallsSilent(port_of(db.dsn))
        relay.silent = True
        relayed = db.dsn.replace(f":{relay.port}/", f":{await relay.start()}/")
        dsn = both_hosts_of(relayed, db.dsn)
        try:
            for _ in range(2):
                conn = await connect(dsn)
                try:
                    assert await conn.fetchval("SELECT inet_server_port()") == port_of(db.dsn)
                    sock = conn._transport.get_extra_info("socket")
                    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                    user_timeout_ms = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
                    assert user_timeout_ms == DEAD_PEER_S * 1000
                finally:
                    await conn.close()
            assert relay.taken == 1  # the second connection went to the host that answered
        finally:
            relay.close()


async def test_a_primary_that_vanished_is_given_up_for_the_promoted_standby(
    tmp_path: Path,
) -> None:
    """The primary's machine vanishes (silent, no connection refused or reset) rather than
    dying in front of its kernel: the node's connections to it, pooled and new, give up
    on it, and the says go on being acked on the standby promoted after it."""
    async with (
        primary_and_standby(tmp_path) as (primary, standby),
        aiohttp.ClientSession() as http,
    ):
        relay = FallsSilent(port_of(primary.dsn))
        relayed = primary.dsn.replace(f":{relay.port}/", f":{await relay.start()}/")
        node = ServerProcess(
            both_hosts_of(relayed, standby.dsn), tmp_path / "data", tmp_path / "node.log"
        )
        try:
            await node.start(http, ["--store-timeout", "2s"])
            phone = Phone(http, node.base)
            for i in range(3):
                await phone.say(f"before it vanishes, say {i}")
            relay.silent = True
            assert await _fail_over(primary, standby) == 0
            for i in range(3):
                await phone.say(f"after the promotion, say {i}")
        finally:
            await node.kill()
            relay.close()
        says = await fetch(standby.dsn, STORED_SAYS, uuid.UUID(phone.conversation))
    assert {row["client_id"] for row in says} >= set(phone.acked)


async def _fail_over(primary: DbProcess, standby: DbProcess) -> int:
    """The primary's machine dies mid-talk; the operator's tooling promotes the standby."""
    await asyncio.sleep(0.5)
    await _machine_dies(primary)
    return await _promote(standby.data)


async def _machine_dies(db: DbProcess) -> None:
    """`db`'s PostgreSQL and `stillhere db` killed outright, every process of it (one that
    a test suspended too, which would otherwise outlive its postmaster)."""
    postmaster = db.postmaster()
    for process in [postmaster, *postmaster.children()]:
        process.kill()
    await db.stop(signal.SIGKILL)


async def _promote(data: Path) -> int:
    proc = await asyncio.create_subprocess_exec(
        str(STILLHERE), "db", "--promote", "--data", str(data)
    )
    async with asyncio.timeout(90):
        return await proc.wait()


pytestmark = pytest.mark.timeout(300)


async def test_an_epoch_taken_on_a_lost_timeline_is_never_trusted(tmp_path: Path) -> None:
    """A take the standby never received (replication asynchronous, the primary's WAL
    sender stopped) dies with the primary. The promoted standby's sequence may hand out the same
    number again; the epoch, tagged with the timeline, differs, and the old one is fenced."""
    async with primary_and_standby(tmp_path) as (primary, standby):
        await (await Store.open(primary.dsn)).close()  # migrated, on both disks
        assert await replication.unname_synchronous(primary.dsn, "stillhere_standby")
        sender = walsender(primary)
        sender.suspend()  # what the primary writes from now on stays on its disk
        lost = await _take(primary.dsn, "person-lost", "node-a")
        await _machine_dies(primary)
        assert await _promote(standby.data) == 0
        again = await _take(standby.dsn, "person-lost", "node-b")
        assert again != lost
        conn = await asyncpg.connect(standby.dsn)
        try:
            with pytest.raises(Fenced):
                async with conn.transaction():
                    await hold(conn, "person-lost", lost, lambda person, epoch: None)
        finally:
            await conn.close()


def walsender(db: DbProcess) -> psutil.Process:
    children = db.postmaster().children()
    [sender] = [p for p in children if "walsender" in " ".join(command_line(p))]
    return sender


async def _take(dsn: str, person: str, node: str) -> int:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    try:
        epoch = await take(pool, person, node, 60.0)
    finally:
        await pool.close()
    assert epoch is not None
    return epoch


@needs_haproxy
async def test_a_cluster_with_a_standby_acks_says_on_two_disks(tmp_path: Path) -> None:
    cluster = await asyncio.to_thread(start_cluster, tmp_path, options=("--standby",))
    try:
        async with aiohttp.ClientSession() as http:
            phone = Phone(http, cluster.base)
            await phone.say("one night or two?")
        db_port = cluster.port + 1 + 2 * NODES
        primary = f"postgresql://postgres@127.0.0.1:{db_port}/postgres"
        [row] = await fetch(primary, "SELECT sync_state FROM pg_stat_replication")
        assert row["sync_state"] == "sync"
        standby = f"postgresql://postgres@127.0.0.1:{db_port + 1}/postgres"
        says = await fetch(standby, STORED_SAYS, uuid.UUID(phone.conversation))
        assert [r["client_id"] for r in says] == list(phone.acked)  # acked: on its disk too
    finally:
        assert await asyncio.to_thread(stop_cluster, cluster) == 0
