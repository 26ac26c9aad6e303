"""Crashes at any instant: the crash bench, small, and kills in the middle of an ending.

The bench's smoke run asserts what must hold at any size (nothing acked lost, nothing stored
twice, no seq repeated, at most the streaming reply lost per crash and phone, every
reconnect resumed), never timings. The other tests SIGKILL a real `stillhere serve` while
its archive of a conversation waits on the conversation's row (a lock this test holds), for
a leave and for the sweep, and check that the conversation ends archived exactly once after
the restart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from bench import crash, procs
from bench.flap_db import dsn_of

FAST_SWEEP = ["--resume-window", "2s", "--sweep-interval", "1s"]


@pytest.mark.timeout(240)
async def test_the_crash_bench_loses_nothing_acked() -> None:
    parser = argparse.ArgumentParser()
    crash.add_options(parser)
    args = parser.parse_args(
        ["--kills", "3", "--clients", "6", "--seed", "3", "--up", "1s", "3s",
         "--think", "1s", "--flap-every", "2s", "--transport", "mixed",
         "--rehearsal-latency", "100ms", "--rehearsal-rate", "20", "--settle-timeout", "60s"]
    )  # fmt: skip
    report = await crash.measure(args)

    assert report["kills"] == 3
    assert report["says"] > 6 and report["reconnects"] > 0, "the phones talked and came back"
    assert crash.problems(report) == [], report["examples"]
    for key in crash.MUST_BE_ZERO:
        assert report[key] == 0, key
    assert report["replies_lost_max_per_crash_and_phone"] <= 1
    assert report["resumed"] == report["reconnects"]
    assert all(c["first_welcome_s"] is not None for c in report["crashes"])
    assert report["restart_to_first_welcome_s"]["n"] == 3
    assert "restart -> first welcome" in crash.table(report)


class Killable:
    """A real server on a tmp data dir that the test kills and starts again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.server: procs.Server | None = None

    async def start(self, *extra: str) -> procs.Server:
        port = self.server.port if self.server is not None else None
        self.server = procs.start(
            "stillhere", self.root, latency=0.0, rate=0.0, extra=list(extra), port=port
        )
        await procs.wait_ready(self.server)
        return self.server

    def kill(self) -> None:
        assert self.server is not None
        self.server.proc.kill()
        self.server.proc.wait()

    async def db(self) -> asyncpg.Connection:
        assert self.server is not None and self.server.pgdata is not None
        return await asyncpg.connect(dsn_of(self.server.pgdata))

    def url(self, path: str) -> str:
        assert self.server is not None
        return self.server.base_url + path


@pytest.fixture
async def killable(tmp_path: Path) -> AsyncIterator[Killable]:
    k = Killable(tmp_path)
    yield k
    if k.server is not None:
        await asyncio.get_running_loop().run_in_executor(None, procs.stop, k.server)


async def hello(http: aiohttp.ClientSession, k: Killable, device: str) -> tuple[Any, dict]:
    ws = await http.ws_connect(k.url("/v1/ws"))
    await ws.send_json({"type": "hello", "v": 1, "device": device})
    return ws, await ws.receive_json(timeout=10)


async def talk(http: aiohttp.ClientSession, k: Killable, device: str) -> str:
    """A conversation with one say answered; its id."""
    ws, welcome = await hello(http, k, device)
    await ws.send_json({"type": "say", "id": uuid.uuid4().hex, "text": "remember the bread"})
    while (await ws.receive_json(timeout=10))["type"] != "reply.end":
        pass
    await ws.close()
    return str(welcome["conversation"])


@contextlib.asynccontextmanager
async def row_held(db: asyncpg.Connection, conversation: str) -> AsyncIterator[None]:
    """The conversation's row locked by this test until the block ends (rolled back): the
    archive's `FOR UPDATE` waits for it; the turns and events written meanwhile, whose
    foreign keys only share the row's key, do not."""
    held = db.transaction()
    await held.start()
    id_ = uuid.UUID(conversation)
    await db.execute("SELECT 1 FROM conversations WHERE id = $1 FOR NO KEY UPDATE", id_)
    try:
        yield
    finally:
        if not db.is_closed():  # a connection ended holds nothing any more
            await held.rollback()


