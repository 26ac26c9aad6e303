"""Fixtures: a real PostgreSQL (embedded, one per test process: each pytest-xdist worker has
its own, in its own temporary folder with its own unix socket; a fresh database per test)
and its conversation store, an injected clock, a fake OpenAI-compatible model over real
HTTP, and a phone client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp.test_utils import TestServer

from actors.clock import ManualClock
from actors.memory.keeper import MemoryKeeper
from storage import owners
from storage.embedded import EmbeddedPostgres
from storage.event_log import EventLog
from storage.store import Store
from tests.fakes.embeddings_server import FakeEmbeddings
from tests.fakes.openai_server import FakeOpenAI
from tests.memory_support import Script, close_memory, fake_server, open_memory, scripted
from transport.app import build_app, runner_options
from transport.config import Settings
from transport.server import SERVER_KEY, Server


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): two workers a core, as most of a test's time is spent
    waiting (on the servers it started, on timers, on PostgreSQL), not computing. The
    variable PYTEST_XDIST_AUTO_NUM_WORKERS overrides it."""
    chosen = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    return int(chosen) if chosen else 2 * len(os.sched_getaffinity(0))


# What a test's PostgreSQL need not do: outlive a crash of its machine. Without the flushes
# to disk, creating and dropping a database per test costs a fraction of what it does.
SCRATCH_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pg = EmbeddedPostgres(tmp_path_factory.mktemp("pg"))
    asyncio.run(_scratch(pg.dsn))
    yield pg.dsn
    pg.stop()


