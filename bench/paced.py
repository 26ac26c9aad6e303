"""`python -m bench.paced`: the server's CPU per turn of a paced model, per delta window.

A model that streams at 20 words a second hands over a word every 50 ms, and every delta
the server sends costs a frame, a replay entry and a write per link. `--delta-window` trades
how many words a delta carries against that cost. This bench puts numbers on the trade: one
stillhere server per window, all started at once and timed in turn, round after round (so
each round finds the machine as the others did), M bare WebSocket phones each making K turns
back to back against the rehearsal model paced as in `bench flap`. Per window it reports the
server's CPU per turn (user + system, the median round), the deltas per reply, the turn
latency, and the CPU ratio to the first window, the baseline.

    python -m bench.paced --windows 20ms,100ms --phones 300 --says 12 --rounds 2
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from actors.clock import parse_duration
from bench import procs, results
from bench.flap import add_rehearsal_options, median_or_none, percentiles
from bench.flap_throughput import Throughput, measure
from providers.event_loop import LOOPS
from providers.event_loop import run as run_on_loop


def _windows(text: str) -> list[str]:
    """`20ms,100ms` -> ["20ms", "100ms"], each checked as a duration (as the server will)."""
    windows = [w.strip() for w in text.split(",") if w.strip()]
    for window in windows:
        parse_duration(window)
    if len(windows) < 2:
        raise argparse.ArgumentTypeError("give at least two windows: a baseline and another")
    return windows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.paced", description=__doc__)
    parser.add_argument(
        "--windows",
        type=_windows,
        default=_windows("20ms,100ms"),
        help="delta windows to compare, the first the baseline (default 20ms,100ms)",
    )
    parser.add_argument("--phones", type=int, default=300, help="phones (default 300)")
    parser.add_argument("--says", type=int, default=12, help="timed turns per phone (12)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per window (2)")
    add_rehearsal_options(parser)
    parser.add_argument("--event-loop", choices=LOOPS, default="uvloop")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "paced")
    args = parser.parse_args(argv)
    if min(args.phones, args.says, args.rounds) < 1:
        parser.error("--phones, --says and --rounds must each be at least 1")
    return args


async def _round(server: procs.Server, args: argparse.Namespace, warmup: int) -> Throughput:
    process = server.ps()
    return await measure(
        server.base_url,
        args.phones,
        args.says,
        timeout=600.0,
        warmup=warmup,
        readings=lambda: {"server": procs.process_cpu_s(process)},
    )


def _figures(rounds: list[Throughput]) -> dict[str, Any]:
    per_turn = [r.readings_s["server"] / r.turns * 1000.0 for r in rounds if r.turns]
    turns = sum(r.turns for r in rounds)
    return {
        "turns": turns,
        "server_cpu_ms_per_turn": median_or_none(per_turn),
        "rounds_server_cpu_ms_per_turn": [round(ms, 3) for ms in per_turn],
        "deltas_per_reply": round(sum(r.deltas for r in rounds) / turns, 2) if turns else None,
        "turn_ms": percentiles([ms for r in rounds for ms in r.turn_ms]),
        "errors": sum(sum(r.errors.values()) for r in rounds),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="stillhere-paced-"))
    servers = {
        window: procs.start(
            "stillhere",
            root / f"window-{i}",
            latency=args.rehearsal_latency,
            rate=args.rehearsal_rate,
            event_loop=args.event_loop,
            extra=["--delta-window", window],
        )
        for i, window in enumerate(args.windows)
    }
    try:
        for server in servers.values():
            await procs.wait_ready(server)
        rounds: dict[str, list[Throughput]] = {window: [] for window in servers}
        for n in range(args.rounds):
            for window, server in servers.items():
                print(f"paced: window {window}, round {n + 1} ...", file=sys.stderr)
                rounds[window].append(await _round(server, args, warmup=1 if n == 0 else 0))
    finally:
        for server in servers.values():
            await procs.stopped(server)
        shutil.rmtree(root, ignore_errors=True)
    return report(args, {window: _figures(rounds[window]) for window in servers})


def report(args: argparse.Namespace, windows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures per window, each with its CPU ratio to the first (the baseline)."""
    baseline = windows[args.windows[0]]["server_cpu_ms_per_turn"]
    for figures in windows.values():
        cpu = figures["server_cpu_ms_per_turn"]
        figures["cpu_over_baseline"] = round(cpu / baseline, 3) if cpu and baseline else None
    return {
        "phones": args.phones,
        "says": args.says,
        "rounds": args.rounds,
        "rehearsal": {"latency_s": args.rehearsal_latency, "rate_words_per_s": args.rehearsal_rate},
        "baseline": args.windows[0],
        "windows": windows,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"stillhere paced bench: {result['phones']} phones x {result['says']} turns, "
        f"{result['rounds']} rounds, rehearsal {result['rehearsal']['latency_s']:g} s + "
        f"{result['rehearsal']['rate_words_per_s']:g} w/s; baseline {result['baseline']}",
        f"  {'window':<8}{'cpu ms/turn':>12}{'ratio':>8}{'deltas/reply':>14}"
        f"{'turn p50':>10}{'p95':>9}{'p99':>9}{'errors':>8}",
    ]
    for window, f in result["windows"].items():
        t = f["turn_ms"]
        lines.append(
            f"  {window:<8}{f['server_cpu_ms_per_turn']!s:>12}{f['cpu_over_baseline']!s:>8}"
            f"{f['deltas_per_reply']!s:>14}{t['p50']!s:>10}{t['p95']!s:>9}{t['p99']!s:>9}"
            f"{f['errors']:>8}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_on_loop(run(args), args.event_loop)
    print(table(result))
    results.save(args, result)
    errors = sum(f["errors"] for f in result["windows"].values())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
