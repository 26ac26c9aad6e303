"""`python -m bench.hello_flood`: do well-behaved phones still resume while one address
floods the server with hellos?

Two stillhere servers one after the other (rehearsal model): `off`, with no per-address
limit, and `on`, with `--max-links-per-address`, `--links-per-s-per-address` and
`--link-burst-per-address` as given. Against each, N well-behaved bare WebSocket phones,
each from an address of its own (127.0.1.1, ...), each start a conversation; once all
have, each resumes its own R times: close the link, connect again and say hello naming
the conversation, timed from the connect to the welcome. They do it twice: alone (the
baseline), then while a flooder on another address (127.0.0.2, loopback's /8 routes every
address) opens links as fast as F concurrent loops can, each with a hello of a new device
(a new person, the costliest hello there is) and a close. The report gives, for each
server, resume p50/p95/p99 in both phases, the p99's ratio to the baseline, and the
flood's hellos answered and links refused per second.

    python -m bench.hello_flood --phones 200 --resumes 10 --flooders 64 \
        --address-limit 16 --address-rate 5 --address-burst 20
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench import procs, results
from bench.flap import percentiles, ratio
from bench.flap_throughput import connect, say
from providers.event_loop import LOOPS
from providers.event_loop import run as run_on_loop

FLOOD_ADDRESS = "127.0.0.2"
PAUSE_S = (0.5, 2.0)  # between a phone's resumes: some 150 a second from 200 phones


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.hello_flood", description=__doc__)
    parser.add_argument("--phones", type=int, default=200, help="well-behaved phones (200)")
    parser.add_argument("--resumes", type=int, default=10, help="timed resumes per phone (10)")
    parser.add_argument("--flooders", type=int, default=64, help="flood's concurrent loops (64)")
    parser.add_argument(
        "--address-limit",
        type=int,
        default=16,
        help="the `on` server's --max-links-per-address (16; 0: none)",
    )
    parser.add_argument(
        "--address-rate",
        type=float,
        default=5.0,
        help="the `on` server's --links-per-s-per-address (5; 0: none)",
    )
    parser.add_argument(
        "--address-burst",
        type=int,
        default=20,
        help="the `on` server's --link-burst-per-address (20)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--event-loop", choices=LOOPS, default="uvloop")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "hello_flood")
    args = parser.parse_args(argv)
    if min(args.phones, args.resumes, args.flooders) < 1:
        parser.error("--phones, --resumes and --flooders must each be at least 1")
    return args


@dataclass
class Flood:
    hellos: int = 0  # answered with a welcome
    refused: int = 0  # refused (429 too_many_links) or closed before a welcome
    seconds: float = 0.0


async def _flood(url: str, loops: int, stop: asyncio.Event, out: Flood) -> None:
    connector = aiohttp.TCPConnector(limit=0, local_addr=(FLOOD_ADDRESS, 0))
    async with aiohttp.ClientSession(connector=connector) as http:

        async def loop() -> None:
            while not stop.is_set():
                try:
                    ws, _ = await connect(http, url)
                    out.hellos += 1
                    await ws.close()
                except (aiohttp.ClientError, ConnectionError, RuntimeError, OSError):
                    out.refused += 1

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(loops)))
        out.seconds = time.perf_counter() - started


def phone_address(n: int) -> str:
    """Phone n's own loopback address (127.0.1.1, 127.0.1.2, ...): phones on the move have
    addresses of their own, so the per-address limit meets only the flood."""
    return f"127.0.{1 + n // 250}.{1 + n % 250}"


@dataclass
class Start:
    """Every phone has its conversation (`set_up`), then the timed resumes begin (`go`)."""

    set_up: asyncio.Barrier
    go: asyncio.Event


async def _resumes(n: int, url: str, resumes: int, rng: random.Random, start: Start) -> list[float]:
    connector = aiohttp.TCPConnector(limit=0, local_addr=(phone_address(n), 0))
    async with aiohttp.ClientSession(connector=connector) as http:
        device = f"resume-{rng.getrandbits(128):032x}"
        try:
            ws, welcome = await connect(http, url, device)
            await say(ws, "Hello, I will be back in a moment.")
            await ws.close()
        finally:
            await start.set_up.wait()
        await start.go.wait()
        return await _resume(http, url, device, welcome["conversation"], resumes, rng)


async def _resume(
    http: aiohttp.ClientSession,
    url: str,
    device: str,
    conversation: str,
    resumes: int,
    rng: random.Random,
) -> list[float]:
    """`resumes` timed reconnections to the phone's conversation (ms each)."""
    timings = []
    for _ in range(resumes):
        await asyncio.sleep(rng.uniform(*PAUSE_S))
        started = time.perf_counter()
        ws, welcome = await connect(http, url, device, conversation=conversation)
        timings.append((time.perf_counter() - started) * 1000.0)
        if not welcome["resumed"]:
            raise RuntimeError("a resume started a new conversation")
        await ws.close()
    return timings


