"""The fixed throughput phase: M phones each send K says back to back, no drops.

Run against each server in turn with a zero-latency rehearsal model, so what is measured
is the server's own cost per turn (link, actor or handler, storage), not the model's pace.
Each phone is a bare WebSocket (not the reference client) so the bench's own work per turn
is as small as possible and the same for every server: send a say, read frames until the
`reply.end` that answers it, send the next.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

FRAME_TIMEOUT_S = 30.0


@dataclass
class Throughput:
    phones: int
    says: int
    turns: int = 0
    seconds: float = 0.0
    deltas: int = 0  # reply.delta frames in the timed turns
    # What each of `measure`'s readings (seconds: the server's CPU, say) grew by over the
    # timed turns; empty without readings.
    readings_s: dict[str, float] = field(default_factory=dict)
    turn_ms: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def turns_per_s(self) -> float | None:
        return self.turns / self.seconds if self.seconds > 0 else None


class ErrorFrame(RuntimeError):
    """The server answered with an `error` frame; `code` is its code."""

    def __init__(self, code: str) -> None:
        super().__init__(f"error frame: {code}")
        self.code = code


async def next_frame(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    """The next frame; ConnectionError when the link ends, ErrorFrame on an `error`."""
    message = await asyncio.wait_for(ws.receive(), FRAME_TIMEOUT_S)
    if message.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
        raise ConnectionError(f"link ended: {message.type.name}")
    frame: dict[str, Any] = orjson.loads(message.data)
    if frame.get("type") == "error":
        raise ErrorFrame(str(frame.get("code")))
    return frame


async def connect(
    http: aiohttp.ClientSession, url: str, device: str | None = None, **hello: Any
) -> tuple[aiohttp.ClientWebSocketResponse, dict[str, Any]]:
    """A bare phone's link: connected, hello said (a new device unless given, and any
    other hello fields), and its welcome."""
    ws = await http.ws_connect(url)
    device = device or "tput-" + secrets.token_urlsafe(24)
    frame = {"type": "hello", "v": 1, "device": device, **hello}
    await ws.send_str(orjson.dumps(frame).decode())
    while (welcome := await next_frame(ws))["type"] != "welcome":
        pass
    return ws, welcome


async def say(ws: aiohttp.ClientWebSocketResponse, text: str) -> int:
    """Send a say; read until the `reply.end` after it; the deltas it took."""
    await ws.send_str(orjson.dumps({"type": "say", "id": uuid.uuid4().hex, "text": text}).decode())
    deltas = 0
    while (kind := (await next_frame(ws))["type"]) != "reply.end":
        deltas += kind == "reply.delta"
    return deltas


async def _turns(ws: aiohttp.ClientWebSocketResponse, k: int, out: Throughput | None) -> None:
    """K turns back to back; timed into `out` (None: a warm-up, not counted)."""
    for n in range(k):
        sent = time.perf_counter()
        deltas = await say(ws, f"Throughput message {n}, plain words and nothing more.")
        if out is not None:
            out.deltas += deltas
            out.turn_ms.append((time.perf_counter() - sent) * 1000.0)
            out.turns += 1


async def measure(
    base_url: str,
    phones: int,
    says: int,
    timeout: float,
    warmup: int = 0,
    readings: Callable[[], dict[str, float]] | None = None,
) -> Throughput:
    """Connect M phones (hello), let each make `warmup` untimed turns (pools filled,
    statements prepared, actors started: every server warm alike), then time M x K turns
    from the first say to the last end; `readings` (seconds, such as the server's CPU) are
    taken around those turns alone."""
    out = Throughput(phones, says)
    url = base_url + "/v1/ws"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        opened = await asyncio.wait_for(
            asyncio.gather(*(connect(http, url) for _ in range(phones))), timeout
        )
        links = [ws for ws, _ in opened]
        try:
            await asyncio.wait_for(
                asyncio.gather(*(_turns(ws, warmup, None) for ws in links)), timeout
            )
            before = readings() if readings is not None else {}
            started = time.perf_counter()
            results = await asyncio.wait_for(
                asyncio.gather(*(_turns(ws, says, out) for ws in links), return_exceptions=True),
                timeout,
            )
            out.seconds = time.perf_counter() - started
            if readings is not None:
                out.readings_s = {key: value - before[key] for key, value in readings().items()}
            for result in results:
                if isinstance(result, BaseException):
                    key = f"{type(result).__name__}: {result}"[:200]
                    out.errors[key] = out.errors.get(key, 0) + 1
        finally:
            await asyncio.gather(*(ws.close() for ws in links), return_exceptions=True)
    return out


async def in_turn(
    targets: dict[str, tuple[str, Callable[[], dict[str, float]]]],
    args: Any,
    what: str = "throughput",
) -> dict[str, list[Throughput]]:
    """Each target (label: base URL and its readings) timed in turn, round after round
    (`args.throughput_rounds`, `_phones`, `_says`; `_warmup` says in the first round only),
    so that each round finds the machine as the others did."""
    rounds: dict[str, list[Throughput]] = {label: [] for label in targets}
    for n in range(args.throughput_rounds):
        for label, (base_url, readings) in targets.items():
            print(f"{what}: {label}, round {n + 1} ...", file=sys.stderr)
            rounds[label].append(
                await measure(
                    base_url,
                    args.throughput_phones,
                    args.throughput_says,
                    timeout=600.0,
                    warmup=args.throughput_warmup if n == 0 else 0,
                    readings=readings,
                )
            )
    return rounds


def add_options(parser: Any, *, phones: int, says: int, rounds: int, warmup: int) -> None:
    """The throughput phase's M phones x K says, its rounds and its untimed first says."""
    parser.add_argument(
        "--throughput-phones", type=int, default=phones, help=f"M (default {phones})"
    )
    parser.add_argument("--throughput-says", type=int, default=says, help=f"K (default {says})")
    parser.add_argument(
        "--throughput-rounds",
        type=int,
        default=rounds,
        help=f"rounds, every server in turn ({rounds})",
    )
    parser.add_argument(
        "--throughput-warmup",
        type=int,
        default=warmup,
        help=f"untimed says per phone first ({warmup})",
    )
