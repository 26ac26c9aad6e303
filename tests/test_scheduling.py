"""Actor threads scheduled as batch threads (`--actor-threads`), so that a woken actor never
preempts the loop; `normal` leaves them as CPython makes them."""

from __future__ import annotations

import os
import threading

import pytest

from providers.scheduling import batch_available, effective, schedule_this_thread
from tests.conftest import Harness

needs_batch = pytest.mark.skipif(not batch_available(), reason="no SCHED_BATCH here")


def _policies(prefix: str) -> set[int]:
    return {
        os.sched_getscheduler(t.native_id)
        for t in threading.enumerate()
        if t.name.startswith(prefix) and t.native_id is not None
    }


@needs_batch
@pytest.mark.parametrize(
    ("option", "policy"), [("batch", "SCHED_BATCH"), ("normal", "SCHED_OTHER")]
)
async def test_conversation_actors_run_on_threads_of_the_chosen_policy(
    harness: Harness, option: str, policy: str
) -> None:
    await harness.start(actor_threads=option)
    await harness.phone()
    await harness.phone()
    assert _policies("ConversationActor-") == {getattr(os, policy)}
    # Only the actors' threads: the loop's (this one) is left as it was.
    assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER


@needs_batch
def test_batch_applies_to_the_calling_thread_alone() -> None:
    seen: list[int] = []

    def run() -> None:
        schedule_this_thread("batch")
        seen.append(os.sched_getscheduler(threading.get_native_id()))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert seen == [os.SCHED_BATCH]
    assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER
    assert effective("batch") == "batch"


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="thread policy"):
        schedule_this_thread("idle")