async def _phase(
    server: procs.Server, args: argparse.Namespace, flood: Flood | None
) -> dict[str, Any]:
    url = server.base_url + "/v1/ws"
    rng = random.Random(args.seed)
    stop = asyncio.Event()
    start = Start(asyncio.Barrier(args.phones + 1), asyncio.Event())
    phones = asyncio.gather(
        *(
            _resumes(n, url, args.resumes, random.Random(rng.getrandbits(64)), start)
            for n in range(args.phones)
        ),
        return_exceptions=True,
    )
    await start.set_up.wait()
    flooding = asyncio.ensure_future(_flood(url, args.flooders, stop, flood)) if flood else None
    try:
        if flooding is not None:
            await asyncio.sleep(1.0)  # the flood at full strength before the first resume
        start.go.set()
        answers = await phones
    finally:
        stop.set()
        if flooding is not None:
            await flooding
    timings = [ms for r in answers if isinstance(r, list) for ms in r]
    errors = [f"{type(r).__name__}: {r}"[:120] for r in answers if isinstance(r, BaseException)]
    figures: dict[str, Any] = {"resume_ms": percentiles(timings), "errors": len(errors)}
    if errors:
        figures["first_error"] = errors[0]
    if flood is not None and flood.seconds:
        figures["flood_hellos_per_s"] = round(flood.hellos / flood.seconds, 1)
        figures["flood_refused_per_s"] = round(flood.refused / flood.seconds, 1)
    return figures


def _limits(args: argparse.Namespace) -> list[str]:
    """The `on` server's per-address options."""
    return [
        *("--max-links-per-address", str(args.address_limit)),
        *("--links-per-s-per-address", f"{args.address_rate:g}"),
        *("--link-burst-per-address", str(args.address_burst)),
    ]


async def _server(args: argparse.Namespace, root: Path, extra: list[str]) -> dict[str, Any]:
    """One server's two phases: the resumes alone, then under the flood."""
    server = procs.start(
        "stillhere", root, latency=0.0, rate=0.0, event_loop=args.event_loop, extra=extra
    )
    try:
        await procs.wait_ready(server)
        print(f"hello flood {root.name}: resumes alone ...", file=sys.stderr)
        alone = await _phase(server, args, None)
        print(f"hello flood {root.name}: resumes under the flood ...", file=sys.stderr)
        flooded = await _phase(server, args, Flood())
    finally:
        stopped = await asyncio.get_running_loop().run_in_executor(None, procs.stop, server)
    return {
        "options": extra,
        "alone": alone,
        "flooded": flooded,
        "p99_over_baseline": ratio(flooded["resume_ms"]["p99"], alone["resume_ms"]["p99"]),
        "server_stop": stopped,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="stillhere-hello-flood-"))
    try:
        off = await _server(args, root / "off", [])
        on = await _server(args, root / "on", _limits(args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "phones": args.phones,
        "resumes": args.resumes,
        "flooders": args.flooders,
        "off": off,
        "on": on,
        "flooded_p99_on_over_off": ratio(
            on["flooded"]["resume_ms"]["p99"], off["flooded"]["resume_ms"]["p99"]
        ),
    }


def table(result: dict[str, Any]) -> str:
    rows = []
    for limits in ("off", "on"):
        for phase in ("alone", "flooded"):
            figures = result[limits][phase]
            p = figures["resume_ms"]
            flood = (
                f"{figures['flood_hellos_per_s']:>10}{figures['flood_refused_per_s']:>10}"
                if phase == "flooded"
                else ""
            )
            rows.append(
                f"  {limits:<7}{phase:<9}{p['p50']!s:>9}{p['p95']!s:>9}{p['p99']!s:>9}"
                f"{p['n']:>7}{figures['errors']:>8}{flood}"
            )
    return "\n".join(
        [
            f"stillhere hello flood: {result['phones']} phones x {result['resumes']} resumes; "
            f"{result['flooders']} flood loops from {FLOOD_ADDRESS}; "
            f"limits on: {' '.join(result['on']['options'])}",
            f"  {'limits':<7}{'phase':<9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'n':>7}"
            f"{'errors':>8}{'hellos/s':>10}{'refused/s':>10}",
            *rows,
            f"  p99 over baseline: off {result['off']['p99_over_baseline']}, "
            f"on {result['on']['p99_over_baseline']}; flooded p99 on over off: "
            f"{result['flooded_p99_on_over_off']}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Figures to read, not a target to meet: exit 0 once the run finished."""
    args = parse_args(argv)
    finishing = procs.finish("hello flood", run(args), args, table, lambda _: 0)
    return run_on_loop(finishing, "asyncio")


if __name__ == "__main__":
    sys.exit(main())
