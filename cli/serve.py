"""`stillhere serve`: the conversation server on one port, until SIGTERM drains it."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

from providers.event_loop import run as run_on_loop
from transport.admin import AdminExposed, check_admin_host
from transport.app import build_app, log_listening, runner_options
from transport.config import Settings, add_options, settings_from
from transport.drain import drain
from transport.listener import StartupError, serve
from transport.logs import setup_logging
from transport.tls import Certificate, CertificateError

DESCRIPTION = """\
The conversation server on one port, until SIGTERM or Ctrl-C drains it. Each option is
also an environment variable STILLHERE_<NAME> (--resume-window: STILLHERE_RESUME_WINDOW);
durations take 250ms, 90s, 30m, 2h, 7d; sizes 65536, 64KiB, 1MiB. More on each:
docs/configuration.md."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="run the conversation server",
        usage="%(prog)s [options]",
        description=DESCRIPTION,
        formatter_class=partial(argparse.HelpFormatter, max_help_position=30),
    )
    add_options(parser)
    parser.set_defaults(run=partial(run, parser))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:
        check_admin_host(settings)
    except AdminExposed as exposed:
        parser.error(str(exposed))
    if (settings.tls_cert is None) != (settings.tls_key is None):
        parser.error("--tls-cert and --tls-key go together: give both, or neither")
    if settings.admin_tls and settings.tls_cert is None:
        parser.error("--admin-tls on needs --tls-cert and --tls-key")
    try:
        certificate = _certificate(settings)
    except CertificateError as wrong:
        print(f"stillhere serve: TLS certificate: {wrong}", file=sys.stderr)
        return 2
    setup_logging(settings.log_format)
    app = build_app(settings, certificate=certificate)
    serving = serve(
        app,
        settings.host,
        settings.port,
        backlog=settings.backlog,
        send_buffer=settings.limits.socket_send_buffer,
        on_listening=partial(log_listening, app),
        drain=drain,
        certificate=certificate,
        handshake_timeout=settings.limits.hello_timeout,
        **runner_options(settings),
    )
    try:
        run_on_loop(serving, settings.event_loop)
    except StartupError as failed:  # one line, naming the option and what to do
        print(f"stillhere serve: {failed}", file=sys.stderr)
        return 2
    return 0


def _certificate(settings: Settings) -> Certificate | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return Certificate.load(settings.tls_cert, settings.tls_key)
