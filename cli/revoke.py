"""`stillhere revoke`: refuse an account or a device from now on, and close its live links.

The revocation is stored in PostgreSQL (`revocations`, by person key: no credential is
written) and announced with NOTIFY in the same transaction; every running server listens
(transport/revocations.py), refuses the person at its next hello or request and closes its
live links at once. It works beside a running server on its database (`--db`); the
embedded PostgreSQL of `--data-dir` it opens only while no server uses it.

An account is named as in its tokens (`sub`), and its key is made with the server's
secret. A device is named by its person key, the one the admin API and `stillhere inspect`
show: a device secret is never typed on a command line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import asyncpg

from storage import revocations
from storage.embedded import migrated_database
from transport.config import add_data_dir_option, add_db_options, env_value
from transport.identity import Identity, load_or_create_secret

log = logging.getLogger("stillhere.revoke")


def add_secret_options(parser: argparse.ArgumentParser, *, data_dir: bool = True) -> None:
    """The secret that signs tokens and keys persons: `--secret`, else the data dir's
    (`--data-dir`, added here unless the parser has it already: `data_dir=False`)."""
    if data_dir:
        add_data_dir_option(parser)
    parser.add_argument("--secret", default=env_value("secret"), help="env STILLHERE_SECRET")


def secret_of(args: argparse.Namespace) -> str:
    return str(args.secret or load_or_create_secret(args.data_dir))


def _account_key(args: argparse.Namespace) -> str | None:
    """The account's person key under the server's secret; None if there is no secret to
    read (made up here, it would key an account nobody has, and revoke nothing)."""
    secret_file = args.data_dir / "secret"
    if args.secret:
        secret = str(args.secret)
    elif secret_file.exists():
        secret = load_or_create_secret(args.data_dir)
    else:
        return None
    return Identity(secret).account_key(args.account)


def add_parser(commands: Any) -> None:
    revoke = commands.add_parser(
        "revoke", help="refuse an account or device from now on and close its live links"
    )
    who = revoke.add_mutually_exclusive_group(required=True)
    who.add_argument("account", nargs="?", help="the account, as in its tokens' `sub`")
    who.add_argument("--person", help="a person key (a device's), as the admin API shows it")
    revoke.add_argument("--lift", action="store_true", help="lift the revocation instead")
    add_db_options(revoke, scratch=False)
    add_secret_options(revoke, data_dir=False)
    revoke.set_defaults(run=run)


async def run(args: argparse.Namespace) -> int:
    person = args.person or _account_key(args)
    if person is None:
        print(
            f"stillhere revoke: no secret in {args.data_dir} and no --secret: an account is "
            "keyed by the server's secret, so pass the one the server uses",
            file=sys.stderr,
        )
        return 2
    async with migrated_database(args.db, args.data_dir) as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            if args.lift:
                changed = await revocations.lift(conn, person)
            else:
                changed = await revocations.revoke(conn, person)
        finally:
            await conn.close()
    done = "lifted the revocation of" if args.lift else "revoked"
    state = "" if changed else " (it already was)" if not args.lift else " (it was not revoked)"
    print(f"{done} person {person}{state}")
    return 0
