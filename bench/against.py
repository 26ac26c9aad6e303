"""`python -m bench.against`: this checkout's zero-latency turn against another checkout's.

A change to what a turn costs is a few percent of the server's CPU, and on a shared machine
one throughput round moves by as much from the next. So both servers are started at once
and timed in turn, round after round, each round the flap bench's throughput phase (M bare
WebSocket phones, K says each back to back, a zero-latency rehearsal model:
bench/flap_throughput.py), and each round's two figures are paired. Reported per server:
turns/s and the server's CPU per turn, the median round; and the rounds' ratios, this
checkout over the other, with their median. Tell a change from noise by the paired ratios,
not by two medians: an A/A run (`--against` this checkout's own `stillhere`) shows how far
they spread on the machine of the day.

    git worktree add /tmp/before HEAD~1 && python3 -m venv /tmp/before/.venv \\
        && /tmp/before/.venv/bin/pip install -q -e /tmp/before
    python -m bench.against /tmp/before/.venv/bin/stillhere --throughput-rounds 10
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import procs
from bench.flap import UNLIMITED, median_or_none, throughput_readings
from bench.flap_throughput import Throughput, in_turn
from bench.flap_throughput import add_options as add_throughput_options
from providers.event_loop import run as run_on_loop

THIS, OTHER = "this", "against"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.against", description=__doc__)
    parser.add_argument("against", help="the other checkout's `stillhere` executable")
    add_throughput_options(parser, phones=50, says=150, rounds=10, warmup=5)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    if shutil.which(args.against) is None:
        parser.error(f"{args.against}: not an executable")
    if min(args.throughput_phones, args.throughput_says, args.throughput_rounds) < 1:
        parser.error("--throughput-phones, --throughput-says and --throughput-rounds: 1 or more")
    return args


def _per_round(rounds: list[Throughput]) -> list[tuple[float, float]]:
    """Each round's turns/s and server CPU ms a turn."""
    return [
        (r.turns / r.seconds, r.readings_s["server"] / r.turns * 1000.0)
        for r in rounds
        if r.turns and r.seconds
    ]


def _deltas_per_reply(rounds: list[Throughput]) -> float | None:
    """A change may send more frames or fewer: its replies' deltas tell."""
    turns = sum(r.turns for r in rounds)
    return round(sum(r.deltas for r in rounds) / turns, 2) if turns else None


def _ratios(this: list[float], other: list[float]) -> dict[str, Any]:
    paired = [round(a / b, 3) for a, b in zip(this, other, strict=True) if b]
    return {"rounds": paired, "median": round(statistics.median(paired), 3) if paired else None}


def report(rounds: dict[str, list[Throughput]], args: argparse.Namespace) -> dict[str, Any]:
    figures = {label: _per_round(got) for label, got in rounds.items()}
    paired = min(len(f) for f in figures.values())
    this, other = (figures[label][:paired] for label in (THIS, OTHER))
    return {
        "against": args.against,
        "phones": args.throughput_phones,
        "says": args.throughput_says,
        "rounds": args.throughput_rounds,
        "servers": {
            label: {
                "turns_per_s": median_or_none([t for t, _ in got], digits=1),
                "server_cpu_ms_per_turn": median_or_none([ms for _, ms in got], digits=3),
                "deltas_per_reply": _deltas_per_reply(rounds[label]),
                "errors": sum(sum(r.errors.values()) for r in rounds[label]),
            }
            for label, got in figures.items()
        },
        "cpu_per_turn_ratio": _ratios([ms for _, ms in this], [ms for _, ms in other]),
        "turns_per_s_ratio": _ratios([t for t, _ in this], [t for t, _ in other]),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="stillhere-against-"))
    servers = {
        label: procs.start(
            "stillhere",
            root,
            latency=0.0,
            rate=0.0,
            extra=UNLIMITED,
            home=root / label,
            executable=executable,
        )
        for label, executable in ((THIS, None), (OTHER, args.against))
    }
    try:
        for server in servers.values():
            await procs.wait_ready(server)
        targets = {
            label: (server.base_url, lambda server=server: throughput_readings(server))
            for label, server in servers.items()
        }
        rounds = await in_turn(targets, args, "against")
    finally:
        for server in servers.values():
            await procs.stopped(server)
        shutil.rmtree(root, ignore_errors=True)
    return report(rounds, args)


def table(result: dict[str, Any]) -> str:
    lines = [
        f"stillhere against {result['against']}: {result['phones']} phones x "
        f"{result['says']} turns, {result['rounds']} rounds, zero-latency model",
        f"  {'server':<9}{'turns/s':>10}{'cpu ms/turn':>13}{'deltas/reply':>14}{'errors':>8}",
    ]
    for label, got in result["servers"].items():
        lines.append(
            f"  {label:<9}{got['turns_per_s']:>10}{got['server_cpu_ms_per_turn']:>13}"
            f"{got['deltas_per_reply']:>14}{got['errors']:>8}"
        )
    for key, what in (("cpu_per_turn_ratio", "CPU a turn"), ("turns_per_s_ratio", "turns/s")):
        ratios = result[key]
        lines.append(
            f"  {what}, this / against: median {ratios['median']}, rounds {ratios['rounds']}"
        )
    return "\n".join(lines)


def _errors(result: dict[str, Any]) -> int:
    return procs.exit_code(
        [
            f"{label}: {got['errors']} errors"
            for label, got in result["servers"].items()
            if got["errors"]
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_on_loop(procs.finish("against", measure(args), args, table, _errors), "uvloop")


if __name__ == "__main__":
    sys.exit(main())
