"""`python -m bench.echo`: how long the echo guard holds back replies that are no echo.

While the start of a reply could still be a repetition of the person's message, the guard
holds it back (actors/echo.py), so a reply that starts like the message ("I had a rough day
too, ...") reaches the phone only once it diverges. This bench measures that delay: the time
from the model's first piece to the phone's first `reply.delta`, with the guard on and off.

In one process: two stillhere servers (`--echo-guard on` and `off`) on one PostgreSQL (an
embedded one in a tmp folder, or `--db`), both answered over HTTP by a scripted stand-in
for a chat model that streams each reply word by word at `--rate` words a second and notes
when it wrote the first word. The replies are the labelled cases of `--cases` that are no
echo and answer one message (`shown` equal to `reply`). For each case, `--rounds` times, a
new phone says the case's message to each server in turn (the order alternating), and leaves
after its first delta. Reported: first-delta delay p50/p99/max on and off, the hold-back
(on minus off), and how many words the guard held before each reply diverged.

    .venv/bin/python -m bench.echo --json bench/out/echo.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from actors.echo import EchoGuard, sources_for
from bench import results
from bench.in_process import finish, on_against_off, servers, serving
from evals.cases import Case, case_turns
from evals.turns import pieces, read_cases
from storage.embedded import migrated_database

CASES = Path(__file__).resolve().parent.parent / "tests" / "data" / "turn_cases.jsonl"
SECRET = "bench-echo-secret-of-at-least-32-bytes"
GUARD = {"on": {"echo_guard": True}, "off": {"echo_guard": False}}


class ScriptedModel:
    """An OpenAI-compatible chat API answering each message with its scripted reply, one
    word at a time at `rate` words a second; it notes when it wrote each reply's first word."""

    def __init__(self, replies: dict[str, str], rate: float) -> None:
        self.replies = replies
        self.pause = 1.0 / rate
        self.first_word: dict[str, float] = {}  # message -> time.monotonic()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        said = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        words = re.findall(r"\s*\S+\s*", self.replies.get(said, "Okay."))
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        with contextlib.suppress(ConnectionError):  # the turn was cut off: nobody listens
            for index, word in enumerate(words):
                if index:
                    await asyncio.sleep(self.pause)
                else:
                    self.first_word[said] = time.monotonic()
                await stream.write(_chunk({"content": word}))
            await stream.write(_chunk({}, "stop") + b"data: [DONE]\n\n")
        return stream


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"


def model_app(model: ScriptedModel) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", model.handle)
    return app


async def first_delta(http: aiohttp.ClientSession, url: str, said: str) -> float:
    """A new phone says `said`; when its first delta came (time.monotonic())."""
    async with http.ws_connect(url + "/v1/ws") as ws:
        await ws.send_json({"type": "hello", "v": 1, "device": "bench-" + uuid.uuid4().hex})
        await ws.send_json({"type": "say", "id": uuid.uuid4().hex, "text": said})
        async for message in ws:
            frame = orjson.loads(message.data)
            if frame["type"] == "reply.delta":
                return time.monotonic()
            if frame["type"] in ("reply.end", "error"):
                break
    raise RuntimeError(f"no delta for {said!r}: {frame}")


def bench_cases(path: Path, limit: int | None) -> list[Case]:
    """The cases that are no echo and answer one message, at most `limit` of them."""
    chosen = [
        case
        for case in read_cases(path)
        if case.family == "echo"
        and case.row["reply"] == case.row["shown"]
        and [t["role"] for t in case.row["turns"]] == ["user"]
    ]
    return chosen[:limit]


def held_words(case: Case) -> int:
    """Words of the reply the guard held before letting any of it go."""
    guard = EchoGuard(sources_for([], case_turns(case)))
    words = pieces(case.row["reply"], 0)
    return next((n for n, word in enumerate(words) if guard.feed(word)), len(words))


async def measure(args: argparse.Namespace, cases: list[Case]) -> dict[str, list[float]]:
    """First-delta delays in ms, by guard mode, every case said `args.rounds` times to each."""
    said = [case.row["turns"][-1]["text"] for case in cases]
    model = ScriptedModel({s: c.row["reply"] for s, c in zip(said, cases, strict=True)}, args.rate)
    delays: dict[str, list[float]] = {"on": [], "off": []}
    async with (
        migrated_database(args.db, None) as dsn,
        serving(model_app(model)) as model_url,
        servers(dsn, SECRET, GUARD, llm_url=model_url + "/v1") as urls,
        aiohttp.ClientSession() as http,
    ):
        for round_ in range(args.rounds):
            for index, text in enumerate(said):
                order = ("on", "off") if (round_ + index) % 2 == 0 else ("off", "on")
                for mode in order:
                    seen = await first_delta(http, urls[mode], text)
                    delays[mode].append((seen - model.first_word[text]) * 1000.0)
    return delays


def report(
    args: argparse.Namespace, cases: list[Case], delays: dict[str, list[float]]
) -> dict[str, Any]:
    ms, hold = on_against_off(delays)
    held = [held_words(case) for case in cases]
    return {
        "cases": len(cases),
        "rounds": args.rounds,
        "rate_words_per_s": args.rate,
        "first_delta_ms": ms,
        "hold_ms": hold,
        "held_words": {
            "replies_held": sum(1 for h in held if h),
            "p50": sorted(held)[len(held) // 2],
            "max": max(held),
        },
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"echo guard hold-back: {result['cases']} replies x {result['rounds']} rounds, "
        f"model at {result['rate_words_per_s']:g} words/s",
        f"  {'guard':<6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}",
    ]
    for mode, f in result["first_delta_ms"].items():
        lines.append(f"  {mode:<6}{f['p50']:>9}{f['p99']:>9}{f['max']:>9}")
    hold, held = result["hold_ms"], result["held_words"]
    lines.append(f"  hold-back (on - off): p50 {hold['p50']} ms, p99 {hold['p99']} ms")
    lines.append(
        f"  replies held at all: {held['replies_held']} of {result['cases']}, "
        f"words held p50 {held['p50']}, max {held['max']}"
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.echo", description=__doc__)
    parser.add_argument("--cases", type=Path, default=CASES, help="labelled cases (JSON lines)")
    parser.add_argument("--limit", type=int, default=None, help="use at most this many cases")
    parser.add_argument("--rounds", type=int, default=3, help="times each case is said (3)")
    parser.add_argument("--rate", type=float, default=20.0, help="model words a second (20)")
    parser.add_argument("--db", default=None, help="PostgreSQL DSN; without it, an embedded one")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "echo")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.rate <= 0:
        parser.error("--rounds must be at least 1 and --rate above 0")
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cases = bench_cases(args.cases, args.limit)
    if not cases:
        raise SystemExit(f"no case that is no echo and answers one message in {args.cases}")
    return report(args, cases, await measure(args, cases))


def main(argv: Sequence[str] | None = None) -> int:
    return finish(parse_args(argv), run, table)


if __name__ == "__main__":
    sys.exit(main())
