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

from cli.inspect import SHOWN_PERSON
from tests.test_restart import ROOT, STILLHERE, ServerProcess, spawn_serve
from transport.identity import Identity


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


async def stillhere(*argv: str) -> tuple[int, str]:
    """`stillhere ARGV` run to its end: its exit status, and its output and log."""
    proc = await asyncio.create_subprocess_exec(
        str(STILLHERE),
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=ROOT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


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

    status, said = await stillhere("memory", "consolidate", "--data-dir", str(data))
    assert second.proc is not None
    assert status == 0 and f"shared with process {second.proc.pid}" in said  # beside it
    assert f"left running (postmaster {started}): still used by process" in said
    assert postmaster(data) == started

    assert await second.stop() == 0
    log = second.log()
    assert f"embedded PostgreSQL stopped (postmaster {started}, adopted" in log
    assert postmaster(data) is None


async def test_memory_search_runs_beside_the_server_with_a_short_key(
    http: aiohttp.ClientSession, data: Path, tmp_path: Path
) -> None:
    """On the server's data dir while it runs (docs/memories.md), the person named as
    `inspect` shows them: the first 12 characters of their key."""
    server = EmbeddedServer("", data, tmp_path / "serve.log")
    await server.start(http)
    device = "device-" + "5" * 32
    memory = {"text": "My brother Owen lives in Bristol.", "people": ["owen"]}
    headers = {"X-Stillhere-Device": device}
    async with http.post(server.base + "/v1/memories", json=memory, headers=headers) as made:
        assert made.status == 201
    key = Identity("s").person(device=device)[:SHOWN_PERSON]
    search = ("memory", "search", "Where does Owen live?", "--data-dir", str(data))
    status, said = await stillhere(*search, "--person", key)
    assert status == 0 and "My brother Owen lives in Bristol." in said, said
    status, said = await stillhere(*search, "--person", "f" * 64)
    assert status == 2 and "no person's key is or starts with" in said, said
    assert server.proc is not None and server.proc.returncode is None
    assert await server.stop() == 0
