"""Work over everything a node holds, done a slice at a time on the loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

T = TypeVar("T")


async def in_slices(items: Sequence[T], size: int) -> AsyncIterator[Sequence[T]]:
    """`items`, `size` at a time, the loop yielded to after each slice. A pass over every
    link or conversation of a node grows with its phones: in one piece it would hold up
    every frame and reply that arrives meanwhile, in slices only by a slice's worth.
    Whatever the caller looks at in a slice may have changed by the next one."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
        await asyncio.sleep(0)
