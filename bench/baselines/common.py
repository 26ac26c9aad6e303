"""What both baseline servers share: frame parsing, the rehearsal model, process start-up.

The protocol subset is hello/welcome, say/ack, reply.start/delta/end, interrupt, leave/bye
and ping/pong over WebSocket (`GET /v1/ws`), with the frames of docs/protocol.md. Frame
limits, rate limits and SSE are left out: the baselines are what a plain handler does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from aiohttp import web

from providers.chat import ChatMessage, TextDelta
from providers.event_loop import LOOPS, new_event_loop
from providers.rehearsal import RehearsalModel

MIN_DEVICE_SECRET = 22
WINDOW_TURNS = 40
SYSTEM = "You are a voice and chat assistant on the person's phone. Answer briefly."
HEARTBEAT_S = 30.0

log = logging.getLogger("bench.baseline")


class Refused(Exception):
    """A frame the baseline answers with an `error` frame."""

    def __init__(self, code: str, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.close = close

    def frame(self) -> dict[str, Any]:
        return {"type": "error", "code": self.code, "message": str(self)}


def decode(raw: str | bytes) -> dict[str, Any]:
    try:
        frame = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise Refused("bad_json", "a frame must be one JSON object") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise Refused("bad_frame", "a frame must be a JSON object with a string type")
    return frame


def dumps(frame: dict[str, Any]) -> str:
    return orjson.dumps(frame).decode()


def person_of(hello: dict[str, Any]) -> str:
    """A key for the device secret (the baselines take devices only, no account tokens)."""
    device = hello.get("device")
    if not isinstance(device, str) or len(device) < MIN_DEVICE_SECRET:
        raise Refused("unauthorized", "a hello needs a device secret", close=True)
    return hashlib.sha256(b"device:" + device.encode()).hexdigest()


def say_fields(frame: dict[str, Any]) -> tuple[str, str]:
    id_, text = frame.get("id"), frame.get("text")
    if not isinstance(id_, str) or not id_ or len(id_) > 128:
        raise Refused("invalid_id", "a say needs an id")
    if not isinstance(text, str) or not text.strip():
        raise Refused("invalid_text", "a say needs a text")
    return id_, text


def messages_for(history: list[tuple[str, str]], new: list[str]) -> list[ChatMessage]:
    """System prompt, the window of (role, text) turns, then the new user messages."""
    out = [ChatMessage("system", SYSTEM)]
    out += [ChatMessage(role, text) for role, text in history[-WINDOW_TURNS:]]
    out += [ChatMessage("user", text) for text in new]
    return out


async def words(model: RehearsalModel, messages: list[ChatMessage]) -> AsyncIterator[str]:
    """The model's text deltas (no tools are offered, so there are no tool calls)."""
    async for event in model.stream(messages, []):
        if isinstance(event, TextDelta):
            yield event.text


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rehearsal-latency", type=float, default=0.0, help="seconds")
    parser.add_argument("--rehearsal-rate", type=float, default=0.0, help="words per second")
    parser.add_argument("--event-loop", choices=LOOPS, default="uvloop", help="as stillhere's")


def serve(build: Callable[[], web.Application], args: argparse.Namespace) -> int:
    """Run the app until SIGINT/SIGTERM; `print=None` keeps stdout quiet like stillhere."""
    if args.host != "127.0.0.1":
        raise SystemExit("the baselines listen on 127.0.0.1 only")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    loop = new_event_loop(args.event_loop)  # the same loop as stillhere: a fair comparison
    web.run_app(build(), host=args.host, port=args.port, print=None, access_log=None, loop=loop)
    return 0


async def send(ws: web.WebSocketResponse, frame: dict[str, Any]) -> bool:
    """Write one frame; False if the link is gone (the frame is lost with it)."""
    if ws.closed:
        return False
    try:
        await ws.send_str(dumps(frame))
    except (ConnectionError, RuntimeError):
        return False
    return True


async def cancel(task: asyncio.Task[Any] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
