"""Group commit: one writer task per log writes whatever queued while its last write ran.

On a quiet server a write goes at once; under load, one statement carries the work of many
conversations, which saves PostgreSQL a commit and the loop a round trip for each.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

Batch = TypeVar("Batch")


class GroupCommit(ABC, Generic[Batch]):
    def __init__(self) -> None:
        self._writer: asyncio.Task[None] | None = None

    def _kick(self) -> None:
        """Something was queued: start the writer unless it is already running."""
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_all())

    async def _write_all(self) -> None:
        while (batch := self._take()) is not None:
            await self._write(batch)

    @abstractmethod
    def _take(self) -> Batch | None:
        """Everything queued so far, as one batch, or None if nothing is."""

    @abstractmethod
    async def _write(self, batch: Batch) -> None:
        """Write the batch and settle its futures; never raise."""
