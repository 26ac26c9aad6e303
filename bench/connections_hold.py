"""What the connections benches do with phones held open: they ping, a share of them talk,
and a say's first delta is timed; the server's gauges read from `/metrics`. Shared by the
one-size run (bench/connections.py) and the ramp (bench/connections_ramp.py)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import aiohttp

from bench import flap_metrics, procs
from bench.live import Phone, describe, expect
from bench.live import say as say_and_ack

SAY_PAUSE_S = 0.2  # before each timed say
GAUGES = {
    "stillhere_live_actors": "actors_running",
    "stillhere_conversations": "conversations",
    "stillhere_links": "links",
    "stillhere_activations_total": "activations",
    "stillhere_deactivations_total": "deactivations",
}


async def scrape(http: aiohttp.ClientSession, server: procs.Server) -> dict[str, float]:
    """GAUGES' samples, by report key, from one read of the server's `/metrics`."""
    samples = await flap_metrics.scrape(server.base_url, http)
    return {GAUGES[s.name]: s.value for s in samples if s.name in GAUGES}


async def first_delta_ms(phone: Phone) -> float:
    """Milliseconds from a say to its reply's first delta; the reply is then read whole
    and acked, as a phone does."""
    id_ = uuid.uuid4().hex  # in the text too: a phone timed again says something new
    text = json.dumps({"type": "say", "id": id_, "text": f"and how are you, {id_[:6]}?"})
    sent = time.perf_counter()
    await phone.link.ws.send_str(text)
    arrived, _, _ = await expect(phone.link, "reply.delta")
    _, end, top = await expect(phone.link, "reply.end")
    phone.last_seq = max(phone.last_seq, top, int(end["seq"]))
    await phone.link.ws.send_str(json.dumps({"type": "ack", "seq": phone.last_seq}))
    return (arrived - sent) * 1000.0


async def _every(every: float, stop: asyncio.Event, act: Any, errors: Counter[str]) -> None:
    """`act()` every `every` seconds until `stop`; an act under way is finished first."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
        except TimeoutError:
            try:
                await act()
            except Exception as error:
                errors[describe(error)] += 1


async def _talk(phone: Phone) -> None:
    await say_and_ack(phone, "tell me more", ack=True)


async def _ping(phone: Phone) -> None:
    await phone.link.ws.send_str('{"type":"ping"}')
    await expect(phone.link, "pong")


async def timed_says(
    quiet: Sequence[Phone], talking: Sequence[Phone], errors: Counter[str]
) -> dict[str, list[float]]:
    """One say at a time, a quiet phone's then a talking one's (the talkers in turn), each
    after `SAY_PAUSE_S`: a say sent the moment the one before it was answered would meet
    that one's work after its reply (the mood, loose ends) and time it too."""
    times: dict[str, list[float]] = {"quiet": [], "talking": []}
    for pair in zip(quiet, itertools.cycle(talking), strict=False):
        for kind, phone in zip(("quiet", "talking"), pair, strict=True):
            await asyncio.sleep(SAY_PAUSE_S)
            try:
                times[kind].append(await first_delta_ms(phone))
            except Exception as error:
                errors[describe(error)] += 1
    return times


async def hold_links(
    quiet: Sequence[Phone],
    talking: Sequence[Phone],
    args: argparse.Namespace,
    hold: float | None = None,
) -> Counter[str]:
    """`hold` seconds (`--hold`) of the talkers talking and the quiet phones pinging; what
    went wrong."""
    errors: Counter[str] = Counter()
    stop = asyncio.Event()
    tasks = [_every(args.say_every, stop, lambda p=p: _talk(p), errors) for p in talking]
    tasks += [_every(args.ping_every, stop, lambda p=p: _ping(p), errors) for p in quiet]
    holding = asyncio.gather(*tasks)
    try:
        await asyncio.sleep(args.hold if hold is None else hold)
    finally:
        stop.set()
        await holding
    return errors


def server_options(args: argparse.Namespace, actor_idle: float) -> list[str]:
    """The server's options: `actor_idle`, and `--actor-threads` if given."""
    chosen = [] if args.actor_threads is None else ["--actor-threads", str(args.actor_threads)]
    return ["--actor-idle", f"{actor_idle}s", *chosen]


def stopped_badly(stop: dict[str, Any]) -> bool:
    """A server killed, exited with an error, or with problems in its log."""
    return bool(stop["killed"] or stop["exit_code"] not in (0, None) or stop["log_problems"])
