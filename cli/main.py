"""The `stillhere` command: `serve`, `db`, `cluster`, `token`, `revoke`, `inspect`, `memory`,
`eval` and `bench`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bench import (
    cluster_kill,
    connections,
    crash,
    db_cost,
    failover,
    flap,
    fuzz,
    report,
    rolling,
    soak,
)
from cli import cluster, db, inspect, memory, revoke, serve, token
from evals import dedup, loose_ends, search, turns
from evals.command import add_eval_command
from providers.event_loop import run as run_on_loop
from storage.embedded import InUse
from transport.logs import setup_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stillhere", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (serve, db, cluster, token, revoke, inspect, memory):
        command.add_parser(commands)
    evals = add_eval_command(commands)
    for evaluation in (dedup, turns, search, loose_ends):
        evaluation.add_parser(evals)  # eval dedup, eval turns, eval search, eval loose-ends
    bench = commands.add_parser("bench", help="load benchmarks (see bench/README.md)")
    benches = bench.add_subparsers(dest="bench", required=True)
    for module in (
        flap,
        fuzz,
        crash,
        soak,
        rolling,
        db_cost,
        cluster_kill,
        failover,
        connections,
        report,
    ):
        module.add_parser(benches)  # bench flap, ..., failover, connections, report
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("serve", "token", "inspect"):
        return int(args.run(args))
    setup_logging("text")
    if args.command in ("db", "cluster"):
        return int(args.run(args))
    # bench flap's phones run on the loop its servers do; the other commands on asyncio's
    try:
        return run_on_loop(args.run(args), getattr(args, "event_loop", "asyncio"))
    except InUse as busy:
        other_way = ", or pass --db with a DSN" if hasattr(args, "db") else ""
        print(f"stillhere {args.command}: {busy}{other_way}", file=sys.stderr)
        return 1
    except memory.UnknownPerson as unknown:
        print(f"stillhere {args.command}: {unknown}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
