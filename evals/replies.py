"""Reply-matching cases (`match/...`) of `stillhere eval turns`: which assistant message a say
answers, decided by the server's own matching (`actors.replies.match_replies`), easy cases
and analysis alike.

    {"kind": "match/earlier", "lang": "en",
     "turns": [{"role": "assistant", "text": "How was your weekend?"},
               {"role": "assistant", "text": "Did you finish that book?"},
               {"role": "user", "text": "it was great, went hiking"}],
     "answers": "How was your weekend?"}

`turns` is the conversation, its last turn the say; each earlier say is matched first, in
order, as the live path would have, so what it left waiting is a candidate for the next;
`answers` the text of the assistant
message it answers, or null when it starts something new; a `match/unclear` case has
`unclear`, the texts of the questions it could answer alike (the right outcome: the reply
asks which one was meant). Kinds: `latest`, `earlier`, `new`, `unclear`.

A case's reading is what the turn would go on with: no candidate, nothing answered; one
candidate just before, that one; the rules' reading where they are sure (none of these asks
the model: `skipped`); else the analysis's answer, or, when it gave none (`failed`), the
rules' reading, as the reply then goes ahead. `analysis_failures` counts the calls that gave
nothing usable, by task and reason (`bad_shape`: an answer not of the task's shape).
"""

from __future__ import annotations

import argparse
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import UUID, uuid4

from actors.clock import ManualClock
from actors.handles import Page, TurnHandles
from actors.messages import TurnRequest
from actors.metrics import Metrics
from actors.replies import Matching, match_replies
from actors.runtime import ConversationSettings
from evals.cases import EPOCH, Case, CasesError, case_turns
from evals.command import analysis_model
from providers.analysis import Analysis
from providers.rehearsal_analysis import RehearsalAnalysis
from storage.records import Card, Reminder, Turn

KINDS = ("latest", "earlier", "new", "unclear")


@dataclass(slots=True)
class Judging:
    """The part of a runtime matching needs (`actors.replies.Matcher`), without a server."""

    analysis: Analysis
    settings: ConversationSettings = field(default_factory=ConversationSettings)
    clock: ManualClock = field(default_factory=lambda: ManualClock(EPOCH))
    metrics: Metrics = field(default_factory=Metrics)


class _NoPhone:
    """Matching touches no device; a turn request still carries its handles."""

    def show_card(self, card: Card) -> None: ...

    def show_page(self, page: Page) -> None: ...

    def schedule(self, reminder: Reminder) -> None: ...


@dataclass(frozen=True, slots=True)
class MatchOutcome:
    kind: str
    lang: str
    skipped: bool  # decided without the analysis
    failed: bool  # asked, and no usable answer came
    right: bool
    read: str  # what the turn went on with: a message's text, "(new)" or "unclear: ..."
    expected: str
    where: str


def _turns(case: Case) -> list[Turn]:
    """The case's turns, each assistant message with a reply id and each say a client id."""
    turns = [
        Turn(t.role, t.text, EPOCH, reply_id=uuid4())
        if t.role == "assistant"
        else Turn(t.role, t.text, EPOCH, client_id=f"say-{i}")
        for i, t in enumerate(case_turns(case))
    ]
    if not turns or turns[-1].role != "user":
        raise CasesError(f"{case.where}: turns must end with the say (a user turn)")
    return turns


def _turn_request(history: list[Turn], new: list[Turn]) -> TurnRequest:
    phone = _NoPhone()
    return TurnRequest(
        conversation=uuid4(),
        person="eval",
        history=history,
        new=new,
        speaker=None,
        cards=[],
        during_reply=False,
        after_interrupt=False,
        handles=TurnHandles(phone, phone),
    )


async def _replayed(judging: Judging, turns: list[Turn]) -> list[Turn]:
    """The turns before the case's say, each earlier say matched as the live path would
    have (its match kept with it, so what it left waiting is waiting for the next)."""
    history: list[Turn] = []
    for turn in turns[:-1]:
        if turn.role == "user":
            matching = await match_replies(judging, _turn_request(list(history), [turn]))
            turn = replace(turn, match=matching.matches.get(str(turn.client_id)))
        history.append(turn)
    return history


