"""The `stillhere` command: `serve`, `db`, `cluster`, `token`, `revoke`, `inspect`, `memory`,
`eval` and `bench`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial

from bench import cluster_kill, crash, db_cost, flap, fuzz, rolling, soak
from providers.event_loop import run as run_on_loop
from storage.embedded import InUse
from transport import (
    cluster_cli,
    db_cli,
    eval_dedup,
    eval_search,
    eval_turns,
    memory_cli,
    revoke_cli,
)
from transport.admin import AdminExposed, check_admin_host
from transport.app import build_app, log_listening, runner_options
from transport.config import add_options, longer_than_zero, settings_from
from transport.drain import drain
from transport.eval_io import add_eval_command
from transport.identity import DEFAULT_TOKEN_TTL_S, TOKEN_LEEWAY_S, Identity
from transport.inspect import add_inspect_options, run_inspect
from transport.listener import serve
from transport.logs import setup_logging
from transport.revoke_cli import add_secret_options, secret_of


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stillhere", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the conversation server")
    add_options(serve)
    db_cli.add_parser(commands)  # db
    cluster_cli.add_parser(commands)  # cluster
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
    revoke_cli.add_parser(commands)  # revoke
    inspect = commands.add_parser(
        "inspect", help="show live actors (or one) through a running server's admin API"
    )
    add_inspect_options(inspect)
    memory_cli.add_parser(commands)  # memory consolidate
    evals = add_eval_command(commands)
    for evaluation in (eval_dedup, eval_turns, eval_search):
        evaluation.add_parser(evals)  # eval dedup, eval turns, eval search
    bench = commands.add_parser("bench", help="load benchmarks (see bench/README.md)")
    benches = bench.add_subparsers(dest="bench", required=True)
    for module in (flap, fuzz, crash, soak, rolling, db_cost, cluster_kill):
        module.add_parser(benches)  # bench flap, ..., db-cost, cluster-kill
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "token":
        print(Identity(secret_of(args)).issue(args.account, args.expires))
        return 0
    if args.command == "inspect":
        return run_inspect(args)
    if args.command in ("db", "cluster"):
        setup_logging("text")
        return int(args.run(args))
    if args.command in ("memory", "eval", "bench", "revoke"):
        setup_logging("text")
        # bench flap's phones run on the loop its servers do; the other commands on asyncio's
        try:
            return run_on_loop(args.run(args), getattr(args, "event_loop", "asyncio"))
        except InUse as busy:
            print(f"stillhere {args.command}: {busy}", file=sys.stderr)
            return 1
    settings = settings_from(args)
    try:
        check_admin_host(settings)
    except AdminExposed as exposed:
        parser.error(str(exposed))
    setup_logging(settings.log_format)
    app = build_app(settings)
    serving = serve(
        app,
        settings.host,
        settings.port,
        backlog=settings.backlog,
        send_buffer=settings.limits.socket_send_buffer,
        on_listening=partial(log_listening, app),
        drain=drain,
        **runner_options(settings),
    )
    run_on_loop(serving, settings.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