async def _scratch(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for name, value in SCRATCH_SETTINGS.items():
            await conn.execute(f"ALTER SYSTEM SET {name} = {value}")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


def _with_database(dsn: str, name: str) -> str:
    base, _, query = dsn.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")


@pytest.fixture
async def dsn(postgres: str) -> AsyncIterator[str]:
    """A fresh, empty database on the shared embedded server."""
    name = "t_" + uuid.uuid4().hex[:12]
    admin = await asyncpg.connect(postgres)
    await admin.execute(f"CREATE DATABASE {name}")
    yield _with_database(postgres, name)
    await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
    await admin.close()


@pytest.fixture
async def db(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn)
    yield conn
    await conn.close()


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[Store]:
    """The conversation store, migrated, on a fresh database."""
    opened = await Store.open(dsn)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Script:
    """Chosen cosines for the fake embeddings server, for this test."""
    return scripted(monkeypatch)


@pytest.fixture
async def fake_embeddings() -> AsyncIterator[FakeEmbeddings]:
    async with fake_server() as fake:
        yield fake


@pytest.fixture
async def keeper(
    dsn: str, fake_embeddings: FakeEmbeddings, clock: ManualClock
) -> AsyncIterator[MemoryKeeper]:
    store, keeper = await open_memory(dsn, fake_embeddings.url, clock)
    yield keeper
    await close_memory(store, keeper)


@pytest.fixture
async def local_keeper(dsn: str, clock: ManualClock) -> AsyncIterator[MemoryKeeper]:
    """A keeper on the local default embedder: MiniLM and USE multilingual, paired."""
    from actors.memory.setup import close_keeper, make_embedder, open_keeper
    from providers.embedding import EmbeddingError
    from storage.store import Store

    try:
        embedder = make_embedder()
    except EmbeddingError as missing:
        pytest.skip(f"local model weights not installed: {missing}")
    store = await Store.open(dsn)
    keeper = await open_keeper(dsn, embedder, clock)
    # What these tests look at is recognition: a model loading slowly on a busy machine
    # must not store a memory without its fingerprint (that path is test_memory's).
    keeper.fingerprint_wait = 60.0
    try:
        yield keeper
    finally:
        await close_keeper(keeper)
        await store.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


async def own(store: Store, person: str) -> int:
    """Take `person` as node "test" with a long lease: the epoch their writes go under."""
    epoch = await owners.take(store.pool, person, "test", 3600)
    assert epoch is not None, f"{person} is owned by another node"
    return epoch


async def eventually(predicate: Any, timeout: float = 10.0) -> None:
    """Wait until `predicate()` holds: for effects the server notices on its own (a drop)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def loop_turns() -> AsyncIterator[Callable[[], int]]:
    """How often the loop has come round to other work, while the block runs: two readings
    that differ had the loop run something else between them."""
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other_work())
    try:
        yield lambda: turns
    finally:
        task.cancel()


async def renewals(db: asyncpg.Connection, count: int, node: str = "a") -> None:
    """Until `node` has renewed its lease `count` times more (its heartbeat moved on). Just
    after one, the next is a third of the lease away: a test that fakes a lapsed lease has
    that long before the node, which is not really paused, renews it again."""
    beat = "SELECT last_heartbeat FROM nodes WHERE name = $1"
    for _ in range(count):
        last = await db.fetchval(beat, node)
        async with asyncio.timeout(10):
            while await db.fetchval(beat, node) == last:
                await asyncio.sleep(0.02)


class HeldReplies:
    """The first write that carries a reply waits until released, and so do the event
    log's writes after it (they go in order): a reply ended, not yet in the record."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        execute = EventLog._execute

        async def held(log: EventLog, events: list[Any], replies: list[Any]) -> bool:
            if replies and not self.release.is_set():
                self.reached.set()
                await self.release.wait()
            return await execute(log, events, replies)

        monkeypatch.setattr(EventLog, "_execute", held)


@pytest.fixture
def held_replies(monkeypatch: pytest.MonkeyPatch) -> HeldReplies:
    return HeldReplies(monkeypatch)


# The rehearsal model answering at once, as the tests expect unless they pace it themselves
# (its default is a reader's pace).
INSTANT_REHEARSAL = {"rehearsal_latency": 0.0, "rehearsal_rate": 0.0}
INSTANT_OPTIONS = ["--rehearsal-latency", "0s", "--rehearsal-rate", "0"]


class Harness:
    """A running stillhere server (in this process) and ways to talk to it."""

    def __init__(self, dsn: str, clock: ManualClock, data_dir: Path) -> None:
        self.dsn = dsn
        self.clock = clock
        self.data_dir = data_dir
        self.test_server: TestServer | None = None
        self.http = aiohttp.ClientSession()

    async def start(self, **overrides: Any) -> Harness:
        settings = Settings(
            db=self.dsn,
            data_dir=self.data_dir,
            secret="test-secret-of-at-least-32-bytes",
            **(INSTANT_REHEARSAL | overrides),
        )
        app = build_app(settings, clock=self.clock)
        self.test_server = TestServer(app)
        # start_server's options reach the runner; TestServer's own drops them silently.
        await self.test_server.start_server(**runner_options(settings))
        return self

    async def stop(self) -> None:
        if self.test_server is not None:
            await self.test_server.close()
            self.test_server = None

    @property
    def server(self) -> Server:
        assert self.test_server is not None
        return self.test_server.app[SERVER_KEY]

    def url(self, path: str) -> str:
        assert self.test_server is not None
        return str(self.test_server.make_url(path))

    async def phone(self, device: str | None = None, **hello: Any) -> Phone:
        phone = Phone(self, device or "device-" + uuid.uuid4().hex)
        await phone.connect(**hello)
        return phone

    def person(self, phone: HasDevice) -> str:
        return self.server.identity.person(device=phone.device)

    def links(self, phone: HasDevice) -> int:
        """How many links the server has attached to this phone's conversation."""
        live = self.server.directory.get(self.person(phone))
        return 0 if live is None else len(live.stream.links)

    async def recorded(self) -> None:
        """Wait until every live conversation's record holds all its phones were sent: a
        `reply.end` goes out beside its reply's write, not after it."""
        for live in self.server.directory.lives():
            await live.stream.written()

    async def sweep(self) -> dict[str, Any] | None:
        from actors.runtime import Reply
        from actors.supervisor import Sweep

        reply = Reply(asyncio.get_running_loop())
        self.server.supervisor.tell(Sweep(reply))
        return await reply.wait()


class HasDevice(Protocol):
    """A test's raw phone or the reference client's: either says which device it is."""

    @property
    def device(self) -> str | None: ...


class Phone:
    """A WebSocket client speaking protocol v1, recording every frame it receives."""

    def __init__(self, harness: Harness, device: str) -> None:
        self.harness = harness
        self.device = device
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.frames: list[dict[str, Any]] = []
        self.welcome: dict[str, Any] = {}
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None

    async def connect(self, **hello: Any) -> dict[str, Any]:
        self.ws = await self.harness.http.ws_connect(self.harness.url("/v1/ws"))
        self._reader = asyncio.get_running_loop().create_task(self._read())
        frame = {"type": "hello", "v": 1, "device": self.device, **hello}
        await self.send(frame)
        self.welcome = await self.expect("welcome")
        return self.welcome

    async def _read(self) -> None:
        assert self.ws is not None
        async for message in self.ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                frame = orjson.loads(message.data)
                self.frames.append(frame)
                self._inbox.put_nowait(frame)

    async def send(self, frame: dict[str, Any] | str) -> None:
        assert self.ws is not None
        await self.ws.send_str(frame if isinstance(frame, str) else orjson.dumps(frame).decode())

    async def say(self, text: str, id_: str | None = None) -> dict[str, Any]:
        id_ = id_ or uuid.uuid4().hex
        await self.send({"type": "say", "id": id_, "text": text})
        return await self.expect("ack", lambda f: f["id"] == id_)

    async def expect(self, type_: str, match: Any = None, timeout: float = 10.0) -> dict[str, Any]:
        """The next frame of this type (and matching), skipping others."""
        async with asyncio.timeout(timeout):
            while True:
                frame = await self._inbox.get()
                if frame["type"] == type_ and (match is None or match(frame)):
                    return frame

    async def reply(self, timeout: float = 10.0) -> dict[str, Any]:
        return await self.expect("reply.end", timeout=timeout)

    @property
    def last_seq(self) -> int:
        return max(
            (f["seq"] for f in self.frames if "seq" in f and f["type"] != "welcome"),
            default=self.welcome.get("seq", 0),
        )

    async def drop(self) -> None:
        """The link dies without a close handshake (a tunnel)."""
        assert self.ws is not None and self._reader is not None
        transport = self.ws._response.connection.transport  # type: ignore[union-attr]
        if transport is not None:
            transport.abort()
        self._reader.cancel()
        self.ws = None

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            self._reader.cancel()


@pytest.fixture
async def harness(dsn: str, clock: ManualClock, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(dsn, clock, tmp_path)
    yield h
    await h.stop()
    await h.http.close()


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