def _expected(case: Case, texts: set[str]) -> str:
    row = case.row
    if case.kind == "match/unclear":
        unclear = row.get("unclear")
        if not isinstance(unclear, list) or len(unclear) < 2 or not set(unclear) <= texts:
            raise CasesError(f"{case.where}: unclear needs two or more assistant texts")
        return _unclear(unclear)
    answers = row.get("answers", "missing")
    if answers is not None and answers not in texts:
        raise CasesError(f"{case.where}: answers needs an assistant text of the case, or null")
    return "(new)" if answers is None else str(answers)


def _unclear(texts: list[str]) -> str:
    return "unclear: " + " | ".join(sorted(texts))


def _read(matching: Matching, req: TurnRequest, texts: dict[UUID, str]) -> str:
    latest = next((t.text for t in reversed(req.history) if t.reply_id is not None), "(new)")
    match = matching.matches.get(str(req.new[-1].client_id))
    if matching.how == "no_candidate":
        return "(new)"
    if match is None:
        return latest
    if match.asked:
        return _unclear([texts[q] for q in match.unclear])
    return "(new)" if match.answers is None else texts[match.answers]


async def run_match_case(judging: Judging, case: Case) -> MatchOutcome:
    if case.kind.split("/", 1)[1] not in KINDS:
        raise CasesError(f"{case.where}: match kinds are {', '.join(KINDS)}")
    turns = _turns(case)
    texts = {t.reply_id: t.text for t in turns if t.reply_id is not None}
    expected = _expected(case, set(texts.values()))
    req = _turn_request(await _replayed(judging, turns), turns[-1:])
    matching = await match_replies(judging, req)
    read = _read(matching, req, texts)
    return MatchOutcome(
        case.kind,
        str(case.row.get("lang", "en")),
        matching.how != "asked",
        matching.failed,
        read == expected,
        read,
        expected,
        case.where,
    )


def match_figures(outcomes: list[MatchOutcome]) -> dict[str, Any]:
    cases = len(outcomes)
    right = sum(o.right for o in outcomes)
    skipped = sum(o.skipped for o in outcomes)
    asked = [o for o in outcomes if not o.skipped]
    return {
        "cases": cases,
        "right": right,
        "accuracy": round(right / cases, 4) if cases else None,
        "skipped": skipped,
        "skipped_share": round(skipped / cases, 4) if cases else None,
        "asked": len(asked),
        "asked_accuracy": round(sum(o.right for o in asked) / len(asked), 4) if asked else None,
        "failed": sum(o.failed for o in outcomes),
    }


def match_report(outcomes: list[MatchOutcome], analysis: str) -> dict[str, Any]:
    by_kind: dict[str, list[MatchOutcome]] = defaultdict(list)
    by_lang: dict[str, list[MatchOutcome]] = defaultdict(list)
    for outcome in outcomes:
        by_kind[outcome.kind].append(outcome)
        by_lang[outcome.lang].append(outcome)
    return {
        "analysis": analysis,
        **match_figures(outcomes),
        "kinds": {kind: match_figures(rows) for kind, rows in sorted(by_kind.items())},
        "languages": {lang: match_figures(rows) for lang, rows in sorted(by_lang.items())},
        "failures": [
            {"case": o.where, "read": o.read, "expected": o.expected}
            for o in outcomes
            if not o.right
        ],
    }


@contextlib.asynccontextmanager
async def judging_for(args: argparse.Namespace) -> AsyncIterator[Judging]:
    """A `Judging` with `--analysis-url`'s model, or the rehearsal analysis; its metrics
    count the calls that gave nothing usable."""
    metrics = Metrics()
    async with analysis_model(args, metrics.count_analysis_failure) as model:
        analysis: Analysis = model if model is not None else RehearsalAnalysis()
        yield Judging(analysis, metrics=metrics)


async def evaluate_matching(cases: list[Case], args: argparse.Namespace) -> dict[str, Any]:
    """The match cases against `--analysis-url`'s model, or the rehearsal analysis."""
    async with judging_for(args) as judging:
        outcomes = [await run_match_case(judging, case) for case in cases]
    return match_report(outcomes, judging.analysis.label) | {
        "analysis_failures": judging.metrics.analysis_failure_counts()
    }
