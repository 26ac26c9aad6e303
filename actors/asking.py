"""Asking the analysis model from the turn pipeline.

`providers.analysis` hands back any JSON object; each task's caller knows its shape. An
answer of another shape is no analysis either: logged and counted as `bad_shape`, beside
the client's own failures (`stillhere_analysis_failures`). The turn's tasks number the
assistant's lines A1, A2... and the person's P1, P2..., and answer by those labels.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from storage.records import excerpt

if TYPE_CHECKING:
    from actors.metrics import Metrics
    from providers.analysis import Analysis, Shape

log = logging.getLogger("stillhere.analysis")

T = TypeVar("T")


class Asking(Protocol):
    """What asking needs of the runtime: the analysis, and where failures are counted. The
    server's `Runtime` is one; `stillhere eval turns` builds one without a server."""

    analysis: Analysis
    metrics: Metrics


async def ask_shaped(
    rt: Asking,
    task: str,
    lines: Sequence[str],
    instructions: str,
    read: Callable[[dict[str, Any]], T | None],
    shape: Shape | None = None,
) -> T | None:
    """The answer as `read` makes it, or None when there is none of the task's shape
    (`shape`, when given, is asked for by JSON Schema)."""
    answer = await rt.analysis.ask(task, lines, instructions, shape)
    if answer is None:
        return None  # already logged and counted by the client
    shaped = read(answer)
    if shaped is None:
        log.warning("analysis %s failed (bad_shape): %.200s", task, answer)
        rt.metrics.count_analysis_failure(task, "bad_shape")
    return shaped


def numbered(assistant: Sequence[str], person: Sequence[str], chars: int) -> list[str]:
    """The request's lines: the assistant's texts as A1, A2..., then the person's as P1,
    P2..., each cut to its first `chars` characters."""
    lines = [f"A{i}: {excerpt(text, chars)}" for i, text in enumerate(assistant, 1)]
    return lines + [f"P{i}: {excerpt(text, chars)}" for i, text in enumerate(person, 1)]


def line_index(ref: object, side: str, count: int) -> int | None:
    """The 0-based index that a label of `side` ("A2") names among `count` lines; None if
    `ref` is no such label."""
    if not isinstance(ref, str) or not ref.startswith(side) or not ref[1:].isdigit():
        return None
    index = int(ref[1:]) - 1
    return index if 0 <= index < count else None
