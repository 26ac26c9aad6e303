"""`stillhere db`: the embedded PostgreSQL on its own, in the foreground, for nodes' `--db`.

Nodes that share one database (docs/architecture.md, "Several nodes") need it outside any
one of them. This prints the DSN on standard output, alone on its line, so that a script
can read it, and runs until SIGINT or SIGTERM, when it stops PostgreSQL and exits 0; it
exits 1 if PostgreSQL stops under it.

With `--standby-of DSN` it runs a streaming, synchronous standby of that PostgreSQL instead
(cloned on its first start), and `--promote` makes a running standby a primary: see
storage/replication.py for what each promises.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from storage import replication
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
    db.add_argument(
        "--standby-of",
        metavar="DSN",
        help="run a streaming standby of this PostgreSQL (cloned with pg_basebackup on the "
        "first start) and make it the primary's synchronous standby: a commit there returns "
        "once it is on this standby's disk too",
    )
    db.add_argument(
        "--standby-name",
        default="stillhere_standby",
        help="with --standby-of: its replication slot and name on the primary "
        "(default stillhere_standby)",
    )
    db.add_argument(
        "--promote",
        action="store_true",
        help="promote the standby running in the data folder to a primary, then exit",
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
    if args.promote:
        return _promote(args.data_dir)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # taken by sigtimedwait below
    try:
        if args.standby_of and not (args.data_dir / "pgdata" / "PG_VERSION").exists():
            replication.clone(args.data_dir, args.standby_of, args.standby_name)
        postgres = EmbeddedPostgres(args.data_dir, alone=True)
    except (InUse, replication.ReplicationError) as refused:
        print(f"stillhere db: {refused}", file=sys.stderr)
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
        if args.standby_of:
            try:
                asyncio.run(replication.name_synchronous(args.standby_of, args.standby_name))
            except replication.ReplicationError as failed:
                print(f"stillhere db: {failed}", file=sys.stderr)
                return 1
        print(dsn, flush=True)
        return _wait(postgres)
    finally:
        if args.standby_of and asyncio.run(
            replication.unname_synchronous(args.standby_of, args.standby_name)
        ):
            log.info("the primary no longer waits for standby %s", args.standby_name)
        postgres.stop()


def _promote(data: Path) -> int:
    try:
        replication.promote(data)
    except replication.ReplicationError as failed:
        print(f"stillhere db: {failed}", file=sys.stderr)
        return 1
    return 0


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
