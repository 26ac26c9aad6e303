"""The event loop a server process runs on: uvloop by default, asyncio's own on request.

Everything the server does on the loop (accepting links, reading and writing frames,
PostgreSQL's protocol, timers) runs through it, so its speed is the server's: on a 2-core
machine, uvloop takes 20 to 40% less CPU per resumed hello and 15 to 25% less per turn than
asyncio's selector loop (`python -m bench.flap`, against `--event-loop asyncio`). Both are
asyncio loops to the code: nothing here depends on which one runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
LOOPS = ("uvloop", "asyncio")


def new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A fresh loop of `kind` (one of LOOPS)."""
    if kind == "asyncio":
        return asyncio.new_event_loop()
    if kind != "uvloop":
        raise ValueError(f"the event loop is one of {', '.join(LOOPS)}, not {kind!r}")
    try:
        import uvloop  # not on Windows: there, --event-loop asyncio
    except ImportError:
        raise SystemExit("uvloop is not installed here; run with --event-loop asyncio") from None
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T], kind: str) -> T:
    """`asyncio.run(main)`, on a loop of `kind`."""
    with asyncio.Runner(loop_factory=lambda: new_event_loop(kind)) as runner:
        return runner.run(main)
