"""`stillhere-bench soak`: a moderate flapping load for a long time, and what the server holds.

Starts a real `stillhere serve` (embedded PostgreSQL in a tmp data dir, rehearsal model),
brings up the flap bench's phones (`bench.flap_phones`: reference clients saying something
every few seconds while their links drop on a seeded schedule) for `--duration`, and reads
the server every `--sample-every` (`bench.soak_sample`): RSS, threads, open descriptors,
PostgreSQL connections, table sizes, live conversations and links, turns stored.

Each series gets its least-squares slope per hour over the last two thirds of the run (the
first third is warm-up: pools fill, windows and caches reach their size). What the live
conversations explain is taken out before judging: the threads serving their actors (the
actor pool's, or one per live actor), each attached link a socket, each pool connection a
socket, each stored turn its rows. The verdict (exit code 0 within every bound, 1 outside
one, 2 the run could not finish) holds these bounds over the judged samples:

- `threads - actor_threads` at most `--thread-slack` at every sample, and its fitted growth
  over the judged stretch at most `--leak-slack`: no thread that no conversation explains;
- `fds - tcp_established - db_connections` (descriptors that hold no live connection: files,
  pipes, listening sockets, and any socket leaked) likewise with `--fd-slack`; no TCP
  connection in CLOSE_WAIT beyond `--leak-slack` at any sample;
- `tcp_established - links` (connections that carry no attached link: an SSE phone's
  keep-alive connection for its POSTs, a link before its welcome) at most one per phone;
- `db_connections` grows by at most `--leak-slack`: the pools do not leak connections;
- the RSS slope per live conversation at most `--rss-kb-per-conversation-hour`;
- the tables' growth per turn stored at most `--bytes-per-turn`.

    .venv/bin/python -m bench.soak --duration 30m --json /tmp/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from actors.clock import parse_duration as seconds
from bench import procs, results
from bench.flap import add_rehearsal_options
from bench.flap_phones import Fleet, FleetOptions, add_fleet_options, now
from bench.soak_sample import Sample, Sampler
from client import Backoff
from providers.event_loop import run as run_on_loop
from transport.config import longer_than_zero

DESCRIPTION = "a flapping load for a long time: growth of RSS, threads, descriptors, tables"
HOUR_S = 3600.0
JUDGED_FROM = 1 / 3  # the slopes and the bounds cover the run after its first third
SERIES = (
    "rss_mb", "threads", "fds", "fds_sockets", "tcp_established", "tcp_close_wait",
    "db_connections", "tables_mb", "turns_stored", "live_actors", "actor_threads", "links",
    "threads_unexplained", "fds_unexplained", "connections_unexplained",
)  # fmt: skip


def add_parser(subparsers: Any) -> None:
    """`stillhere-bench soak`."""
    parser = subparsers.add_parser("soak", help=DESCRIPTION, description=DESCRIPTION)
    add_options(parser)
    parser.set_defaults(run=run)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=longer_than_zero, default=1800.0, help="the load's length (30m)"
    )
    parser.add_argument(
        "--sample-every", type=longer_than_zero, default=60.0, help="time between readings (60s)"
    )
    add_fleet_options(parser, clients=200, think_s=5.0, flap_every_s=30.0)
    parser.add_argument("--seed", type=int, default=1, help="seeds the phones' schedules")
    add_rehearsal_options(parser)
    bounds = parser.add_argument_group("bounds of the verdict")
    bounds.add_argument(
        "--thread-slack", type=int, default=32, help="threads beyond the actors' (32)"
    )
    bounds.add_argument(
        "--fd-slack",
        type=int,
        default=32,
        help="descriptors beyond the live connections, PostgreSQL's included (32)",
    )
    bounds.add_argument(
        "--leak-slack", type=float, default=4.0,
        help="fitted growth over the judged stretch of what nothing explains (4)",
    )  # fmt: skip
    bounds.add_argument(
        "--rss-kb-per-conversation-hour", type=float, default=64.0,
        help="RSS slope per live conversation (64 KB/h)",
    )  # fmt: skip
    bounds.add_argument(
        "--bytes-per-turn", type=float, default=2048.0, help="table growth per turn stored (2048)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "soak")
    parser.add_argument(
        "--settle-timeout", type=seconds, default=120.0, help="bound on the final settling (120s)"
    )


# -- figures ---------------------------------------------------------------------------------


def series(samples: Sequence[dict[str, Any]], key: str) -> list[float]:
    """One series of the samples; the derived ones take out what live conversations explain."""
    derived: dict[str, Callable[[dict[str, Any]], float]] = {
        "threads_unexplained": lambda s: s["threads"] - s["actor_threads"],
        "fds_unexplained": lambda s: s["fds"] - s["tcp_established"] - s["db_connections"],
        "connections_unexplained": lambda s: s["tcp_established"] - s["links"],
    }
    read = derived.get(key, lambda s: s[key])
    return [float(read(s)) for s in samples]


def slope_per_hour(t: Sequence[float], y: Sequence[float]) -> float | None:
    """The least-squares slope of y over t (seconds), per hour; None with under two points."""
    if len(t) < 2 or max(t) == min(t):
        return None
    return float(np.polyfit(np.asarray(t), np.asarray(y), 1)[0]) * HOUR_S


def judged(samples: Sequence[dict[str, Any]], duration_s: float) -> list[dict[str, Any]]:
    return [s for s in samples if s["t"] >= duration_s * JUDGED_FROM]


def _bound(name: str, measured: float | None, bound: float, what: str) -> dict[str, Any]:
    within = measured is not None and measured <= bound
    rounded = None if measured is None else round(measured, 3)
    return {"name": name, "measured": rounded, "bound": bound, "within": within, "what": what}


def bounds(
    samples: Sequence[dict[str, Any]], slopes: dict[str, float | None], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each bound of the verdict against what the judged samples measured."""
    span_h = (samples[-1]["t"] - samples[0]["t"]) / HOUR_S if samples else 0.0

    def growth(key: str) -> float | None:
        slope = slopes[key]
        return None if slope is None else slope * span_h

    def highest(key: str) -> float | None:
        return max(series(samples, key), default=None)

    live = statistics.fmean(series(samples, "live_actors")) if samples else 0.0
    rss, turns, tables = slopes["rss_mb"], slopes["turns_stored"], slopes["tables_mb"]
    per_conversation = None if rss is None or live < 1 else rss * 1024 / live
    per_turn = None if tables is None or not turns else tables * 2**20 / turns
    return [
        _bound("threads_unexplained_max", highest("threads_unexplained"),
               args.thread_slack, "threads - actor_threads, the most at any sample"),
        _bound("threads_unexplained_growth", growth("threads_unexplained"), args.leak_slack,
               "threads - actor_threads, fitted growth over the judged stretch"),
        _bound("fds_unexplained_max", highest("fds_unexplained"), args.fd_slack,
               "fds - tcp_established - db_connections, the most at any sample"),
        _bound("fds_unexplained_growth", growth("fds_unexplained"), args.leak_slack,
               "fds - tcp_established - db_connections, fitted growth over the judged stretch"),
        _bound("tcp_close_wait_max", highest("tcp_close_wait"), args.leak_slack,
               "connections the phone closed and the server did not, the most at any sample"),
        _bound("connections_unexplained_max", highest("connections_unexplained"), args.clients,
               "tcp_established - links, the most at any sample: at most one per phone"),
        _bound("db_connections_growth", growth("db_connections"), args.leak_slack,
               "the server's PostgreSQL connections, fitted growth over the judged stretch"),
        _bound("rss_kb_per_conversation_hour", per_conversation,
               args.rss_kb_per_conversation_hour, "RSS slope over the mean live actors"),
        _bound("table_bytes_per_turn", per_turn, args.bytes_per_turn,
               "the tables' slope over the slope of turns stored"),
    ]  # fmt: skip


