"""The `stillhere` command: `serve`, `token`, `inspect`, `memory`, `eval` and `bench`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from bench import crash, flap, fuzz
from providers.event_loop import run as run_on_loop
from transport import eval_dedup, eval_search, eval_turns, memory_cli
from transport.app import build_app, log_listening
from transport.config import Settings, add_options, env_value, settings_from
from transport.eval_io import add_eval_command
from transport.identity import Identity, load_or_create_secret
from transport.inspect import add_inspect_options, run_inspect
from transport.listener import serve
from transport.logs import AccessLogger, setup_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stillhere", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the conversation server")
    add_options(serve)
    token = commands.add_parser("token", help="print a signed account token (development)")
    token.add_argument("account")
    token.add_argument(
        "--data-dir", default=Path(env_value("data-dir") or Settings().data_dir), type=Path
    )
    token.add_argument("--secret", default=env_value("secret"), help="env STILLHERE_SECRET")
    token.add_argument("--ttl", type=int, default=30 * 24 * 3600, help="lifetime in seconds")
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
    for module in (flap, fuzz, crash):
        module.add_parser(benches)  # bench flap, bench fuzz, bench crash
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "token":
        secret = args.secret or load_or_create_secret(args.data_dir)
        print(Identity(secret).issue(args.account, args.ttl))
        return 0
    if args.command == "inspect":
        return run_inspect(args)
    if args.command in ("memory", "eval", "bench"):
        setup_logging("text")
        # bench flap's phones run on the loop its servers do; the other commands on asyncio's
        return run_on_loop(args.run(args), getattr(args, "event_loop", "asyncio"))
    settings = settings_from(args)
    setup_logging(settings.log_format)
    app = build_app(settings)
    serving = serve(
        app,
        settings.host,
        settings.port,
        backlog=settings.backlog,
        on_listening=partial(log_listening, app),
        access_log_class=AccessLogger,
    )
    run_on_loop(serving, settings.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
