"""`stillhere eval turns`: how turn handling does on hand-labelled cases.

The cases file holds one JSON object a line. Its `kind` names a family and a kind within
it (`echo/person_exact`); each family has its evaluator, which reads the rest of the
object, and the report gives each family's figures overall and by kind.

Echo cases (`echo/...`) measure the echo guard (actors/echo.py):

    {"kind": "echo/person_exact",
     "turns": [{"role": "assistant", "text": "How was your day?"},
               {"role": "user", "text": "I had a rough day at work."}],
     "reply": "I had a rough day at work. I'm sorry, what happened?",
     "shown": "I'm sorry, what happened?"}

`turns` is the conversation before the reply, the trailing user turns being the messages it
answers; `reply` is what the model writes, and `shown` what should reach the screen (the
reply itself when nothing should be cut, "" when all of it repeats, so it is asked for
again). The reply is fed to the guard a piece at a time, as a model streams it. A case is
cut `right` when the guard cut exactly what it should, `wrong` when it cut anything else
(a non-echo, or too much or too little), `missed` when it let an echo through;
`asked_again` counts replies cut whole, which a turn asks the model for again.
Targets: no wrong cut, at least 95% of echoes caught.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.echo import EchoGuard, sources_for
from evals import replies as eval_replies
from evals.cases import Case, CasesError, case_turns
from evals.command import (
    add_analysis_options,
    add_command,
    groups_table,
    json_lines,
    run_report,
)
from evals.replies import evaluate_matching

ECHO_CAUGHT_TARGET = 0.95


def read_cases(path: Path) -> list[Case]:
    """The labelled cases; a line that is not a JSON object with a `kind` is an error."""
    cases = []
    for where, row in json_lines(path, CasesError):
        kind = row.get("kind") if isinstance(row, dict) else None
        if not isinstance(kind, str) or "/" not in kind:
            raise CasesError(f'{where}: needs a "kind" such as "echo/person_exact"')
        family = kind.split("/", 1)[0]
        if family not in EVALUATORS:
            raise CasesError(f"{where}: no evaluator for {kind!r} (known: {sorted(EVALUATORS)})")
        cases.append(Case(family, kind, row, where))
    if not cases:
        raise CasesError(f"{path}: no cases")
    return cases


# -- echo ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EchoOutcome:
    kind: str
    echo: bool  # labelled: something should be cut
    cut: bool  # the guard cut something
    right: bool  # what reached the screen is what should have
    shown: str
    expected: str
    where: str

    @property
    def verdict(self) -> str:
        if self.cut:
            return "right" if self.echo and self.right else "wrong"
        return "missed" if self.echo else "kept"


def pieces(text: str, size: int) -> list[str]:
    """The reply as a model streams it: word by word (`size` 0) or `size` characters."""
    if size <= 0:
        return re.findall(r"\s*\S+\s*", text) or [text]
    return [text[i : i + size] for i in range(0, len(text), size)]


def run_echo_case(case: Case, size: int = 0) -> EchoOutcome:
    reply, expected = case.row.get("reply"), case.row.get("shown")
    if not isinstance(reply, str) or not isinstance(expected, str):
        raise CasesError(f"{case.where}: needs reply and shown, as strings")
    turns = case_turns(case)
    answered = len(turns)
    while answered > 0 and turns[answered - 1].role == "user":
        answered -= 1
    guard = EchoGuard(sources_for(turns[:answered], turns[answered:]))
    shown = "".join(guard.feed(piece) for piece in pieces(reply, size)) + guard.end()
    cut = bool(guard.cuts)
    return EchoOutcome(
        case.kind, expected != reply, cut, shown == expected, shown, expected, case.where
    )


def echo_figures(outcomes: list[EchoOutcome]) -> dict[str, Any]:
    counts = {v: sum(o.verdict == v for o in outcomes) for v in ("right", "wrong", "missed")}
    echoes = sum(o.echo for o in outcomes)
    return {
        "cases": len(outcomes),
        "echoes": echoes,
        "cuts": sum(o.cut for o in outcomes),
        **counts,
        "asked_again": sum(o.cut and not o.shown for o in outcomes),  # nothing but echo
        "caught": round(counts["right"] / echoes, 4) if echoes else None,
    }


def echo_report(outcomes: list[EchoOutcome]) -> dict[str, Any]:
    by_kind: dict[str, list[EchoOutcome]] = defaultdict(list)
    for outcome in outcomes:
        by_kind[outcome.kind].append(outcome)
    overall = echo_figures(outcomes)
    return {
        **overall,
        "targets": {"wrong": 0, "caught": ECHO_CAUGHT_TARGET},
        "targets_met": overall["wrong"] == 0 and (overall["caught"] or 0) >= ECHO_CAUGHT_TARGET,
        "kinds": {kind: echo_figures(rows) for kind, rows in sorted(by_kind.items())},
        "failures": [
            {"case": o.where, "verdict": o.verdict, "shown": o.shown, "expected": o.expected}
            for o in outcomes
            if o.verdict in ("wrong", "missed")
        ],
    }


async def evaluate_echo(cases: list[Case], args: argparse.Namespace) -> dict[str, Any]:
    return echo_report([run_echo_case(case, args.piece_chars) for case in cases])


# Each family of cases and what measures it.
EVALUATORS: dict[str, Callable[[list[Case], argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "echo": evaluate_echo,
    "match": evaluate_matching,  # evals/replies.py
}


async def evaluate(cases: list[Case], args: argparse.Namespace) -> dict[str, Any]:
    families: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        families[case.family].append(case)
    report: dict[str, Any] = {"cases": len(cases)}
    for family, rows in families.items():
        report[family] = await EVALUATORS[family](rows, args)
    return report


# -- the command ----------------------------------------------------------------------------


def echo_table(echo: dict[str, Any]) -> str:
    widths = {"cases": 6, "echoes": 8, "cuts": 6, "right": 7, "wrong": 7, "missed": 8, "caught": 8}
    columns = [(name, name, width) for name, width in widths.items()]
    lines = groups_table(("kind", 22), columns, echo["kinds"], echo)
    met = "met" if echo["targets_met"] else "NOT met"
    lines.append(f"targets (0 wrong cuts, caught >= {ECHO_CAUGHT_TARGET}): {met}")
    return "\n".join(lines)


def match_table(match: dict[str, Any]) -> str:
    widths = {
        "cases": 6,
        "right": 7,
        "accuracy": 10,
        "skipped": 9,
        "skipped_share": 15,
        "asked_accuracy": 16,
        "failed": 8,
    }
    columns = [(name, name, width) for name, width in widths.items()]
    lines = [f"reply matching by {match['analysis']}"]
    lines += groups_table(("kind", 22), columns, match["kinds"], match)
    lines += groups_table(("language", 22), columns, match["languages"], match)
    if match.get("analysis_failures"):
        lines.append(f"analysis failures: {match['analysis_failures']}")
    return "\n".join(lines)


def add_parser(commands: Any) -> None:
    """Add `turns` to the `stillhere eval` commands."""
    turns = add_command(
        commands,
        "turns",
        "echo-guard cuts and reply-matching accuracy on labelled cases",
        __doc__ + "\n" + (eval_replies.__doc__ or ""),
    )
    turns.add_argument("--cases", type=Path, required=True, help="JSON lines of labelled cases")
    turns.add_argument(
        "--piece-chars",
        type=int,
        default=0,
        help="feed each reply in pieces of this many characters (default 0: word by word)",
    )
    add_analysis_options(
        turns,
        "an OpenAI-compatible analysis model to match replies with; without it, the "
        "rehearsal analysis (built-in rules)",
    )
    turns.set_defaults(run=run)


async def run(args: argparse.Namespace) -> int:
    def show(report: dict[str, Any]) -> None:
        print(f"{report['cases']} cases from {args.cases}")
        if "echo" in report:
            print(echo_table(report["echo"]))
        if "match" in report:
            print(match_table(report["match"]))

    return await run_report(args, lambda: evaluate(read_cases(args.cases), args), CasesError, show)
