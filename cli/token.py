"""`stillhere token ACCOUNT`: a signed account token, for trying the server by hand."""

from __future__ import annotations

import argparse
from typing import Any

from cli.revoke import add_secret_options, secret_of
from transport.config import longer_than_zero
from transport.identity import DEFAULT_TOKEN_TTL_S, TOKEN_LEEWAY_S, Identity


def add_parser(commands: Any) -> None:
    token = commands.add_parser("token", help="print a signed account token")
    token.add_argument("account")
    add_secret_options(token)
    token.add_argument(
        "--expires",
        type=longer_than_zero,
        default=DEFAULT_TOKEN_TTL_S,
        help="lifetime: 7d, 12h, 30m or seconds (default 30d); "
        f"servers allow {TOKEN_LEEWAY_S} s of clock skew past it",
    )
    token.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print(Identity(secret_of(args)).issue(args.account, args.expires))
    return 0
