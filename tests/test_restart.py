"""Real processes: `kill -9` the server mid-life, start it again, and the conversation goes
on; two processes migrating one database at once take turns."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest

from storage.migrate import _migration_files
from tests.conftest import INSTANT_OPTIONS

ROOT = Path(__file__).resolve().parent.parent
STILLHERE = Path(sys.executable).parent / "stillhere"
START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def spawn_serve(options: list[str], log_path: Path) -> asyncio.subprocess.Process:
    """`stillhere serve OPTIONS` in a subprocess, its stderr (the log) written to `log_path`."""
    with log_path.open("wb") as log:
        return await asyncio.create_subprocess_exec(
            str(STILLHERE),
            "serve",
            *INSTANT_OPTIONS,  # the test's own options come after, and win
            *options,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log,
            cwd=ROOT,
        )


class ServerProcess:
    """`stillhere serve` in a subprocess, its stderr (the log) kept in a file."""

    def __init__(self, dsn: str, data_dir: Path, log: Path) -> None:
        self.dsn = dsn
        self.data_dir = data_dir
        self.log_path = log
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, http: aiohttp.ClientSession, extra: Sequence[str] = ()) -> None:
        """Start it with `extra` options besides its own, and wait until it is ready."""
        options = ["--db", self.dsn, "--data-dir", str(self.data_dir), "--secret", "s"]
        options += ["--port", str(self.port), *extra]
        self.proc = await spawn_serve(options, self.log_path)
        await self._wait_ready(http)

    async def _wait_ready(self, http: aiohttp.ClientSession) -> None:
        """Until the server accepts a WebSocket (it may be migrating first)."""
        assert self.proc is not None
        async with asyncio.timeout(START_TIMEOUT):
            while True:
                if self.proc.returncode is not None:
                    raise AssertionError(f"the server exited early:\n{self.log()}")
                try:
                    ws = await http.ws_connect(self.base + "/v1/ws")
                except (aiohttp.ClientError, OSError):
                    await asyncio.sleep(0.1)
                    continue
                await ws.close()
                return

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def kill(self) -> None:
        """kill -9, and reap it."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()


class Client:
    """A bare protocol-v1 WebSocket client: frames in, every frame out recorded."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.frames: list[dict[str, Any]] = []

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send_str(orjson.dumps(frame).decode())

    async def expect(self, type_: str, match: Any = None, timeout: float = 15.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                message = await self.ws.receive()
                if message.type != aiohttp.WSMsgType.TEXT:
                    raise AssertionError(f"link ended while waiting for {type_}: {message}")
                frame = orjson.loads(message.data)
                self.frames.append(frame)
                if frame["type"] == type_ and (match is None or match(frame)):
                    return frame

    async def say(self, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Say something; its ack and the reply.end answering it."""
        id_ = uuid.uuid4().hex
        await self.send({"type": "say", "id": id_, "text": text})
        ack = await self.expect("ack", lambda f: f["id"] == id_)
        start = await self.expect("reply.start", lambda f: id_ in f["in_reply_to"])
        end = await self.expect("reply.end", lambda f: f["reply"] == start["reply"])
        return ack, end

    @property
    def seqs(self) -> list[int]:
        return [f["seq"] for f in self.frames if f["type"] != "welcome" and "seq" in f]


