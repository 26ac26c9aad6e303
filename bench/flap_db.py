"""The end-of-run database check: every say stored once, under the right person.

It reads the server's own PostgreSQL (the embedded one in the server's data dir, reached
through the unix socket that `postmaster.pid` names) while the server still runs. A reply's
`reply.end` leaves beside its reply's write, not after it, so the last replies of the run
may land a moment after their phones have them: the read is repeated until it holds still.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import asyncpg

STILL_PAUSE_S = 0.2  # between two reads that must agree
STILL_READS = 50  # at most: 10 s for the last writes to land


@dataclass
class Stored:
    rows: dict[str, int]  # say id -> turns stored under the person who said it
    wrong_person: int  # say ids stored under another person
    answered: dict[str, int] | None  # say id -> stored replies answering it


def dsn_of(pgdata: Path) -> str:
    """`postgresql://postgres@/postgres?host=<socket dir>&port=<port>` from postmaster.pid."""
    lines = (pgdata / "postmaster.pid").read_text().splitlines()
    port, socket_dir = lines[3].strip(), lines[4].strip()
    return f"postgresql://postgres@/postgres?host={socket_dir or pgdata}&port={port}"


def stillhere_person(secret: str, device: str) -> str:
    """The server's person key: HMAC-SHA256 of `device:<secret>` under the server secret."""
    return hmac.new(secret.encode(), f"device:{device}".encode(), hashlib.sha256).hexdigest()


def stateless_person(device: str) -> str:
    return hashlib.sha256(b"device:" + device.encode()).hexdigest()


async def _read(dsn: str, turns: str, said_by: dict[str, str], with_answers: bool) -> Stored:
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        rows = await conn.fetch(
            f"SELECT person, client_id, count(*) AS n FROM {turns} "
            "WHERE client_id IS NOT NULL GROUP BY person, client_id"
        )
        answered = None
        if with_answers:
            answers = await conn.fetch(
                f"SELECT unnest(in_reply_to) AS id, count(*) AS n FROM {turns} "
                "WHERE role = 'assistant' GROUP BY 1"
            )
            answered = {r["id"]: int(r["n"]) for r in answers}
    finally:
        await conn.close()
    stored: Counter[str] = Counter()
    wrong = 0
    for row in rows:
        id_ = row["client_id"]
        if said_by.get(id_) == row["person"]:
            stored[id_] += int(row["n"])
        elif id_ in said_by:
            wrong += 1
    return Stored(dict(stored), wrong, answered)


async def stillhere_stored(pgdata: Path, data_dir: Path, said: dict[str, str]) -> Stored:
    """`said`: say id -> device secret of the phone that said it."""
    secret = (data_dir / "secret").read_text().strip()
    persons = {d: stillhere_person(secret, d) for d in set(said.values())}
    said_by = {i: persons[d] for i, d in said.items()}
    stored = await _read(dsn_of(pgdata), "turns", said_by, with_answers=True)
    for _ in range(STILL_READS):
        await asyncio.sleep(STILL_PAUSE_S)
        again = await _read(dsn_of(pgdata), "turns", said_by, with_answers=True)
        if again == stored:
            break
        stored = again
    return stored


async def stateless_stored(pgdata: Path, said: dict[str, str]) -> Stored:
    persons = {d: stateless_person(d) for d in set(said.values())}
    return await _read(
        dsn_of(pgdata), "sl_turns", {i: persons[d] for i, d in said.items()}, with_answers=False
    )
