"""Baseline (a), link-bound: the conversation lives in the WebSocket handler.

This is what a plain aiohttp handler does: hello makes a conversation in the handler's
locals, says are acked and answered on that link, and when the link drops the state goes
with it. A reconnect therefore always starts a new conversation (`resumed: false`), and a
say resent on the new link is answered a second time. Nothing is stored.

    python -m bench.baselines.link_bound --port 8801 --rehearsal-latency 0.3
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from aiohttp import WSMsgType, web

from bench.baselines.common import (
    HEARTBEAT_S,
    Refused,
    add_common_options,
    cancel,
    decode,
    messages_for,
    person_of,
    say_fields,
    send,
    serve,
    words,
)
from providers.rehearsal import RehearsalModel

MODEL_KEY = web.AppKey("model", RehearsalModel)


class LinkConversation:
    """One link's conversation: seq, window, ids seen, the reply in progress."""

    def __init__(self, ws: web.WebSocketResponse, model: RehearsalModel) -> None:
        self.ws = ws
        self.model = model
        self.id: str | None = None
        self.seq = 0
        self.history: list[tuple[str, str]] = []
        self.acked: dict[str, int] = {}
        self.waiting: list[tuple[str, str]] = []
        self.turn: asyncio.Task[None] | None = None
        self.cut: asyncio.Event = asyncio.Event()
        self.sent = ""

    async def emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        frame = {"type": type_, "seq": self.seq, **fields}
        await send(self.ws, frame)
        return frame

    async def on_frame(self, frame: dict[str, Any]) -> bool:
        kind = frame["type"]
        if kind == "ping":
            await send(self.ws, {"type": "pong"})
        elif kind == "hello":
            await self.hello(frame)
        elif self.id is None:
            raise Refused("hello_first", "the first frame on a link must be a hello")
        elif kind == "say":
            await self.say(frame)
        elif kind == "interrupt":
            self.cut.set()
        elif kind == "leave":
            await cancel(self.turn)
            await send(self.ws, {"type": "bye", "reason": "leave"})
            return False
        return True

    async def hello(self, frame: dict[str, Any]) -> None:
        if self.id is not None:
            raise Refused("already_hello", "this link has already said hello")
        if frame.get("v") != 1:
            raise Refused("unsupported_version", "hello needs v: 1")
        person_of(frame)
        self.id = str(uuid.uuid4())
        welcome = {"type": "welcome", "conversation": self.id, "resumed": False, "age_s": None}
        welcome |= {"speaker": None, "cards": [], "history": [], "seq": 0}
        await send(self.ws, welcome)

    async def say(self, frame: dict[str, Any]) -> None:
        id_, text = say_fields(frame)
        if id_ in self.acked:  # a resend on the same link: ack again, answer once
            await send(self.ws, {"type": "ack", "id": id_, "seq": self.acked[id_], "repeat": True})
            return
        self.acked[id_] = (await self.emit("ack", id=id_))["seq"]
        self.waiting.append((id_, text))
        if self.turn is None or self.turn.done():
            self.turn = asyncio.get_running_loop().create_task(self.answer())

    async def answer(self) -> None:
        while self.waiting and not self.ws.closed:
            batch, self.waiting = self.waiting, []
            self.cut.clear()
            reply = str(uuid.uuid4())
            await self.emit("reply.start", reply=reply, in_reply_to=[i for i, _ in batch])
            sent: list[str] = []
            async for word in words(self.model, messages_for(self.history, [t for _, t in batch])):
                if self.cut.is_set():
                    break
                sent.append(word)
                await self.emit("reply.delta", reply=reply, text=word)
            text = "".join(sent)
            await self.emit("reply.end", reply=reply, text=text, interrupted=self.cut.is_set())
            self.history += [("user", t) for _, t in batch] + [("assistant", text)]


async def websocket_handler(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S)
    await ws.prepare(request)
    conversation = LinkConversation(ws, request.app[MODEL_KEY])
    try:
        async for message in ws:
            if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                continue
            try:
                if not await conversation.on_frame(decode(message.data)):
                    break
            except Refused as refused:
                await send(ws, refused.frame())
                if refused.close:
                    break
    finally:
        await cancel(conversation.turn)  # the state dies with the link
    await ws.close()
    return ws


def build(latency: float, rate: float) -> web.Application:
    app = web.Application()
    app[MODEL_KEY] = RehearsalModel(latency=latency, tokens_per_s=rate)
    app.router.add_get("/v1/ws", websocket_handler)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines.link_bound")
    add_common_options(parser)
    args = parser.parse_args(argv)
    return serve(lambda: build(args.rehearsal_latency, args.rehearsal_rate), args)


if __name__ == "__main__":
    sys.exit(main())
