"""Jobs an actor starts on the loop: they run there, their failures are logged, and shutdown
waits for them, even for one asked for a moment before."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import cast

import pytest

from actors.clock import SystemClock
from actors.runtime import Runtime
from providers.chat import ChatModel
from storage.store import Store


def _runtime() -> Runtime:
    # Only the loop is used by `run` and `settle`.
    loop = asyncio.get_running_loop()
    return Runtime(loop, cast(Store, None), cast(ChatModel, None), SystemClock())


def _from_a_thread(rt: Runtime, job: object, what: str) -> None:
    thread = threading.Thread(target=rt.run, args=(job, what))
    thread.start()
    thread.join()


async def test_a_job_runs_on_the_loop_and_a_failure_is_logged_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = _runtime()
    ran_on: list[int] = []

    async def works() -> None:
        ran_on.append(threading.get_ident())

    async def fails() -> None:
        raise ValueError("no such thing")

    _from_a_thread(rt, works(), "a good job")
    _from_a_thread(rt, fails(), "a bad job")
    await rt.settle(timeout=5.0)
    assert ran_on == [threading.get_ident()]
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failures] == ["a bad job failed: ValueError('no such thing')"]
    assert not rt.jobs


async def test_settle_waits_for_a_job_asked_for_just_before_it() -> None:
    rt = _runtime()
    done = asyncio.Event()

    async def slow() -> None:
        await asyncio.sleep(0.05)
        done.set()

    _from_a_thread(rt, slow(), "a slow job")  # not started yet: the loop has not run
    await rt.settle(timeout=5.0)
    assert done.is_set()


async def test_settle_cancels_what_outlasts_its_timeout() -> None:
    rt = _runtime()
    cancelled = asyncio.Event()

    async def endless() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    rt.run(endless(), "an endless job")
    await rt.settle(timeout=0.05)
    await asyncio.wait_for(cancelled.wait(), 5.0)
