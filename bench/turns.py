"""`python -m bench.turns`: what turn handling (reply matching, loose ends, the echo guard)
adds to the time a phone waits for a reply's first word.

A turn asks the analysis model which message a say answers while its context is gathered,
never before (actors/turn.py), and most turns ask nothing at all (actors/replies.py). This
bench measures both, as time from a say sent to its first `reply.delta`:

- `asked`: a question answered with a question that shares no word with it ("Did you
  finish that book?", "hmm, what would you say?"), which the rules cannot place, so the
  turn asks the analysis about it;
- `easy`: a say after one reply that asked nothing, decided without the analysis.

In one process: three stillhere servers on one PostgreSQL (an embedded one in a tmp folder,
or `--db`), all with the rehearsal chat model, the context cache off, and each context read
slowed to take `--context-ms` (300): `on` with reply matching and the echo guard, `off` with
neither (`--reply-matching off --echo-guard off`), `matching` with reply matching alone.
All ask one analysis model over HTTP, a stand-in that answers as the rehearsal analysis
would after `--analysis-ms` (300). Each round, for each scenario, a new phone on each server
(in turn, each round starting one further on) makes the scenario's first say, then the
timed one. Reported: first-delta p50/p99/max by scenario and server, what turn handling adds
(`on` minus `off` at p50 and p99), the echo guard's share of it (`on` minus `matching`),
and the reply-matching requests each scenario made. Targets (issue 32): added at most 10 ms
at p50 for `asked`, at most 2 ms for `easy`. The rehearsal's easy reply ("[rehearsal] You
said ...") opens like its previous one, so the guard holds its first words back until they
diverge: a hold-back on a reply that is no echo, as `bench.echo` measures on labelled ones.

    .venv/bin/python -m bench.turns --json bench/out/turns.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import web

from actors import context
from bench import results
from bench.in_process import finish, on_against_off, servers, serving
from providers.rehearsal_analysis import loose_ends, reply_matching
from storage.embedded import migrated_database

if TYPE_CHECKING:
    from actors.messages import TurnRequest
    from actors.runtime import Runtime

SECRET = "bench-turns-secret-of-at-least-32-bytes"
# Each scenario: the say that sets it up, then the timed say.
SCENARIOS = {
    "asked": ("ask me: did you finish that book?", "hmm, what would you say?"),
    "easy": ("hi there", "I went to the market this morning"),
}
TARGETS_MS = {"asked": 10.0, "easy": 2.0}  # added at p50, at most
# Turn handling on: reply matching (with loose ends) and the echo guard; off: neither;
# matching: reply matching alone, so that on - matching is the echo guard's share.
HANDLING = {
    "on": {"reply_matching": True, "echo_guard": True},
    "matching": {"reply_matching": True, "echo_guard": False},
    "off": {"reply_matching": False, "echo_guard": False},
}


class SlowAnalysis:
    """An analysis model over HTTP answering as the rehearsal analysis would, after `delay`
    seconds; it counts the requests of each task."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.asked: dict[str, int] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        task, *lines = body["messages"][-1]["content"].split("\n")
        self.asked[task] = self.asked.get(task, 0) + 1
        await asyncio.sleep(self.delay)
        answer = reply_matching(lines) if task == "reply-matching" else loose_ends(lines)
        message = {"role": "assistant", "content": orjson.dumps(answer).decode()}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return web.json_response({"choices": [choice]})


def analysis_app(analysis: SlowAnalysis) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", analysis.handle)
    return app


@contextlib.contextmanager
def slow_context(seconds: float) -> Iterator[None]:
    """Every turn's context takes `seconds` at least: the rules source waits that long
    before its read (both servers share the process's sources)."""
    rules = context.SOURCES["rules"]

    async def slowed(rt: Runtime, req: TurnRequest, now: datetime) -> list[Any]:
        await asyncio.sleep(seconds)
        return await rules(rt, req, now)

    context.SOURCES["rules"] = slowed
    try:
        yield
    finally:
        context.SOURCES["rules"] = rules


async def first_delta(http: aiohttp.ClientSession, url: str, setup: str, said: str) -> float:
    """A new phone says `setup` and waits for its reply, then says `said`: ms from sending
    it to its first `reply.delta`."""
    async with http.ws_connect(url + "/v1/ws") as ws:
        await ws.send_json({"type": "hello", "v": 1, "device": "bench-" + uuid.uuid4().hex})
        await ws.send_json({"type": "say", "id": uuid.uuid4().hex, "text": setup})
        await _until(ws, "reply.end")
        sent = time.perf_counter()
        await ws.send_json({"type": "say", "id": uuid.uuid4().hex, "text": said})
        await _until(ws, "reply.delta")
        return (time.perf_counter() - sent) * 1000.0


