"""`stillhere serve`: the conversation server on one port, until SIGTERM drains it."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

from providers.event_loop import run as run_on_loop
from transport.admin import AdminExposed, check_admin_host
from transport.app import build_app, log_listening, runner_options
from transport.config import add_options, settings_from
from transport.drain import drain
from transport.listener import StartupError, serve
from transport.logs import setup_logging


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("serve", help="run the conversation server")
    add_options(parser)
    parser.set_defaults(run=partial(run, parser))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
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
    try:
        run_on_loop(serving, settings.event_loop)
    except StartupError as failed:  # one line, naming the option and what to do
        print(f"stillhere serve: {failed}", file=sys.stderr)
        return 2
    return 0
