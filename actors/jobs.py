"""Background tasks on the loop, kept so shutdown can wait for them and a failure is logged.

A task nobody holds may be collected mid-run, and one nobody awaits fails in silence; both
the actors' jobs (`Runtime.run`) and the directory's summaries need the same keeping.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from storage.owners import Fenced

log = logging.getLogger("stillhere.actors")


class Jobs:
    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._running)

    def start(self, job: Coroutine[Any, Any, Any], what: str) -> None:
        """Run `job` as a task of the running loop; `what` names it in the log."""
        task = asyncio.get_running_loop().create_task(job, name=what)
        self._running.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if task.cancelled() or (error := task.exception()) is None:
            return
        if isinstance(error, Fenced):  # the node is letting the person go: nothing to mend
            log.info("%s stopped: person %s is another node's now", task.get_name(), error)
        else:
            log.error("%s failed: %r", task.get_name(), error, exc_info=error)

    async def settle(self, timeout: float | None = None) -> None:
        """Wait for the tasks started so far; after `timeout`, cancel those still running."""
        if not self._running:
            return
        _, late = await asyncio.wait(list(self._running), timeout=timeout)
        for task in late:
            task.cancel()
