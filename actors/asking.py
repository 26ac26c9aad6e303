"""Asking the analysis model from the turn pipeline.

`providers.analysis` hands back any JSON object; each task's caller knows its shape. An
answer of another shape is no analysis either: logged and counted as `bad_shape`, beside
the client's own failures (`stillhere_analysis_failures`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from actors.runtime import Runtime

log = logging.getLogger("stillhere.analysis")

T = TypeVar("T")


async def ask_shaped(
    rt: Runtime,
    task: str,
    lines: Sequence[str],
    instructions: str,
    read: Callable[[dict[str, Any]], T | None],
) -> T | None:
    """The answer as `read` makes it, or None when there is none of the task's shape."""
    answer = await rt.analysis.ask(task, lines, instructions)
    if answer is None:
        return None  # already logged and counted by the client
    shaped = read(answer)
    if shaped is None:
        log.warning("analysis %s failed (bad_shape): %.200s", task, answer)
        rt.metrics.count_analysis_failure(task, "bad_shape")
    return shaped