def figures(samples: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Slopes and verdict from the samples alone: no reading of the run's clock or its
    processes, so a verdict can be checked on series drawn to leak."""
    window = judged(samples, args.duration)
    t = [s["t"] for s in window]
    slopes = {key: slope_per_hour(t, series(window, key)) for key in SERIES}
    checked = bounds(window, slopes, args)
    return {
        "judged_from_s": round(args.duration * JUDGED_FROM, 1),
        "judged_samples": len(window),
        "slopes_per_hour": {k: None if v is None else round(v, 3) for k, v in slopes.items()},
        "last": {key: series(samples[-1:], key)[0] for key in SERIES} if samples else {},
        "bounds": checked,
        "within_bounds": bool(checked) and all(b["within"] for b in checked),
    }


# -- the run ---------------------------------------------------------------------------------


async def _load(fleet: Fleet, sampler: Sampler, args: argparse.Namespace) -> list[Sample]:
    """The phones talk and flap for `--duration`; a reading at the start and every
    `--sample-every` until the end."""
    readings = [await sampler.read()]
    end = sampler.t0 + args.duration
    fleet.start_scripts(end)
    try:
        while (left := end - now()) > 0:
            await asyncio.sleep(min(args.sample_every, left))
            readings.append(await sampler.read())
    finally:
        await fleet.stop_scripts()
    return readings


def _machine() -> dict[str, Any]:
    return {"cpu_count": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="stillhere-soak-"))
    server = procs.start(
        "stillhere", root, latency=args.rehearsal_latency, rate=args.rehearsal_rate
    )
    report: dict[str, Any] = {"machine_at_start": _machine()}
    try:
        async with asyncio.timeout(args.duration + 3 * args.settle_timeout + 600):
            await procs.wait_ready(server)
            backoff = Backoff(first=0.2, cap=15.0, jitter=0.5)
            fleet = Fleet(FleetOptions.of(args, server.base_url, backoff), args.clients)
            try:
                await fleet.ramp(100)
                sampler = Sampler(server, now())
                await sampler.open()
                try:
                    readings = await _load(fleet, sampler, args)
                finally:
                    await sampler.close()
                report["unsettled"] = await fleet.wait_settled(args.settle_timeout)
            finally:
                await fleet.close()
            verdict = fleet.ledger.verdict(None, None)
            samples = [r.as_dict() for r in readings]
            report |= {
                "duration_s": args.duration,
                "sample_every_s": args.sample_every,
                "clients": args.clients,
                "think_s": args.think,
                "flap_every_s": args.flap_every,
                "transport": args.transport,
                "seed": args.seed,
                "says": verdict["says"],
                "replies": verdict["replies"],
                "link_events": dict(fleet.kinds),
                "phone_failures": dict(fleet.failures),
                **figures(samples, args),
                "samples": samples,
            }
    finally:
        report["server_stop"] = await asyncio.get_running_loop().run_in_executor(
            None, procs.stop, server
        )
        report["machine_at_end"] = _machine()
        shutil.rmtree(root, ignore_errors=True)
    return report


def table(report: dict[str, Any]) -> str:
    slopes, last = report["slopes_per_hour"], report["last"]
    lines = [
        f"{report['clients']} phones, a say every ~{report['think_s']:g} s, link events every "
        f"~{report['flap_every_s']:g} s, for {report['duration_s']:g} s; "
        f"{report['says']} says, {report['replies']} replies",
        f"slopes per hour over {report['judged_samples']} samples from "
        f"{report['judged_from_s']:g} s:",
        f"  {'series':<22}{'slope/h':>12}{'last':>12}",
    ]
    for key in SERIES:
        slope = slopes[key]
        shown = "-" if slope is None else f"{slope:.3f}"
        lines.append(f"  {key:<22}{shown:>12}{last.get(key, 0):>12g}")
    lines.append("bounds:")
    for b in report["bounds"]:
        mark = "ok  " if b["within"] else "OVER"
        lines.append(f"  {mark} {b['name']:<30} {b['measured']} (bound {b['bound']:g})")
    load = report["machine_at_start"]["load_average"], report["machine_at_end"]["load_average"]
    lines.append(f"load average at start {load[0]}, at end {load[1]}")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    """0 within every bound; 1 outside one; 2 if the run could not finish."""
    return await procs.finish(
        "soak", measure(args), args, table, lambda r: 0 if r["within_bounds"] else 1
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=DESCRIPTION)
    add_options(parser)
    return run_on_loop(run(parser.parse_args(argv)), "asyncio")


if __name__ == "__main__":
    sys.exit(main())