async def hello(
    http: aiohttp.ClientSession, server: ServerProcess, **fields: Any
) -> tuple[Client, dict[str, Any]]:
    client = Client(await http.ws_connect(server.base + "/v1/ws"))
    await client.send({"type": "hello", "v": 1, **fields})
    return client, await client.expect("welcome")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_kill_9_and_restart_resumes_the_conversation(
    dsn: str, tmp_path: Path, http: aiohttp.ClientSession, db: asyncpg.Connection
) -> None:
    device = "device-" + uuid.uuid4().hex
    first = ServerProcess(dsn, tmp_path / "data", tmp_path / "first.log")
    second = ServerProcess(dsn, tmp_path / "data", tmp_path / "second.log")
    try:
        await first.start(http)
        before, welcome = await hello(http, first, device=device)
        assert welcome["resumed"] is False
        conversation = welcome["conversation"]
        said = ["Hello there, how are you today?", "Tell me something about Thursdays."]
        replies = [(await before.say(text))[1]["text"] for text in said]
        # An EventSource-style request with the secret in the query: never in the log.
        async with http.post(
            first.base + "/v1/say",
            params={"device": device},
            json={"id": "query-say", "text": "x" * 5000},
        ) as response:
            assert response.status == 400
        highest = max(before.seqs)
        assert before.seqs == sorted(before.seqs)
        # A reply is written just after its reply.end leaves; a crash in between loses it
        # (docs/protocol.md). Kill once both are in the record.
        replied = "SELECT count(*) FROM turns WHERE role = 'assistant' AND conversation = $1"
        async with asyncio.timeout(10):
            while await db.fetchval(replied, uuid.UUID(conversation)) < len(said):
                await asyncio.sleep(0.01)

        await first.kill()
        assert first.proc is not None and first.proc.returncode == -signal.SIGKILL
        await before.ws.close()

        await second.start(http)
        after, again = await hello(
            http, second, device=device, conversation=conversation, last_seq=highest
        )
        assert again["resumed"] is True
        assert again["conversation"] == conversation
        assert [(t["role"], t["text"]) for t in again["history"]] == [
            ("user", said[0]),
            ("assistant", replies[0]),
            ("user", said[1]),
            ("assistant", replies[1]),
        ]
        assert again["seq"] >= highest
        ack, end = await after.say("And what did I say first?")
        assert ack["seq"] > highest
        assert min(after.seqs) > highest
        assert after.seqs == sorted(after.seqs)
        assert "(4 earlier turns in view.)" in end["text"]  # the model was handed them
        await after.ws.close()
    finally:
        await first.kill()
        await second.kill()
    first_log, second_log = first.log(), second.log()
    assert "resuming conversation" in second_log, second_log
    assert device not in first_log, first_log
    assert device not in second_log, second_log


MIGRATE = """
import asyncio, logging, sys
from storage.store import Store

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

print("ready", flush=True)
sys.stdin.readline()

async def main():
    store = await Store.open(sys.argv[1])
    await store.close()

asyncio.run(main())
print("migrated", flush=True)
"""


async def test_two_processes_migrate_one_database_at_once(dsn: str, db: asyncpg.Connection) -> None:
    procs: list[asyncio.subprocess.Process] = []
    try:
        for _ in range(2):
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    MIGRATE,
                    dsn,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    cwd=ROOT,
                )
            )
        async with asyncio.timeout(60):
            # Both have imported everything; then both go at the same moment.
            for proc in procs:
                assert proc.stdout is not None
                assert (await proc.stdout.readline()).strip() == b"ready"
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
            await asyncio.gather(*(proc.stdin.drain() for proc in procs if proc.stdin))
            results = await asyncio.gather(*(proc.communicate() for proc in procs))
        for proc, (out, err) in zip(procs, results, strict=True):
            assert proc.returncode == 0, err.decode(errors="replace")
            assert out.strip() == b"migrated"
        logs = [err.decode(errors="replace") for _, err in results]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    rows = await db.fetch("SELECT name, count(*) AS n FROM schema_migrations GROUP BY name")
    expected = [name for name, _ in _migration_files()]
    assert expected
    assert sorted(r["name"] for r in rows) == expected
    assert all(r["n"] == 1 for r in rows)
    for name in expected:  # one process applied it, the other found it recorded
        assert sum(f"applied migration {name}" in log for log in logs) == 1, logs
    tables = await db.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    assert {"conversations", "turns", "events", "cards", "reminders"} <= {
        t["tablename"] for t in tables
    }