async def _until(ws: aiohttp.ClientWebSocketResponse, type_: str) -> None:
    async for message in ws:
        frame = orjson.loads(message.data)
        if frame["type"] == type_:
            return
        if frame["type"] == "error":
            break
    raise RuntimeError(f"no {type_}: {message.data!r}")


async def measure(args: argparse.Namespace) -> tuple[dict[str, dict[str, list[float]]], Any]:
    """First-delta times in ms by scenario and mode; and the reply-matching requests each
    scenario made of the analysis."""
    analysis = SlowAnalysis(args.analysis_ms / 1000.0)
    delays: dict[str, dict[str, list[float]]] = {s: {m: [] for m in HANDLING} for s in SCENARIOS}
    asked = dict.fromkeys(SCENARIOS, 0)
    with slow_context(args.context_ms / 1000.0):
        async with (
            migrated_database(args.db, None) as dsn,
            serving(analysis_app(analysis)) as analysis_url,
            servers(
                dsn,
                SECRET,
                HANDLING,
                analysis_url=analysis_url + "/v1",
                follow_ons="off",
                context_cache=0.0,
            ) as urls,
            aiohttp.ClientSession() as http,
        ):
            for round_ in range(args.rounds):
                for index, (scenario, (setup, said)) in enumerate(SCENARIOS.items()):
                    # The servers in turn, each round starting one further on.
                    start = (round_ + index) % len(HANDLING)
                    order = [*HANDLING][start:] + [*HANDLING][:start]
                    before = analysis.asked.get("reply-matching", 0)
                    for mode in order:
                        delay = await first_delta(http, urls[mode], setup, said)
                        delays[scenario][mode].append(delay)
                    asked[scenario] += analysis.asked.get("reply-matching", 0) - before
    return delays, asked


def report(
    args: argparse.Namespace, delays: dict[str, dict[str, list[float]]], asked: dict[str, int]
) -> dict[str, Any]:
    scenarios = {}
    for scenario, modes in delays.items():
        ms, added = on_against_off(modes)
        scenarios[scenario] = {
            "first_delta_ms": ms,
            "added_ms": added,
            "echo_guard_ms": on_against_off(modes, "matching")[1],
            "analysis_requests": asked[scenario],
            "target_p50_ms": TARGETS_MS[scenario],
            "target_met": added["p50"] <= TARGETS_MS[scenario],
        }
    return {
        "rounds": args.rounds,
        "context_ms": args.context_ms,
        "analysis_ms": args.analysis_ms,
        "scenarios": scenarios,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"turn handling: {result['rounds']} rounds, context {result['context_ms']:g} ms, "
        f"analysis {result['analysis_ms']:g} ms",
        f"  {'scenario':<9}{'mode':<9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}",
    ]
    for scenario, figures in result["scenarios"].items():
        for mode, f in figures["first_delta_ms"].items():
            lines.append(f"  {scenario:<9}{mode:<9}{f['p50']:>9}{f['p99']:>9}{f['max']:>9}")
        added, guard = figures["added_ms"], figures["echo_guard_ms"]
        met = "met" if figures["target_met"] else "NOT met"
        lines.append(
            f"  {scenario}: added p50 {added['p50']} ms, p99 {added['p99']} ms "
            f"(target p50 <= {figures['target_p50_ms']:g}: {met}); "
            f"{figures['analysis_requests']} reply-matching requests"
        )
        lines.append(
            f"  {scenario}: of which the echo guard p50 {guard['p50']} ms, p99 {guard['p99']} ms"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.turns", description=__doc__)
    parser.add_argument("--rounds", type=int, default=40, help="timed says per scenario (40)")
    parser.add_argument("--context-ms", type=float, default=300.0, help="context read (300)")
    parser.add_argument("--analysis-ms", type=float, default=300.0, help="analysis answer (300)")
    parser.add_argument("--db", default=None, help="PostgreSQL DSN; without it, an embedded one")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "turns")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.context_ms < 0 or args.analysis_ms < 0:
        parser.error("--rounds must be at least 1, the delays 0 or more")
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    return report(args, *await measure(args))


def main(argv: Sequence[str] | None = None) -> int:
    return finish(parse_args(argv), run, table)


if __name__ == "__main__":
    sys.exit(main())
