"""`stillhere-bench` (or `python -m bench`): the load benchmarks, each a subcommand.

The benches sit above the product and drive it from outside: the product's own command,
`stillhere`, knows nothing of them (bench/README.md)."""

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
    lease,
    report,
    rolling,
    soak,
)
from providers.event_loop import run as run_on_loop
from transport.logs import setup_logging

BENCHES = (flap, fuzz, crash, soak, rolling, db_cost, cluster_kill, failover, connections)
BENCHES += (lease, report)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stillhere-bench", description=__doc__)
    benches = parser.add_subparsers(dest="bench", required=True)
    for module in BENCHES:
        module.add_parser(benches)  # flap, fuzz, ..., connections, lease, report
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging("text")
    # flap's phones run on the loop its servers do; the other benches on asyncio's
    return run_on_loop(args.run(args), getattr(args, "event_loop", "asyncio"))


if __name__ == "__main__":
    sys.exit(main())
