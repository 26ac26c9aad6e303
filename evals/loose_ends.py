"""`stillhere eval loose-ends`: what the loose-ends analysis notes after an exchange, against
hand-labelled exchanges.

The cases file holds one JSON object a line, an exchange as the analysis is shown it after a
reply (actors/loose_ends.py), with nothing left open before it:

    {"lang": "en",
     "assistant": ["How was your weekend?", "Sure, I'll remind you to call Sam at 5 pm."],
     "says": ["can you remind me to call Sam at 5?"],
     "open": ["A1"]}

`assistant` is the message the says followed (when there is one) then the reply, numbered
A1, A2; `says` the person's messages, P1, P2...; `open` the labels of the lines left
unaddressed: a question of the assistant's the says did not answer, a point or question
of the person's the reply skipped, a story or a promise left to go on later. The reply's
own question, just asked, is not one yet.

A noted loose end is right when its line is labelled open. The report gives precision (of
the lines noted, the share labelled open) and recall (of the lines labelled open, the
share noted), overall and by language; targets 0.8 each. The lines are read as a turn
reads them (actors/loose_ends.py): the rules where they are sure, the analysis where they
are not; a call that gives no usable answer leaves the rules' reading, as in a turn, and is
counted in `analysis_failures`.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.loose_ends import listed_ends
from actors.metrics import Metrics
from evals.command import add_analysis_options, add_command, groups_table, json_lines, run_report
from evals.replies import Judging, judging_for

TARGET = 0.8


class LooseCasesError(ValueError):
    """The cases file is not what `--cases` expects (the message names the line)."""


@dataclass(frozen=True, slots=True)
class LooseCase:
    lang: str
    assistant: list[str]
    says: list[str]
    open: frozenset[str]
    where: str


@dataclass(frozen=True, slots=True)
class LooseOutcome:
    case: LooseCase
    noted: frozenset[str]


def read_cases(path: Path) -> list[LooseCase]:
    cases = []
    for where, row in json_lines(path, LooseCasesError):
        assistant, says, open_ = (
            row.get(k) if isinstance(row, dict) else None
            for k in (
                "assistant",
                "says",
                "open",
            )
        )
        if not _texts(assistant) or not _texts(says) or not _texts(open_, empty=True):
            raise LooseCasesError(f"{where}: needs assistant and says (texts) and open (labels)")
        labels = {f"A{i}" for i in range(1, len(assistant) + 1)}
        labels |= {f"P{i}" for i in range(1, len(says) + 1)}
        if not set(open_) <= labels:
            raise LooseCasesError(f"{where}: open names a line the case does not have")
        cases.append(
            LooseCase(str(row.get("lang", "en")), assistant, says, frozenset(open_), where)
        )
    if not cases:
        raise LooseCasesError(f"{path}: no cases")
    return cases


def _texts(value: object, empty: bool = False) -> bool:
    return (
        isinstance(value, list)
        and (empty or bool(value))
        and all(isinstance(v, str) for v in value)
    )


async def run_case(judging: Judging, case: LooseCase) -> LooseOutcome:
    listed = await listed_ends(judging, case.assistant, case.says)
    return LooseOutcome(case, frozenset(f"{side}{i + 1}" for side, i, _ in listed))


def figures(outcomes: list[LooseOutcome]) -> dict[str, Any]:
    right = sum(len(o.noted & o.case.open) for o in outcomes)
    noted = sum(len(o.noted) for o in outcomes)
    labelled = sum(len(o.case.open) for o in outcomes)
    return {
        "cases": len(outcomes),
        "labelled": labelled,
        "noted": noted,
        "right": right,
        "precision": round(right / noted, 4) if noted else None,
        "recall": round(right / labelled, 4) if labelled else None,
        "exact": sum(o.noted == o.case.open for o in outcomes),
    }


def report(outcomes: list[LooseOutcome], analysis: str, metrics: Metrics) -> dict[str, Any]:
    by_lang: dict[str, list[LooseOutcome]] = defaultdict(list)
    for outcome in outcomes:
        by_lang[outcome.case.lang].append(outcome)
    overall = figures(outcomes)
    return {
        "analysis": analysis,
        **overall,
        "targets": {"precision": TARGET, "recall": TARGET},
        "targets_met": all((overall[k] or 0) >= TARGET for k in ("precision", "recall")),
        "languages": {lang: figures(rows) for lang, rows in sorted(by_lang.items())},
        "analysis_failures": metrics.analysis_failure_counts(),
        "misses": [
            {"case": o.case.where, "noted": sorted(o.noted), "open": sorted(o.case.open)}
            for o in outcomes
            if o.noted != o.case.open
        ],
    }


async def evaluate(cases: list[LooseCase], args: argparse.Namespace) -> dict[str, Any]:
    async with judging_for(args) as judging:
        outcomes = [await run_case(judging, case) for case in cases]
    return report(outcomes, judging.analysis.label, judging.metrics)


def table(found: dict[str, Any]) -> str:
    widths = {"cases": 6, "labelled": 10, "noted": 7, "right": 7, "precision": 11, "recall": 8}
    columns = [(name, name, width) for name, width in widths.items()]
    lines = [f"loose ends noted by {found['analysis']}"]
    lines += groups_table(("language", 10), columns, found["languages"], found)
    met = "met" if found["targets_met"] else "NOT met"
    lines.append(f"targets (precision and recall >= {TARGET}): {met}")
    if found["analysis_failures"]:
        lines.append(f"analysis failures: {found['analysis_failures']}")
    return "\n".join(lines)


def add_parser(commands: Any) -> None:
    """Add `loose-ends` to the `stillhere eval` commands."""
    command = add_command(
        commands, "loose-ends", "precision and recall of the loose ends noted", __doc__
    )
    command.add_argument("--cases", type=Path, required=True, help="JSON lines of exchanges")
    add_analysis_options(
        command,
        "an OpenAI-compatible analysis model to note loose ends with; without it, the "
        "rehearsal analysis (built-in rules)",
    )
    command.set_defaults(run=run)


async def run(args: argparse.Namespace) -> int:
    return await run_report(
        args,
        lambda: evaluate(read_cases(args.cases), args),
        LooseCasesError,
        lambda found: print(table(found)),
    )
