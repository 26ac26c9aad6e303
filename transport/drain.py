"""A graceful stop (SIGTERM, Ctrl-C): fail /readyz, send new links elsewhere, hand every
conversation over, then let the process exit.

The order matters for phones behind a load balancer. The node first answers /readyz with
503 `draining` and refuses every hello with `bye` `moved` (close 4001), and only then closes
its people's links: were their links closed first, their phones would reconnect at once
to a balancer that still sends them here. When a balancer has been asking /readyz lately,
the node gives it `--drain-notice` to see the 503s before handing over; the listener
answers all along. Each conversation is parked as soon as its turn under way ends (cut
after 2 s) and only then are its links closed with `moved` (actors/directory.py,
`hand_over_when_idle`): the reply reaches the phone live, and the person's next hello, on
whichever node it reaches, finds them released and is welcomed at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from transport.server import SERVER_KEY

log = logging.getLogger("stillhere.server")

# A /readyz answered this recently means a balancer (or a probe) watches the node.
WATCHED_WITHIN_S = 10.0


async def drain(app: web.Application) -> None:
    """Stop taking people, wait for the balancers to notice, hand everyone over."""
    server = app[SERVER_KEY]
    directory = server.directory
    directory.draining = True
    asked = server.readyz_asked_at
    watched = asked is not None and time.monotonic() - asked < WATCHED_WITHIN_S
    notice = server.settings.drain_notice if watched else 0.0
    log.info(
        "draining: /readyz answers 503, hellos are sent elsewhere; handing %d conversations "
        "over in %g s",
        len(directory),
        notice,
    )
    await asyncio.sleep(notice)
    started = time.monotonic()
    count = len(directory)
    await directory.stop_all(server.settings.drain_timeout)
    log.info("drained: %d conversations handed over in %.2f s", count, time.monotonic() - started)
