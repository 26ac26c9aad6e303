"""How long a thread may keep the GIL once another asks for it: the server's switch interval.

The loop shares the GIL with an actor thread per live conversation. Whenever a thread wants
the GIL, CPython makes the holder give it up once the wait reaches the switch interval
(5 ms by default). Under load the loop holds the GIL most of the time, so a message to an
actor wakes a thread that soon makes the loop hand over in the middle of its work, and the
loop then waits to take the GIL back. With 20 ms, a woken actor more often gets the GIL when
the loop lets go of it anyway, to wait for the network. That is our reading; what is
measured is the effect: under `python -m bench.flap --clients 2000 --duration 90 --transport
mixed --seed 1 --no-baselines`, resume p99 was 36 and 45 ms at 20 ms against 68 and 54 ms
at 5 ms, with less server CPU and no clear cost to zero-latency throughput. The cost: a
thread that computes (an embedding, say) may keep the loop waiting for up to 20 ms at a
time rather than 5 ms.
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