async def archive_waiting(db: asyncpg.Connection) -> None:
    """Until the server waits for the conversation's row, which this test holds (the only
    row it holds): in the archive's own statements, or in a write referring to the row that
    the archive waits for (the last reply's loose ends). In a transaction, statistics are a
    snapshot: cleared before each read."""
    async with asyncio.timeout(30):
        while await db.execute("SELECT pg_stat_clear_snapshot()") and not await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND pid <> pg_backend_pid()"
        ):
            await asyncio.sleep(0.05)


async def logged(path: Path, line: str) -> None:
    """Until the server's log holds `line`."""
    async with asyncio.timeout(30):
        while line not in path.read_text():
            await asyncio.sleep(0.05)


async def ended_once(db: asyncpg.Connection, conversation: str, reason: str) -> None:
    id_ = uuid.UUID(conversation)
    row = await db.fetchrow(
        "SELECT status, archive_reason, archived_at FROM conversations WHERE id = $1", id_
    )
    assert (row["status"], row["archive_reason"]) == ("archived", reason)
    summaries = await db.fetchval(
        "SELECT count(*) FROM cards WHERE conversation = $1 AND kind = 'summary'", id_
    )
    assert summaries <= 1, "one summary, however many tries"


async def eventually_archived(db: asyncpg.Connection, conversation: str) -> None:
    async with asyncio.timeout(30):
        while (
            await db.fetchval(
                "SELECT status FROM conversations WHERE id = $1", uuid.UUID(conversation)
            )
            != "archived"
        ):
            await asyncio.sleep(0.1)


@pytest.mark.timeout(180)
async def test_a_kill_during_a_leaves_archive_ends_it_once(killable: Killable) -> None:
    device = "crash-leave-" + uuid.uuid4().hex
    async with aiohttp.ClientSession() as http:
        await killable.start()
        conversation = await talk(http, killable, device)
        db = await killable.db()
        try:
            async with row_held(db, conversation):
                ws, _ = await hello(http, killable, device)
                await ws.send_json({"type": "leave"})
                await archive_waiting(db)
                killable.kill()  # mid-archive: no bye went out
            await killable.start()
            # The leave never happened for the phone: it resumes, and leaves again.
            ws, welcome = await hello(http, killable, device)
            assert (welcome["conversation"], welcome["resumed"]) == (conversation, True)
            await ws.send_json({"type": "leave"})
            assert (await ws.receive_json(timeout=10)) == {"type": "bye", "reason": "leave"}
            await eventually_archived(db, conversation)
            await ended_once(db, conversation, "leave")
            _, after = await hello(http, killable, device)
            assert after["resumed"] is False and after["conversation"] != conversation
        finally:
            await db.close()


@pytest.mark.timeout(180)
async def test_a_kill_during_the_sweeps_archive_ends_it_once(killable: Killable) -> None:
    device = "crash-sweep-" + uuid.uuid4().hex
    async with aiohttp.ClientSession() as http:
        await killable.start()
        conversation = await talk(http, killable, device)
        db = await killable.db()
        try:
            async with row_held(db, conversation):
                killable.kill()
                await killable.start(*FAST_SWEEP)  # its sweep finds the conversation idle
                await archive_waiting(db)
                killable.kill()  # mid-sweep
            await killable.start(*FAST_SWEEP)
            await eventually_archived(db, conversation)
            await ended_once(db, conversation, "idle")
            _, after = await hello(http, killable, device)
            assert after["resumed"] is False and after["conversation"] != conversation
        finally:
            await db.close()


@pytest.mark.timeout(180)
async def test_a_stop_during_a_sweep_ends_cleanly(killable: Killable) -> None:
    """A clean stop while the sweep waits on the database for longer than the drain lets
    work under way finish: the sweep ends after the supervisor, and that is no error."""
    async with aiohttp.ClientSession() as http:
        await killable.start()
        conversation = await talk(http, killable, "crash-stop-" + uuid.uuid4().hex)
        db = await killable.db()
        try:
            async with row_held(db, conversation):
                killable.kill()
                server = await killable.start(*FAST_SWEEP)
                await archive_waiting(db)
                server.proc.send_signal(signal.SIGINT)
                await logged(server.log_path, "a sweep ended after the supervisor stopped")
                # Let go of the row without a round trip: the server is stopping its
                # PostgreSQL meanwhile, which may end this connection mid-rollback.
                db.terminate()
        finally:
            await db.close()
        stop = await asyncio.get_running_loop().run_in_executor(None, procs.stop, server)
        killable.server = None
    assert stop["exit_code"] == 0 and not stop["killed"]
    assert procs.log_problems(server.log_path) == []
