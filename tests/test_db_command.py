"""`stillhere db`: the embedded PostgreSQL alone, as a real process, reached at the DSN it
prints, stopped by a signal with nothing left running."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import psutil
import pytest

from tests.test_restart import ROOT, STILLHERE, free_port

START_TIMEOUT = 120.0  # a first start runs initdb


class DbProcess:
    """`stillhere db OPTIONS` running, its DSN read from its first line of output."""

    def __init__(self, proc: asyncio.subprocess.Process, data: Path) -> None:
        self.proc = proc
        self.data = data
        self.dsn = ""

    async def read_dsn(self) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(START_TIMEOUT):
            line = await self.proc.stdout.readline()
        if not line:
            stderr = await self.proc.stderr.read() if self.proc.stderr else b""
            raise AssertionError(f"stillhere db printed no DSN:\n{stderr.decode()}")
        self.dsn = line.decode().strip()
        return self.dsn

    def postmaster(self) -> psutil.Process:
        pid = int((self.data / "pgdata" / "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)

    async def stop(self, signo: signal.Signals) -> int:
        self.proc.send_signal(signo)
        async with asyncio.timeout(60):
            return await self.proc.wait()


@contextlib.asynccontextmanager
async def running_db(data: Path, *options: str) -> AsyncIterator[DbProcess]:
    proc = await asyncio.create_subprocess_exec(
        str(STILLHERE),
        "db",
        "--data-dir",
        str(data),
        *options,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    db = DbProcess(proc, data)
    try:
        yield db
    finally:
        await _stopped(db)


async def _stopped(db: DbProcess) -> None:
    """`db`, if still running, stopped as an operator would (SIGTERM: it stops its
    PostgreSQL); killed with its postmaster if that does not do, since killed outright
    `stillhere db` leaves its PostgreSQL running, and a test leaves no server behind."""
    if db.proc.returncode is not None:
        return
    try:
        await db.stop(signal.SIGTERM)
    except TimeoutError:
        with contextlib.suppress(FileNotFoundError, ValueError, psutil.NoSuchProcess):
            db.postmaster().kill()  # its other processes follow the postmaster out
        db.proc.kill()
        await db.proc.wait()


def gone(process: psutil.Process) -> bool:
    """Exited: no longer running, or a zombie its parent (pid 1, for a daemon) has yet to reap."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def query_one(dsn: str, **connect: str) -> int:
    conn = await asyncpg.connect(dsn, **connect)
    try:
        return int(await conn.fetchval("SELECT 1"))
    finally:
        await conn.close()


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT])
async def test_db_prints_a_tcp_dsn_and_stops_on_a_signal(
    tmp_path: Path, signo: signal.Signals
) -> None:
    port = free_port()
    async with running_db(tmp_path / "db", "--port", str(port)) as db:
        dsn = await db.read_dsn()
        assert dsn == f"postgresql://postgres@127.0.0.1:{port}/postgres"
        assert await query_one(dsn) == 1
        postmaster = db.postmaster()
        assert await db.stop(signo) == 0
    assert gone(postmaster)
    assert not (tmp_path / "db" / "pgdata" / "postmaster.pid").exists()


async def test_db_without_port_prints_its_socket_dsn(tmp_path: Path) -> None:
    async with running_db(tmp_path / "db") as db:
        dsn = await db.read_dsn()
        assert "host=" in dsn and "127.0.0.1" not in dsn
        assert await query_one(dsn) == 1
        assert await db.stop(signal.SIGTERM) == 0


@contextlib.asynccontextmanager
async def from_another_address(port: int) -> AsyncIterator[int]:
    """A port on 127.0.0.1 that forwards to `port` from source address 127.0.0.2: outside
    pg_hba's trusted 127.0.0.1/32, as another machine would be."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=("127.0.0.2", 0)
        )
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(forward, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_db_beyond_loopback_asks_other_addresses_for_the_password(tmp_path: Path) -> None:
    """On 0.0.0.0, this machine's loopback is trusted; another source address is asked for
    the password of DATA/db-password."""
    port = free_port()
    async with running_db(tmp_path / "db", "--port", str(port), "--host", "0.0.0.0") as db:
        dsn = await db.read_dsn()
        assert dsn == f"postgresql://postgres@0.0.0.0:{port}/postgres"
        assert await query_one(f"postgresql://postgres@127.0.0.1:{port}/postgres") == 1
        password_file = tmp_path / "db" / "db-password"
        password = password_file.read_text().strip()
        assert password_file.stat().st_mode & 0o077 == 0
        async with from_another_address(port) as forwarded:
            other = f"postgresql://postgres@127.0.0.1:{forwarded}/postgres"
            with pytest.raises(asyncpg.InvalidPasswordError):
                await query_one(other, password="not-the-password")
            assert await query_one(other, password=password) == 1
        assert await db.stop(signal.SIGTERM) == 0
    assert password not in (await db.proc.stderr.read()).decode()  # type: ignore[union-attr]


async def test_db_refuses_a_data_folder_in_use(tmp_path: Path) -> None:
    async with running_db(tmp_path / "db") as first:
        await first.read_dsn()
        async with running_db(tmp_path / "db") as second:
            async with asyncio.timeout(60):
                code = await second.proc.wait()
            stderr = (await second.proc.stderr.read()).decode()  # type: ignore[union-attr]
            assert code == 1
            assert f"in use by process {first.proc.pid}" in stderr
            assert "stop it first" in stderr and "--db" not in stderr  # db has no --db
        assert await query_one(first.dsn) == 1  # the first goes on
        assert await first.stop(signal.SIGTERM) == 0


async def test_db_on_a_port_in_use_says_so_and_leaves_nothing_running(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with running_db(tmp_path / "db", "--port", str(port)) as db:
            async with asyncio.timeout(60):
                code = await db.proc.wait()
            stderr = (await db.proc.stderr.read()).decode()  # type: ignore[union-attr]
    assert code == 1
    assert f"could not listen on 127.0.0.1:{port}" in stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "db" / "pgdata" / "postmaster.pid").exists()


async def test_db_host_without_port_is_refused(tmp_path: Path) -> None:
    async with running_db(tmp_path / "db", "--host", "0.0.0.0") as db:
        async with asyncio.timeout(60):
            code = await db.proc.wait()
        stderr = (await db.proc.stderr.read()).decode()  # type: ignore[union-attr]
    assert code == 2 and "--host needs --port" in stderr
    assert not (tmp_path / "db").exists()
