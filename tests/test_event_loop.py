"""`--event-loop`: the loop a server process runs on."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from providers.event_loop import new_event_loop, run


@pytest.mark.parametrize(("kind", "expected"), [("uvloop", uvloop.Loop), ("asyncio", None)])
def test_each_kind_gives_a_working_loop_of_that_kind(kind: str, expected: type | None) -> None:
    loop = new_event_loop(kind)
    try:
        if expected is None:
            assert not isinstance(loop, uvloop.Loop)
            assert isinstance(loop, asyncio.BaseEventLoop)
        else:
            assert isinstance(loop, expected)

        async def ping() -> str:
            future = loop.create_future()
            loop.call_soon_threadsafe(future.set_result, "pong")  # what actors answer with
            return await future

        assert loop.run_until_complete(ping()) == "pong"
    finally:
        loop.close()


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="uvloop, asyncio"):
        new_event_loop("trio")


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_run_runs_a_coroutine_to_its_end_on_that_kind(kind: str) -> None:
    async def which() -> bool:
        await asyncio.sleep(0)
        return isinstance(asyncio.get_running_loop(), uvloop.Loop)

    assert run(which(), kind) is (kind == "uvloop")
