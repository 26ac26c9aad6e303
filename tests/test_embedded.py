"""The embedded PostgreSQL of `--data-dir` over a server's crash, restart and clean stop,
and a command run beside the server: real processes, a real PostgreSQL."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.test_restart import ROOT, STILLHERE, ServerProcess, spawn_serve


class EmbeddedServer(ServerProcess):
    """`stillhere serve` on the embedded PostgreSQL of its data dir (no `--db`)."""

    async def start(self, http: aiohttp.ClientSession) -> None:
        options = ["--data-dir", str(self.data_dir), "--secret", "s", "--port", str(self.port)]
        self.proc = await spawn_serve(options, self.log_path)
        await self._wait_ready(http)

    async def stop(self) -> int:
        """SIGTERM, as a service manager stops it; its exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            return await self.proc.wait()


def postmaster(data_dir: Path) -> int | None:
    """The pid of the PostgreSQL running on the data dir, if one is."""
    pid_file = data_dir / "pgdata" / "postmaster.pid"
    if not pid_file.exists():
        return None
    pid = int(pid_file.read_text().split()[0])
    return pid if psutil.pid_exists(pid) else None


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    """A data dir whose PostgreSQL is stopped after the test, whatever the test did."""
    folder = tmp_path / "data"
    yield folder
    left = postmaster(folder)
    if left is not None:
        psutil.Process(left).terminate()


async def consolidate(data_dir: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(STILLHERE),
        "memory",
        "consolidate",
        "--data-dir",
        str(data_dir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    _, err = await proc.communicate()
    return proc.returncode or 0, err.decode()


async def test_a_restarted_server_adopts_the_postgresql_a_kill_left_and_stops_it(
    http: aiohttp.ClientSession, data: Path, tmp_path: Path
) -> None:
    first = EmbeddedServer("", data, tmp_path / "first.log")
    await first.start(http)
    started = postmaster(data)
    await first.kill()
    assert started is not None and postmaster(data) == started  # kill -9 leaves it running

    second = EmbeddedServer("", data, tmp_path / "second.log")
    await second.start(http)
    assert f"embedded PostgreSQL adopted in {data.resolve() / 'pgdata'}" in second.log()
    assert postmaster(data) == started

    status, refusal = await consolidate(data)
    assert second.proc is not None
    assert status == 1 and f"in use by process {second.proc.pid}" in refusal
    assert "stop it first, or pass --db with a DSN" in refusal
    assert "stopped" not in refusal and postmaster(data) == started

    assert await second.stop() == 0
    log = second.log()
    assert f"embedded PostgreSQL stopped (postmaster {started}, adopted" in log
    assert postmaster(data) is None
