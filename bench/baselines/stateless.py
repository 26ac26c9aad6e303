"""Baseline (b), stateless reload: no actors; PostgreSQL holds the conversation.

Every hello and every turn loads the conversation from PostgreSQL (its row and the window
of recent turns) and writes it back (the say, its ack event, the reply, the seq counter).
Nothing about a conversation stays in memory between turns. The one process-wide map is
person -> open links, so that a reply reaches the person's current link: without it (or a
pub/sub in its place) a reply whose link dropped could only be had by the next replay.

Replay on a resuming hello comes from the stored turn-level events (ack, reply.start,
reply.end), like stillhere's replay after its buffer is gone: deltas are not stored, so a
replayed reply has no deltas, and its `reply.end` carries the whole text. Seq numbers are
reserved from the conversation row in blocks at the start of a reply and the unused part
is given back at its end.

Tables live in their own schema-free names (`sl_*`) in an embedded PostgreSQL started in
`--data-dir` (or `--db`), so this baseline never touches stillhere's tables.

    python -m bench.baselines.stateless --port 8802 --data-dir /tmp/sl
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from aiohttp import WSMsgType, web

from bench.baselines.common import (
    HEARTBEAT_S,
    WINDOW_TURNS,
    Refused,
    add_common_options,
    decode,
    messages_for,
    person_of,
    say_fields,
    send,
    serve,
    words,
)
from providers.rehearsal import RehearsalModel
from storage.pool import open_pool

RESUME_WINDOW_S = 30 * 60
SEQ_BLOCK = 1024
POOL_SIZE = 10

SCHEMA = """
CREATE TABLE IF NOT EXISTS sl_conversations (
    id uuid PRIMARY KEY,
    person text NOT NULL,
    status text NOT NULL DEFAULT 'active',
    last_activity timestamptz NOT NULL,
    seq bigint NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS sl_one_active ON sl_conversations (person)
    WHERE status = 'active';
CREATE TABLE IF NOT EXISTS sl_turns (
    id bigserial PRIMARY KEY,
    conversation uuid NOT NULL,
    person text NOT NULL,
    role text NOT NULL,
    client_id text,
    text text NOT NULL,
    ack_seq bigint,
    at timestamptz NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS sl_turns_client ON sl_turns (person, client_id)
    WHERE client_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS sl_turns_conversation ON sl_turns (conversation, id);
CREATE TABLE IF NOT EXISTS sl_events (
    conversation uuid NOT NULL,
    seq bigint NOT NULL,
    frame jsonb NOT NULL,
    PRIMARY KEY (conversation, seq)
);
"""


def now() -> datetime:
    return datetime.now(UTC)


class Link:
    """One WebSocket. Live frames wait while its replay is being sent, then follow it."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.person: str | None = None
        self.conversation: uuid.UUID | None = None
        self.replaying = True
        self.held: list[dict[str, Any]] = []
        self.top = -1

    async def deliver(self, frame: dict[str, Any]) -> None:
        if self.replaying:
            self.held.append(frame)
        else:
            await send(self.ws, frame)

    async def replay_done(self, replayed_top: int) -> None:
        self.top = replayed_top
        self.replaying = False
        held, self.held = self.held, []
        for frame in held:
            if frame["seq"] > replayed_top:
                await send(self.ws, frame)


class Stateless:
    def __init__(self, pool: asyncpg.Pool, model: RehearsalModel) -> None:
        self.pool = pool
        self.model = model
        self.links: dict[str, set[Link]] = {}
        self.turns: set[asyncio.Task[None]] = set()

    async def fan_out(self, person: str, frame: dict[str, Any]) -> None:
        for link in list(self.links.get(person, ())):
            await link.deliver(frame)

    # -- hello --------------------------------------------------------------------------

    async def hello(self, link: Link, frame: dict[str, Any]) -> None:
        if link.person is not None:
            raise Refused("already_hello", "this link has already said hello")
        if frame.get("v") != 1:
            raise Refused("unsupported_version", "hello needs v: 1")
        person = person_of(frame)
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT * FROM sl_conversations WHERE person = $1 AND status = 'active' FOR UPDATE",
                person,
            )
            age = (now() - row["last_activity"]).total_seconds() if row else None
            resumed = row is not None and age is not None and age < RESUME_WINDOW_S
            if row is not None and not resumed:
                await conn.execute(
                    "UPDATE sl_conversations SET status = 'archived' WHERE id = $1", row["id"]
                )
            if not resumed:
                row = await conn.fetchrow(
                    "INSERT INTO sl_conversations (id, person, last_activity) "
                    "VALUES ($1, $2, $3) RETURNING *",
                    uuid.uuid4(),
                    person,
                    now(),
                )
            assert row is not None
            history = await conn.fetch(
                "SELECT role, text, at FROM (SELECT * FROM sl_turns WHERE conversation = $1 "
                "ORDER BY id DESC LIMIT $2) t ORDER BY id",
                row["id"],
                WINDOW_TURNS,
            )
        conversation = row["id"]
        link.person, link.conversation = person, conversation
        self.links.setdefault(person, set()).add(link)  # live frames are held from here
        welcome = {
            "type": "welcome",
            "conversation": str(conversation),
            "resumed": resumed,
            "age_s": round(age, 3) if resumed and age is not None else None,
            "speaker": None,
            "cards": [],
            "history": [
                {"role": h["role"], "text": h["text"], "at": h["at"].isoformat()} for h in history
            ],
            "seq": row["seq"],
        }
        await send(link.ws, welcome)
        last_seq = frame.get("last_seq")
        top = -1  # held live frames above this follow the welcome (and the replay)
        if resumed and frame.get("conversation") == str(conversation) and isinstance(last_seq, int):
            async with self.pool.acquire() as conn:
                stored = await conn.fetch(
                    "SELECT frame FROM sl_events WHERE conversation = $1 AND seq > $2 ORDER BY seq",
                    conversation,
                    last_seq,
                )
            top = last_seq
            for event in stored:
                replayed = orjson.loads(event["frame"])
                top = max(top, replayed["seq"])
                await send(link.ws, replayed)
        await link.replay_done(top)

    # -- say and turn -------------------------------------------------------------------

    async def say(self, link: Link, frame: dict[str, Any]) -> None:
        if link.person is None or link.conversation is None:
            raise Refused("hello_first", "the first frame on a link must be a hello")
        id_, text = say_fields(frame)
        person, conversation = link.person, link.conversation
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT seq, status FROM sl_conversations WHERE id = $1 FOR UPDATE", conversation
            )
            if row is None or row["status"] != "active":
                raise Refused("conversation_ended", "this conversation has ended")
            seen = await conn.fetchrow(
                "SELECT ack_seq FROM sl_turns WHERE person = $1 AND client_id = $2", person, id_
            )
            if seen is not None:  # a resend: the same ack again, to this link only
                repeat = {"type": "ack", "id": id_, "seq": seen["ack_seq"], "repeat": True}
                await send(link.ws, repeat)
                return
            seq = row["seq"] + 1
            ack = {"type": "ack", "seq": seq, "id": id_}
            await conn.execute(
                "INSERT INTO sl_turns (conversation, person, role, client_id, text, ack_seq, at) "
                "VALUES ($1, $2, 'user', $3, $4, $5, $6)",
                conversation,
                person,
                id_,
                text,
                seq,
                now(),
            )
            await conn.execute(
                "INSERT INTO sl_events (conversation, seq, frame) VALUES ($1, $2, $3)",
                conversation,
                seq,
                orjson.dumps(ack).decode(),
            )
            await conn.execute(
                "UPDATE sl_conversations SET seq = $2, last_activity = $3 WHERE id = $1",
                conversation,
                seq,
                now(),
            )
        await self.fan_out(person, ack)
        task = asyncio.get_running_loop().create_task(self.turn(person, conversation, id_))
        self.turns.add(task)
        task.add_done_callback(self.turns.discard)

    async def turn(self, person: str, conversation: uuid.UUID, id_: str) -> None:
        """Load the window, reserve seqs, stream the reply, write it back."""
        async with self.pool.acquire() as conn:
            window = await conn.fetch(
                "SELECT role, text FROM (SELECT * FROM sl_turns WHERE conversation = $1 "
                "ORDER BY id DESC LIMIT $2) t ORDER BY id",
                conversation,
                WINDOW_TURNS + 1,
            )
            top = await conn.fetchval(
                "UPDATE sl_conversations SET seq = seq + $2 WHERE id = $1 RETURNING seq",
                conversation,
                SEQ_BLOCK,
            )
        seqs = iter(range(top - SEQ_BLOCK + 1, top + 1))
        turns = [(r["role"], r["text"]) for r in window]
        new = [turns.pop()[1]] if turns and turns[-1][0] == "user" else []
        reply = str(uuid.uuid4())
        start = {"type": "reply.start", "seq": next(seqs), "reply": reply, "in_reply_to": [id_]}
        await self._store_event(conversation, start)
        await self.fan_out(person, start)
        sent: list[str] = []
        async for word in words(self.model, messages_for(turns, new)):
            sent.append(word)
            delta = {"type": "reply.delta", "seq": next(seqs), "reply": reply, "text": word}
            await self.fan_out(person, delta)
        text = "".join(sent)
        end = {"type": "reply.end", "seq": next(seqs), "reply": reply, "text": text}
        end["interrupted"] = False
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO sl_turns (conversation, person, role, text, at) "
                "VALUES ($1, $2, 'assistant', $3, $4)",
                conversation,
                person,
                text,
                now(),
            )
            await conn.execute(
                "INSERT INTO sl_events (conversation, seq, frame) VALUES ($1, $2, $3)",
                conversation,
                end["seq"],
                orjson.dumps(end).decode(),
            )
            await conn.execute(  # give back the unused seqs if no other turn took more
                "UPDATE sl_conversations SET seq = $3, last_activity = $4 "
                "WHERE id = $1 AND seq = $2",
                conversation,
                top,
                end["seq"],
                now(),
            )
        await self.fan_out(person, end)

    async def _store_event(self, conversation: uuid.UUID, frame: dict[str, Any]) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO sl_events (conversation, seq, frame) VALUES ($1, $2, $3)",
                conversation,
                frame["seq"],
                orjson.dumps(frame).decode(),
            )

    async def leave(self, link: Link) -> None:
        if link.person is None:
            raise Refused("hello_first", "the first frame on a link must be a hello")
        async with self.pool.acquire() as conn:
            await conn.execute(
                "UPDATE sl_conversations SET status = 'archived' WHERE id = $1", link.conversation
            )
        bye = {"type": "bye", "reason": "leave"}
        for other in list(self.links.get(link.person, ())):
            await send(other.ws, bye)
            if other is not link:
                await other.ws.close()

    def detach(self, link: Link) -> None:
        if link.person is not None:
            links = self.links.get(link.person)
            if links is not None:
                links.discard(link)
                if not links:
                    del self.links[link.person]


