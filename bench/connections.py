"""`stillhere-bench connections`: what connected phones cost a node when most are quiet.

N phones connect, say hello and one thing (each conversation then has a window), and hold
their links open, pinging every `--ping-every`, while a share of them (`--talking`, 5%) say
something every `--say-every` (15 s). The same run is made, one after the other, against a
server whose quiet actors are deactivated after `--actor-idle` and one whose actors never
are (`--actor-idle 0`). The phones come in two halves, each held `--hold`; for each server:
the RSS per phone of the first half (at most what a held phone costs: every actor ran in
the ramp) and of the second (what one more held phone costs), its threads, the actors
running and the links (`/metrics`), its CPU per second over the second hold, and the first
`reply.delta` of a say from a sample of quiet phones (their conversations deactivated, on
the first server) against one from talking phones (active), one say at a time. Run:

    stillhere-bench connections --phones 500 --json bench/out/connections.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from actors.clock import parse_duration as seconds
from bench import procs, results
from bench.connections_hold import hold_links, scrape, server_options, stopped_badly, timed_says
from bench.connections_ramp import measure_ramp, plot, ramp_problems, ramp_table
from bench.live import Phone, Talk, close_all, percentiles, ramp
from bench.phones_gc import MODES as PHONES_GC_MODES
from bench.phones_gc import phones_collected
from providers.event_loop import run as run_on_loop

DESCRIPTION = "connected phones, most of them quiet: RSS and threads per phone, actor-idle on/off"


def add_parser(subparsers: Any) -> None:
    """`stillhere-bench connections`."""
    parser = subparsers.add_parser("connections", help=DESCRIPTION, description=DESCRIPTION)
    add_options(parser)
    parser.set_defaults(run=run)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--phones", type=int, default=500, help="phones connected (500)")
    parser.add_argument("--talking", type=float, default=0.05, help="share that talks (0.05)")
    parser.add_argument("--say-every", type=seconds, default=15.0, help="a talker's pace (15s)")
    parser.add_argument("--ping-every", type=seconds, default=30.0, help="a quiet phone's (30s)")
    parser.add_argument(
        "--actor-idle", type=seconds, default=60.0, help="the deactivating server's (60s)"
    )
    parser.add_argument(
        "--actor-threads",
        type=int,
        default=None,
        help="the servers' --actor-threads (default: the server's)",
    )
    parser.add_argument(
        "--hold", type=seconds, default=90.0, help="links held before measuring (90s)"
    )
    parser.add_argument("--sample", type=int, default=20, help="says timed of each kind (20)")
    parser.add_argument("--concurrency", type=int, default=50, help="phones connecting at once")
    parser.add_argument("--seed", type=int, default=1, help="seeds who talks and the sample")
    parser.add_argument(
        "--never-first",
        action="store_true",
        help="measure the never-deactivating server first (the later slot may come out ahead)",
    )
    parser.add_argument(
        "--steps",
        type=_counts,
        default=None,
        help="ramp one server (--actor-idle) through these phone counts, e.g. "
        "10000,20000,50000,100000, instead of comparing two servers at --phones",
    )
    parser.add_argument(
        "--sources",
        type=int,
        default=None,
        help="ramp: loopback source addresses (127.0.0.2 and up); default one per 25,000 phones",
    )
    parser.add_argument(
        "--resume-sample", type=int, default=200, help="ramp: phones resumed a step (200)"
    )
    parser.add_argument(
        "--idle-window",
        type=seconds,
        default=30.0,
        help="ramp: seconds of pings alone a step, for the idle links' CPU (30s)",
    )
    parser.add_argument(
        "--phones-gc",
        choices=PHONES_GC_MODES,
        default="off",
        help="the phones' own collector while says and resumes are timed: off (default), "
        "freeze what survives a collection, or plain (bench/phones_gc.py)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--plot", type=Path, default=None, help="ramp: write a PNG here")
    parser.add_argument(
        "--server-log", type=Path, default=None, help="ramp: keep the server's log here"
    )
    results.add_option(parser, "connections")
    parser.add_argument("--timeout", type=seconds, default=1800.0, help="bound on the run (30m)")


def _without(phones: Sequence[Phone], talking: Sequence[Phone]) -> list[Phone]:
    talkers = {id(phone) for phone in talking}
    return [phone for phone in phones if id(phone) not in talkers]


def _per_phone_kb(mb: float, phones: int) -> float | None:
    return round(mb * 1024 / phones, 1) if phones else None


async def _hold(
    http: aiohttp.ClientSession, server: procs.Server, args: argparse.Namespace
) -> dict[str, Any]:
    """The phones in two halves, each connected then held; measured after each hold. The
    first half's RSS per phone is at most what a held phone costs (every actor ran during
    the ramp, and memory freed since is not all given back); the second half's, added
    where the first half's freed memory is reused, is what each more held phone costs."""
    await asyncio.sleep(1.0)
    before_mb, before_threads = server.rss_mb(), server.threads()
    url = server.base_url + "/v1/ws"
    half = max(1, args.phones // 2)
    first, ramp_errors = await ramp(http, url, half, args.concurrency, Talk(1, True))
    chosen = random.Random(args.seed)
    talking = chosen.sample(first, min(len(first), max(1, round(args.talking * args.phones))))
    errors = await hold_links(_without(first, talking), talking, args)
    first_mb = server.rss_mb()
    second, more_errors = await ramp(http, url, args.phones - half, args.concurrency, Talk(1, True))
    phones = first + second
    cpu_before = procs.process_cpu_s(server.ps())
    errors += await hold_links(_without(phones, talking), talking, args)
    cpu_per_s = (procs.process_cpu_s(server.ps()) - cpu_before) / args.hold
    held_mb, held_threads = server.rss_mb(), server.threads()
    gauges = await scrape(http, server)
    quiet = _without(phones, talking)
    with phones_collected(args.phones_gc) as phones_gc:
        times = await timed_says(
            chosen.sample(quiet, min(args.sample, len(quiet))), talking, errors
        )
    after = await scrape(http, server)
    await close_all(phones, args.concurrency)
    return {
        "phones_connected": len(phones),
        "rss_mb_before": round(before_mb, 1),
        "rss_mb_first_half": round(first_mb, 1),
        "rss_mb_held": round(held_mb, 1),
        "rss_per_phone_kb": _per_phone_kb(first_mb - before_mb, len(first)),
        "rss_per_added_phone_kb": _per_phone_kb(held_mb - first_mb, len(second)),
        "threads_before": before_threads,
        "threads_held": held_threads,
        "cpu_per_s_held": round(cpu_per_s, 3),
        **gauges,
        "activations_after_sample": after.get("activations"),
        "first_delta_ms": {kind: percentiles(ms) for kind, ms in times.items()},
        "phones_gc": phones_gc,
        "errors": dict(ramp_errors + more_errors + errors),
    }


async def _one(root: Path, name: str, actor_idle: float, args: argparse.Namespace) -> Any:
    server = procs.start(
        "stillhere", root / name, latency=0.0, rate=0.0, extra=server_options(args, actor_idle)
    )
    try:
        await procs.wait_ready(server)
        limit = args.phones + 2 * args.sample + 100
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            figures = await _hold(http, server, args)
    finally:
        stopped = await procs.stopped(server)
    return {"actor_idle_s": actor_idle, **figures, "server_stop": stopped}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Both servers, the deactivating one first unless `--never-first`; their figures side
    by side."""
    root = Path(tempfile.mkdtemp(prefix="stillhere-connections-"))
    order = [("deactivating", args.actor_idle), ("never", 0.0)]
    measured: dict[str, Any] = {}
    try:
        async with asyncio.timeout(args.timeout):
            for name, actor_idle in reversed(order) if args.never_first else order:
                measured[name] = await _one(root, name, actor_idle, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    on, off = measured["deactivating"], measured["never"]
    return {
        "phones": args.phones,
        "talking": args.talking,
        "say_every_s": args.say_every,
        "hold_s": args.hold,
        "actor_threads": args.actor_threads,
        "never_first": args.never_first,
        "servers": measured,
        "threads_ratio": _ratio(on["threads_held"], off["threads_held"]),
        "rss_per_added_phone_ratio": _ratio(
            on["rss_per_added_phone_kb"], off["rss_per_added_phone_kb"]
        ),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def table(report: dict[str, Any]) -> str:
    on, off = report["servers"]["deactivating"], report["servers"]["never"]
    rows = [
        ("phones connected", "phones_connected"),
        ("RSS per phone, KB, at most", "rss_per_phone_kb"),
        ("RSS per added phone, KB", "rss_per_added_phone_kb"),
        ("threads held", "threads_held"),
        ("actors running", "actors_running"),
        ("links", "links"),
        ("CPU s per s held", "cpu_per_s_held"),
        ("deactivations", "deactivations"),
    ]
    lines = [
        f"stillhere connections bench: {report['phones']} phones, "
        f"{report['talking']:.0%} talking every {report['say_every_s']:.0f} s, "
        f"held {report['hold_s']:.0f} s",
        f"  {'':<30}{'actor-idle ' + str(on['actor_idle_s']) + ' s':>18}{'never':>12}",
    ]
    lines += [f"  {label:<30}{on.get(key)!s:>18}{off.get(key)!s:>12}" for label, key in rows]
    for kind in ("quiet", "talking"):
        a, b = on["first_delta_ms"][kind], off["first_delta_ms"][kind]
        lines.append(f"  {'first delta p99, ' + kind + ', ms':<30}{a['p99']!s:>18}{b['p99']!s:>12}")
    return "\n".join(lines)


def problems(report: dict[str, Any]) -> list[str]:
    found = []
    for name, server in report["servers"].items():
        found += [f"{name}: {error} (x{n})" for error, n in server["errors"].items()]
        if server["phones_connected"] != report["phones"]:
            found.append(f"{name}: {server['phones_connected']} of {report['phones']} connected")
        if stopped_badly(server["server_stop"]):
            found.append(f"{name}: server stop {server['server_stop']}")
    return found


def _counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or any(n < 1 for n in counts) or counts != sorted(counts):
        raise argparse.ArgumentTypeError("phone counts, rising, e.g. 10000,20000,50000")
    return counts


async def run(args: argparse.Namespace) -> int:
    """0 when every phone connected and every say was answered; 1 otherwise; 2 if the run
    could not finish."""
    if args.steps is None:
        return await procs.finish(
            "connections", measure(args), args, table, lambda r: procs.exit_code(problems(r))
        )
    return await procs.finish(
        "connections",
        measure_ramp(args),
        args,
        ramp_table,
        lambda r: _plotted(args, r, procs.exit_code(ramp_problems(r))),
    )


def _plotted(args: argparse.Namespace, report: dict[str, Any], code: int) -> int:
    if args.plot is not None:
        plot(args.plot, report)
        print(f"plot written to {args.plot}")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.connections", description=DESCRIPTION)
    add_options(parser)
    return run_on_loop(run(parser.parse_args(argv)), "asyncio")


if __name__ == "__main__":
    sys.exit(main())
