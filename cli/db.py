"""`stillhere db`: the embedded PostgreSQL on its own, in the foreground, for nodes' `--db`.

Nodes that share one database (docs/architecture.md, "Several nodes") need it outside any
one of them. This prints the DSN on standard output, alone on its line, so that a script
can read it, and runs until SIGINT or SIGTERM, when it stops PostgreSQL and exits 0; it
exits 1 if PostgreSQL stops under it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from storage.embedded import EmbeddedPostgres, InUse
from transport.admin import is_loopback
from transport.config import add_data_dir_option

log = logging.getLogger("stillhere.db")

# How often the postmaster is looked at while waiting for a signal.
WATCH_S = 1.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def add_parser(commands: Any) -> None:
    db = commands.add_parser(
        "db",
        help="run the embedded PostgreSQL alone, in the foreground, and print its DSN",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_option(db, "the database (its pgdata/)")
    db.add_argument(
        "--port",
        type=int,
        help="listen on this TCP port too and print a TCP DSN (without it: the unix socket "
        "only, for nodes on this machine)",
    )
    db.add_argument(
        "--host",
        help="with --port, the address to listen on (default 127.0.0.1: this machine only). "
        "Connections from this machine are trusted; a non-loopback address (0.0.0.0 for "
        "all) lets other machines in with the password kept in DATA_DIR/db-password "
        "(scram-sha-256, no TLS: a private network only)",
    )
    db.set_defaults(run=run)


def add_data_option(parser: argparse.ArgumentParser, holds: str) -> None:
    """`--data-dir`, as every command has it; `--data`, its older spelling, still works."""
    add_data_dir_option(parser, holds)
    parser.add_argument(
        "--data", dest="data_dir", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )


def run(args: argparse.Namespace) -> int:
    """Start, print the DSN, wait for a stop signal, stop."""
    if args.host is not None and args.port is None:
        print(
            "stillhere db: --host needs --port (without it: the unix socket only)", file=sys.stderr
        )
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # taken by sigtimedwait below
    try:
        postgres = EmbeddedPostgres(args.data_dir, alone=True)
    except InUse as busy:
        print(f"stillhere db: {busy}", file=sys.stderr)
        return 1
    try:
        dsn = postgres.dsn
        if args.port is not None:
            host = args.host or "127.0.0.1"
            remote = not is_loopback(host)
            try:
                dsn = postgres.listen(host, args.port, remote=remote)
            except subprocess.CalledProcessError:
                print(
                    f"stillhere db: PostgreSQL could not listen on {host}:{args.port} (in use? "
                    f"not an address of this machine?): see {postgres.pgdata / 'log'}",
                    file=sys.stderr,
                )
                return 1
            if remote:
                log.info(
                    "other machines connect with the password in %s (add it to the DSN, "
                    "or set PGPASSWORD)",
                    postgres.password_file(),
                )
        print(dsn, flush=True)
        return _wait(postgres)
    finally:
        postgres.stop()


def _wait(postgres: EmbeddedPostgres) -> int:
    """0 once SIGINT or SIGTERM comes; 1 if PostgreSQL stopped first."""
    while True:
        received = signal.sigtimedwait(STOP_SIGNALS, WATCH_S)
        if received is not None:
            log.info("stopping on %s", signal.Signals(received.si_signo).name)
            return 0
        if not postgres.running():
            log.error("embedded PostgreSQL in %s stopped on its own", postgres.pgdata)
            return 1