STATE_KEY = web.AppKey("stateless", Stateless)


async def websocket_handler(request: web.Request) -> web.WebSocketResponse:
    state = request.app[STATE_KEY]
    ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S)
    await ws.prepare(request)
    link = Link(ws)
    try:
        async for message in ws:
            if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                continue
            try:
                frame = decode(message.data)
                kind = frame["type"]
                if kind == "ping":
                    await send(ws, {"type": "pong"})
                elif kind == "hello":
                    await state.hello(link, frame)
                elif kind == "say":
                    await state.say(link, frame)
                elif kind == "leave":
                    await state.leave(link)
                    break
            except Refused as refused:
                await send(ws, refused.frame())
                if refused.close:
                    break
    finally:
        state.detach(link)
    await ws.close()
    return ws


async def _lifecycle(
    data_dir: Path | None, dsn: str | None, latency: float, rate: float, app: web.Application
) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    embedded = None
    if dsn is None:
        from storage.embedded import EmbeddedPostgres

        assert data_dir is not None
        embedded = await loop.run_in_executor(None, EmbeddedPostgres, data_dir)
        dsn = embedded.dsn
    pool = await open_pool(dsn, max_size=POOL_SIZE)
    await pool.execute(SCHEMA)
    app[STATE_KEY] = Stateless(pool, RehearsalModel(latency=latency, tokens_per_s=rate))
    try:
        yield
    finally:
        for task in list(app[STATE_KEY].turns):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await pool.close()
        if embedded is not None:
            await loop.run_in_executor(None, embedded.stop)


def build(args: argparse.Namespace) -> web.Application:
    app = web.Application()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        async for _ in _lifecycle(
            args.data_dir, args.db, args.rehearsal_latency, args.rehearsal_rate, app
        ):
            yield

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/v1/ws", websocket_handler)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines.stateless")
    add_common_options(parser)
    parser.add_argument("--data-dir", type=Path, default=None, help="embedded PostgreSQL here")
    parser.add_argument("--db", default=None, help="or this PostgreSQL DSN")
    args = parser.parse_args(argv)
    if args.data_dir is None and args.db is None:
        parser.error("give --data-dir or --db")
    return serve(lambda: build(args), args)


if __name__ == "__main__":
    sys.exit(main())
