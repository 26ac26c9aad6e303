"""The `stillhere` command: `serve`, `db`, `cluster`, `token`, `revoke`, `inspect`, `memory`
and `eval`. The benchmarks are a command of their own, `stillhere-bench` (bench/__main__.py):
they drive the product from above, and nothing here imports them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("serve", "token", "inspect"):
        return int(args.run(args))
    setup_logging("text")
    if args.command in ("db", "cluster"):
        return int(args.run(args))
    try:
        return run_on_loop(args.run(args), "asyncio")
    except InUse as busy:
        other_way = ", or pass --db with a DSN" if hasattr(args, "db") else ""
        print(f"stillhere {args.command}: {busy}{other_way}", file=sys.stderr)
        return 1
    except memory.UnknownPerson as unknown:
        print(f"stillhere {args.command}: {unknown}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
