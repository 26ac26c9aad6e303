"""The labelled cases of `stillhere eval turns`, as each family's evaluator reads them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from storage.records import Turn

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # cases carry no times: every turn is at this one


class CasesError(ValueError):
    """The cases file is not what `--cases` expects (the message names the line)."""


@dataclass(frozen=True, slots=True)
class Case:
    family: str  # the part of `kind` before the slash: which evaluator reads it
    kind: str
    row: dict[str, Any]
    where: str  # file:line, for errors


def case_turns(case: Case) -> list[Turn]:
    """The case's `turns`, a list of {role, text}, as turns of the conversation."""
    turns = case.row.get("turns")
    if not isinstance(turns, list) or not all(
        isinstance(t, dict)
        and t.get("role") in ("user", "assistant")
        and isinstance(t.get("text"), str)
        for t in turns
    ):
        raise CasesError(f"{case.where}: turns needs a list of {{role, text}}")
    return [Turn(t["role"], t["text"], EPOCH) for t in turns]
