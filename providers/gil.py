"""How long a thread may keep the GIL once another asks for it: the server's switch interval.

The loop shares the GIL with an actor thread per live conversation. Whenever a thread wants
the GIL, CPython makes the holder give it up once the wait reaches the switch interval
(5 ms by default). Under load the loop holds the GIL most of the time, so a message to an
actor wakes a thread that soon makes the loop hand over in the middle of its work, and the
loop then waits to take the GIL back. With 20 ms, a woken actor more often gets the GIL when
the loop lets go of it anyway, to wait for the network. That is our reading; the numbers
are measured, at 2,000 flapping phones (90 s, two pairs of runs, bench/README.md, stop 18):
5 ms gave resume p99 67.6 and 54.0 ms and server CPU 81.9 and 80.2 s; 20 ms gave 35.8 and
44.8 ms and 77.0 and 76.2 s, and turn p95 fell from 2.70 s to 2.31 to 2.34 s.
Zero-latency throughput showed no clear cost: 673.0 turns/s against 695.6 at 5 ms, five
rounds side by side, 0.89 to 1.16 of it round by round. The cost: a thread that computes
(an embedding, say) now keeps the loop waiting for up to 20 ms at a time instead of 5 ms.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

log = logging.getLogger("stillhere.server")

DEFAULT_S = 0.02


@contextlib.contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    """For the length of the block, let a thread hold the GIL `seconds` once another waits."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    log.info("GIL switch interval %g ms", seconds * 1000)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
