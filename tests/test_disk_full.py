"""PostgreSQL out of disk space, on a small tmpfs of the test's own: says, memories and rules
are answered with coded errors (never acked unstored, never a 500), the server stays alive,
and everything works again once space returns, with no server restart.

A full disk reaches PostgreSQL in two ways, and both are tried here. A table or index that
must grow by a page fails its statement with SQLSTATE 53100 (`DiskFullError`): the
transaction is rolled back and the connection lives on. A new WAL segment that cannot be
created is a PANIC: PostgreSQL drops every connection and runs crash recovery, which either
finds an old segment to recycle and goes on, or cannot write its own WAL and shuts
PostgreSQL down; which one happens varies from run to run. The server sees the first as
PostgreSQL restarting; the second it mends by starting its embedded PostgreSQL again once
the disk has room (the third test makes that state on purpose).
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from actors.clock import ManualClock
from tests.conftest import Harness, Phone, eventually
from tests.fakes.embeddings_server import FakeEmbeddings
from tests.memory_support import MODEL
from tests.test_db_faults import Postgres, acked_in_the_end, numbered, say_answer, stored_says

DISK_MB = 64  # room for a fresh cluster (about 40 MB with its first WAL segment) and a bit
SAY_TRIES = 300  # says until one needs a page the full disk cannot give


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of `DISK_MB`, unmounted whatever the test did."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m,mode=0777", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


@pytest.fixture
async def postgres(disk: Path) -> AsyncIterator[Postgres]:
    """The PostgreSQL the server will adopt as its embedded one, for the test to look at.
    Its log goes with the tmpfs, so its end is printed here: pytest shows it when the test
    fails (how PostgreSQL's recovery went varies from run to run)."""
    loop = asyncio.get_running_loop()
    own = await loop.run_in_executor(None, Postgres, disk)
    yield own
    await loop.run_in_executor(None, own.stop)
    log = own.pgdata / "log"
    if log.exists():
        print("PostgreSQL's log, its last lines:", *log.read_text().splitlines()[-200:], sep="\n")


@pytest.fixture
async def served(
    postgres: Postgres, fake_embeddings: FakeEmbeddings, clock: ManualClock, disk: Path
) -> AsyncIterator[Harness]:
    """A server as `stillhere serve` runs by default: no `--db`, its embedded PostgreSQL in
    its data folder (on the small disk)."""
    harness = Harness(None, clock, disk)  # type: ignore[arg-type]
    await harness.start(store_timeout=2.0, embed_url=fake_embeddings.url, embed_model=MODEL)
    yield harness
    await harness.stop()
    await harness.http.close()


class Filler:
    """A file that takes every free byte of the disk, until it is deleted."""

    def __init__(self, disk: Path) -> None:
        self.path = disk / "filler"

    def fill(self) -> None:
        chunk = b"\0" * (1 << 16)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while True:  # unbuffered: a short write takes the last bytes, the next one fails
                os.write(fd, chunk)
        except OSError as full:
            assert full.errno == errno.ENOSPC, full
        finally:
            os.close(fd)

    def delete(self) -> None:
        self.path.unlink()


async def begun(harness: Harness) -> Phone:
    """A phone whose first say (`s0`) is stored, answered and its reply recorded."""
    phone = await harness.phone()
    await phone.say("before the disk filled", "s0")
    await phone.reply()
    await harness.recorded()
    return phone


async def call(harness: Harness, device: str, method: str, path: str, body: Any = None) -> Any:
    async with harness.http.request(
        method,
        harness.url(path),
        data=None if body is None else orjson.dumps(body),
        headers={"X-Stillhere-Device": device},
    ) as response:
        return response.status, orjson.loads(await response.read())


async def readiness(harness: Harness) -> tuple[int, str]:
    """`/readyz`'s status, and its `status` (ready) or `code` (not)."""
    async with harness.http.get(harness.url("/readyz")) as response:
        answer = await response.json()
        return response.status, answer.get("code", answer.get("status"))


async def alive(harness: Harness) -> bool:
    async with harness.http.get(harness.url("/healthz")) as response:
        return response.status == 200


async def test_a_table_that_cannot_grow_refuses_with_codes_and_recovers_when_space_returns(
    served: Harness, postgres: Postgres, disk: Path
) -> None:
    loop = asyncio.get_running_loop()
    filler = Filler(disk)
    phone = await begun(served)

    await loop.run_in_executor(None, filler.fill)
    answers = []
    for n in range(SAY_TRIES):  # until the turns or their index need a page
        frame = await say_answer(phone, f"f{n}", f"said on a full disk, number {n} " * 20)
        answers.append(frame)
        if frame["type"] == "error":
            break
    refused = answers[-1]
    rule = await call(served, phone.device, "POST", "/v1/rules", {"text": "Answer briefly."})
    memory = await call(
        served, phone.device, "POST", "/v1/memories", {"text": "Owen lives in Bristol."}
    )
    posted = []
    for n in range(SAY_TRIES):  # the same over HTTP
        said = {"id": f"h{n}", "text": f"said over HTTP on a full disk, number {n} " * 20}
        posted.append(await call(served, phone.device, "POST", "/v1/say", said))
        if posted[-1][0] != 200:
            break
    ready_while_full = await readiness(served)
    await served.sweep()  # answered, whatever it could do
    healthy_while_full = await alive(served)

    filler.delete()
    ready_once_space_returned = await readiness(served)  # before any other write
    resent = await say_answer(phone, refused["id"], "resent once space returned")
    reposted = await call(served, phone.device, "POST", "/v1/say", {"id": said["id"], "text": "hi"})
    swept = await served.sweep()
    later = await served.phone()
    await later.say("a new link, after", "s1")
    await later.reply()
    rule_after = await call(served, phone.device, "POST", "/v1/rules", {"text": "Answer briefly."})
    memory_after = await call(
        served, phone.device, "POST", "/v1/memories", {"text": "Owen lives in Bristol."}
    )

    assert refused["type"] == "error" and refused["code"] == "storage_full", answers[-3:]
    for status, answer in (rule, memory, posted[-1]):
        assert (status, answer["type"], answer["code"]) == (503, "error", "storage_full")
    assert healthy_while_full
    assert ready_while_full == (503, "storage_full")
    assert ready_once_space_returned == (200, "ready")
    assert resent["type"] == "ack"
    assert reposted[0] == 200 and swept is not None  # the supervisor's sweep goes on
    assert (rule_after[0], memory_after[0]) == (201, 201), (rule_after, memory_after)
    # The WebSocket link sees the acks of the says posted over HTTP too: one conversation.
    acked = {f["id"] for f in [*phone.frames, *later.frames] if f["type"] == "ack"}
    acked_over_http = {a["id"] for _, a in [*posted[:-1], reposted]}
    assert sorted(await stored_says(postgres.dsn)) == sorted(acked | acked_over_http)
    seqs = numbered(phone)
    assert seqs == sorted(set(seqs))


async def test_a_wal_that_cannot_grow_is_a_postgresql_restart_the_server_rides_out(
    served: Harness, postgres: Postgres, disk: Path
) -> None:
    loop = asyncio.get_running_loop()
    filler = Filler(disk)
    phone = await begun(served)
    before = {p.pid for p in postgres.processes()}

    await loop.run_in_executor(None, filler.fill)
    admin = await asyncpg.connect(postgres.dsn)
    await admin.execute("SELECT pg_switch_wal()")  # the next WAL record needs a new segment
    await admin.close()
    during = [await say_answer(phone, f"w{n}", f"said as WAL ran out, {n}") for n in range(3)]
    healthy_while_full = await alive(served)

    filler.delete()
    for frame in during:
        if frame["type"] == "error":
            await acked_in_the_end(phone, frame["id"])
    later = await served.phone()
    await later.say("a new link, after", "s1")
    await later.reply()
    after = {p.pid for p in postgres.processes()}

    # PostgreSQL PANICked: its processes are all new but perhaps the postmaster (if it
    # recovered by itself) or all of them (if the server started it again).
    assert len(before - after) >= len(before) - 1, (before, after)
    assert healthy_while_full
    assert all(f["type"] == "ack" or f["code"] == "unavailable" for f in during), during
    acked = [f["id"] for f in [*phone.frames, *later.frames] if f["type"] == "ack"]
    assert sorted(await stored_says(postgres.dsn)) == sorted(set(acked))  # none acked unstored
    seqs = numbered(phone)
    assert seqs == sorted(set(seqs))


async def test_the_server_starts_its_embedded_postgresql_again_once_there_is_room(
    served: Harness, postgres: Postgres, disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What a full WAL can also do: PostgreSQL's recovery cannot write its own WAL either,
    and it shuts down ("shutting down due to startup process failure"). Killing it stands in
    for that here, as the two leave the same state: no postmaster, a full disk."""
    loop = asyncio.get_running_loop()
    filler = Filler(disk)
    phone = await begun(served)

    await loop.run_in_executor(None, filler.fill)
    await loop.run_in_executor(None, postgres.kill)
    refused = await say_answer(phone, "k1", "said while PostgreSQL was down")
    healthy_while_down = await alive(served)
    filler.delete()
    await acked_in_the_end(phone, "k1")
    await eventually(lambda: "had stopped on its own; started again" in caplog.text)

    assert refused["code"] == "unavailable"
    assert healthy_while_down
    assert "could not be started again" not in caplog.text  # not tried while the disk was full
    assert await stored_says(postgres.dsn) == ["s0", "k1"]
