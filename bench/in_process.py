"""What the benches that run stillhere servers in their own process share: serving an aiohttp
app on a free loopback port, a pair of servers that differ in one setting, and the command's
end (the table printed, the report written as JSON)."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from bench import results
from bench.flap import percentiles
from providers.event_loop import run as run_on_loop
from transport.app import build_app
from transport.config import Settings

HOST = "127.0.0.1"
# The rehearsal model answering at once unless a bench paces it (its default is a reader's).
INSTANT = {"rehearsal_latency": 0.0, "rehearsal_rate": 0.0}


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """`app` on a free port of 127.0.0.1; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def servers(
    dsn: str, secret: str, modes: dict[str, dict[str, Any]], **shared: Any
) -> AsyncIterator[dict[str, str]]:
    """A stillhere server on `dsn` for each mode, with the mode's settings over `shared`
    ones, all in one data folder removed after: their base URLs by mode."""
    async with contextlib.AsyncExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        urls = {}
        for mode, overrides in modes.items():
            settings = Settings(
                db=dsn, data_dir=folder, secret=secret, **(INSTANT | shared | overrides)
            )
            urls[mode] = await stack.enter_async_context(serving(build_app(settings)))
        yield urls


def finish(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
    table: Callable[[dict[str, Any]], str],
) -> int:
    """Run the bench on uvloop, print its table, write `--json` and `--results` if given."""
    result = run_on_loop(run(args), "uvloop")
    print(table(result))
    results.save(args, result)
    return 0


def on_against_off(
    delays: dict[str, list[float]], against: str = "off"
) -> tuple[dict[str, dict[str, float | None]], dict[str, float]]:
    """Times in ms by mode (`on`, `off`...) as p50/p95/p99/n/max, and `on` minus the mode
    `against` at p50 and p99: what the settings that differ add."""
    ms = {mode: {**percentiles(v), "max": round(max(v), 2)} for mode, v in delays.items()}
    added = {p: round(ms["on"][p] - ms[against][p], 2) for p in ("p50", "p99")}  # type: ignore[operator]
    return ms, added
