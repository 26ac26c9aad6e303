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

    python -m bench.against --rev HEAD~1 --throughput-rounds 10

`--rev` checks the revision out in a temporary git worktree and runs it with this
checkout's environment (bench/revision.py); a revision that needs other dependencies is
given as its own installed `stillhere` instead:

    git worktree add /tmp/before v1 && python3 -m venv /tmp/before/.venv \\
        && /tmp/before/.venv/bin/pip install -q -e /tmp/before
    python -m bench.against /tmp/before/.venv/bin/stillhere
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import procs
from bench.flap import (
    UNLIMITED,
    median_or_none,
    paired_ratios,
    throughput_figures,
    throughput_readings,
)
from bench.flap_throughput import Throughput, in_turn
from bench.flap_throughput import add_options as add_throughput_options
from bench.revision import RevisionError, checked_out, commit_of
from providers.event_loop import run as run_on_loop

THIS, OTHER = "this", "against"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.against", description=__doc__)
    other = parser.add_mutually_exclusive_group(required=True)
    other.add_argument("against", nargs="?", help="the other checkout's `stillhere` executable")
    other.add_argument("--rev", help="or a revision of this repository (a commit, HEAD~1)")
    add_throughput_options(parser, phones=50, says=150, rounds=10, warmup=5)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    if args.rev is not None:
        try:
            args.against = f"{args.rev} ({commit_of(args.rev)[:12]})"
        except RevisionError as unknown:
            parser.error(f"--rev {args.rev}: {unknown}")
    elif shutil.which(args.against) is None:
        parser.error(f"{args.against}: not an executable")
    if min(args.throughput_phones, args.throughput_says, args.throughput_rounds) < 1:
        parser.error("--throughput-phones, --throughput-says and --throughput-rounds: 1 or more")
    return args


def _paired(servers: dict[str, dict[str, Any]], key: str) -> dict[str, Any]:
    rounds = paired_ratios(servers, THIS, OTHER, key)
    return {"rounds": rounds, "median": median_or_none(rounds)}


def report(rounds: dict[str, list[Throughput]], args: argparse.Namespace) -> dict[str, Any]:
    servers = {label: throughput_figures(got) for label, got in rounds.items()}
    return {
        "against": args.against,
        "phones": args.throughput_phones,
        "says": args.throughput_says,
        "rounds": args.throughput_rounds,
        "servers": servers,
        "cpu_per_turn_ratio": _paired(servers, "rounds_server_cpu_ms_per_turn"),
        "turns_per_s_ratio": _paired(servers, "rounds_turns_per_s"),
    }


@contextlib.contextmanager
def _other(args: argparse.Namespace) -> Iterator[str]:
    """The other side's `stillhere`: the one given, or the revision's, checked out meanwhile
    (by git, before the loop starts and after it ends)."""
    if args.rev is None:
        yield args.against
        return
    with checked_out(args.rev) as revision:
        yield revision.executable


async def measure(args: argparse.Namespace, other: str) -> dict[str, Any]:
    """Both servers, `other` the other side's `stillhere`, timed round by round."""
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
        for label, executable in ((THIS, None), (OTHER, other))
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
            f"  {label:<9}{got['turns_per_s']!s:>10}{got['cpu_ms_per_turn']['server']!s:>13}"
            f"{got['deltas_per_reply']!s:>14}{sum(got['errors'].values()):>8}"
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
            f"{label}: errors {got['errors']}"
            for label, got in result["servers"].items()
            if got["errors"]
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with _other(args) as other:
        measuring = measure(args, other)
        return run_on_loop(procs.finish("against", measuring, args, table, _errors), "uvloop")


if __name__ == "__main__":
    sys.exit(main())
