"""A task that runs on the loop for as long as a block does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any


@contextlib.asynccontextmanager
async def in_background(work: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run `work` as a task on the running loop for the length of the block, then cancel it
    and wait until it has stopped, so nothing of it outlives the block."""
    task = asyncio.get_running_loop().create_task(work)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
