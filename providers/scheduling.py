"""How the kernel schedules the conversation actors' threads: as batch threads, by default.

A turn wakes its conversation's actor thread three times (the say, the say stored, the turn
ended). Under Linux's normal policy a thread just woken may preempt the one running on its
core, and under load that is most often the loop. The loop then waits for a core, and the
actor waits for the GIL that the loop still holds, so neither runs. A batch thread
(SCHED_BATCH, sched(7)) is never made to preempt on waking: it runs on a free core, or
takes its turn at the next tick, and it still gets its full share of the CPU. An actor
handles a message in tens of microseconds and hands the work back to the loop, so waiting
for the loop to pause costs it nothing.

Measured at 50 phones taking zero-latency turns (bench/README.md, stop 19): the loop was
preempted 2.1 to 2.7 times a turn with normal actor threads, 0.8 to 1.0 times with batch
ones, and was on a core 0.74 to 0.77 of the time instead of 0.68 to 0.72.
"""

from __future__ import annotations

import os
import threading

BATCH = "batch"
NORMAL = "normal"
POLICIES = (BATCH, NORMAL)


def batch_available() -> bool:
    """Whether this platform has SCHED_BATCH (Linux does)."""
    return hasattr(os, "SCHED_BATCH")


def effective(policy: str) -> str:
    """The policy threads asked for `policy` really get here."""
    return policy if policy != BATCH or batch_available() else NORMAL


def schedule_this_thread(policy: str) -> None:
    """Apply `policy` to the calling thread. `normal` leaves it as it was made (threads
    inherit the policy of the thread that starts them: the loop's). Where there is no
    SCHED_BATCH, `batch` does nothing; the server logs what its actors get (`effective`)."""
    if policy not in POLICIES:
        raise ValueError(f"thread policy must be one of {POLICIES}, not {policy!r}")
    if effective(policy) == BATCH:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_BATCH, os.sched_param(0))
