"""Reply matching: which assistant message each new say answers.

Before a reply, the says it answers are matched to the assistant messages they could
answer (the candidates): the messages since the person's previous say, and the questions
still waiting after it, newest `reply_candidates` within `reply_horizon`. No candidate,
one directly before the say, or a say that answers nothing ("hold on") needs no judgement;
the rules (`providers.rehearsal_analysis`) read the rest and decide where they are sure;
each say left is a `reply-matching` question of its own to the analysis model, asked while
the context is gathered (docs/context.md, "How matching decides"). What comes back is
kept with each say (`storage.records.ReplyMatch`): the phone is told when a say answers an
earlier message than the latest (`reply_to`), and the model gets a data note when a say
answers anything but the latest, or starts something new. When a say is unclear between
questions, the reply asks which one was meant, once; unclear again between the same
questions, it takes the likeliest reading.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from actors.asking import Asking, ask_shaped, line_index, numbered
from providers.analysis import CHANCES, Shape
from providers.notes import REPLY_ASK, REPLY_CONTEXT, REPLY_WAITING
from providers.rehearsal_analysis import asks, is_holding, sure_reply_matching
from storage.records import ReplyMatch, Turn, excerpt

if TYPE_CHECKING:
    from actors.clock import Clock
    from actors.messages import TurnRequest
    from actors.runtime import ConversationSettings

log = logging.getLogger("stillhere.replies")

TASK = "reply-matching"
LINE_CHARS = 300  # of one message in the request: enough to tell what it asks
NOTE_CHARS = 80  # of a message quoted in the note
NONE = "none"  # the label of "answers none of them: something new"
ANSWER_TOKENS = 16  # {"answers": "A2"}, with room for a server's spacing
# How much likelier than the latest message an earlier one must be, by the model's own
# chances, to be taken as the one a say answers. A person answers the latest message far
# more often than an older one, and a small model leans the other way: with the local model
# (Qwen2.5-Coder-1.5B), of the says in `turn_cases.jsonl` that answer the latest question,
# it picked an earlier one for 4 of 8, at chances 1.1 to 2.7 times the latest's.
LATEST_WEIGHT = 2.0
# Fixed, and first in every request, so that a server's cached prefix covers them.
INSTRUCTIONS = """You match a person's message to the assistant message it answers.
The A lines are the assistant's last messages, oldest first. The P1 line is the person's message.
Which A message does P1 answer? Decide by meaning, not by position. An answer may share no \
word with its question: read what each question asks for (a yes or no, an opinion, a time, \
a place, a name, a thing) and what P1 gives.
Answer "none" when P1 answers none of them: it asks something else, or starts a new topic.

Examples:
A1: How was the concert? A2: Did you call the plumber? P1: amazing, they played for three hours
{"answers": "A1"}
A1: Did you call the plumber? A2: How was the concert? P1: they played for three hours
{"answers": "A2"}
A1: Did you sleep well? A2: What time is your train? P1: half past nine
{"answers": "A2"}
A1: How was your weekend? A2: Did you finish the book? P1: can you recommend a podcast?
{"answers": "none"}
A1: Comment était le concert ? A2: Tu as appelé le plombier ? P1: génial, trois heures sur scène
{"answers": "A1"}
A1: Tu as bien dormi ? A2: Tu manges quoi ce soir ? P1: des crêpes au sucre
{"answers": "A2"}
A1: Tu as appelé le plombier ? A2: Tu pars quand ? P1: j'ai envie d'apprendre la guitare
{"answers": "none"}

Answer only the JSON: {"answers": "A1"}, with the label, or {"answers": "none"}."""


class Matcher(Asking, Protocol):
    """What matching needs of the runtime (the server's `Runtime`, or the eval's)."""

    settings: ConversationSettings
    clock: Clock


@dataclass(frozen=True, slots=True)
class Matching:
    """The outcome for one turn: how it was decided, and what each say answers."""

    # no_candidate | just_before | holding (no say answers anything) | rules (sure of every
    # say) (no model call) | asked (the analysis was asked of a say the rules were unsure
    # of) | follow_on (a message of the assistant's own: no say to match) | off (not matched)
    how: str
    matches: dict[str, ReplyMatch] = field(default_factory=dict)  # by the say's client id
    note: str | None = None  # the prompt's REPLY CONTEXT, when a say needs one
    failed: bool = False  # asked, and no usable answer came: no note
    lull: bool = False

    def __str__(self) -> str:
        if self.how == "follow_on":
            return "a follow-on: no say to match"
        if self.how == "off":
            return "replies not matched (--reply-matching off)"
        parts = ", ".join(_described(m) for m in self.matches.values()) or "nothing"
        if self.how == "rules":
            return f"replies matched by the rules: {parts}"
        if self.how != "asked":
            return f"replies matched without the model ({self.how.replace('_', ' ')})"
        if self.failed:
            return f"replies matched: no usable analysis, by the rules: {parts}"
        return f"replies matched by the analysis: {parts}"


FOLLOW_ON = Matching("follow_on")
UNMATCHED = Matching("off")  # `--reply-matching off`: every say answers the latest message


def _described(match: ReplyMatch) -> str:
    if match.asked:
        return "unclear, asking"
    if match.guessed:
        return "unclear again, guessed"
    if match.answers is None:
        return "nothing (holding)" if match.latest else "something new"
    return "the latest" if match.latest else "an earlier message"


def candidates(history: Sequence[Turn], now: datetime, limit: int, horizon_s: float) -> list[Turn]:
    """The assistant messages the next says may answer, oldest first."""
    previous = next((i for i in range(len(history) - 1, -1, -1) if history[i].role == "user"), -1)
    wanted = {t.reply_id for t in history[previous + 1 :] if _is_message(t)}
    if previous >= 0 and history[previous].match is not None:
        wanted.update(history[previous].match.open)
    chosen = [t for t in history if t.reply_id in wanted and _is_message(t)]  # few wanted
    fresh = [t for t in chosen if (now - t.at).total_seconds() <= horizon_s]
    return fresh[-limit:]


def _is_message(turn: Turn) -> bool:
    return turn.role == "assistant" and turn.reply_id is not None


async def match_replies(rt: Matcher, req: TurnRequest) -> Matching:
    """Never raises: a matching that goes wrong costs the note, never the reply."""
    if req.follow_on:
        return FOLLOW_ON
    try:
        matching = await _match(rt, req)
    except Exception:
        log.exception("reply matching failed; the reply goes ahead without its note")
        matching = Matching("asked", failed=True)
    rt.metrics.reply_matching.labels(how=matching.how).inc()
    return matching


async def _match(rt: Matcher, req: TurnRequest) -> Matching:
    settings = rt.settings
    found = candidates(
        req.history, rt.clock.now(), settings.reply_candidates, settings.reply_horizon_s
    )
    if not found:
        return Matching("no_candidate")
    says = [t for t in req.new if not is_holding(t.text)]
    if not says:
        return Matching("holding", _holding(req.new, {}, _questions(found)))
    if len(found) == 1 and req.history[-1] is found[0] and not _unsure(found[0], req):
        just = _answering(found[0], found[0].reply_id, ())
        return Matching("just_before", _each(req, says, found, just))
    read = await read_says(rt, [t.text for t in found], [t.text for t in says])
    how = "asked" if read.asked else "rules"
    return _matching(req, says, found, read.entries, how, read.failed, read.lull)


@dataclass(frozen=True, slots=True)
class Read:
    """Each say's reading (`_Entry`, by the say's index), and how it was come to."""

    entries: dict[int, _Entry]
    asked: bool  # the model was asked of a say the rules were unsure of
    failed: bool  # and some call gave no usable answer (that say keeps the rules' reading)
    lull: bool


async def read_says(rt: Asking, texts: list[str], says: list[str]) -> Read:
    """What each of `says` answers among the candidates `texts` (oldest first): the rules'
    reading, and the model's of each say they are unsure of."""
    rules, sure = sure_reply_matching(numbered(texts, says, LINE_CHARS))
    read = _read(rules, len(texts), len(says)) or {}
    unsure = [None if known else say for say, known in zip(says, sure, strict=True)]
    asked, failed, lull = await _ask(rt, texts, unsure)
    asking = any(say is not None for say in unsure)
    return Read(read | asked, asking, failed, lull or bool(rules.get("lull")))


async def _ask(
    rt: Asking, texts: list[str], unsure: list[str | None]
) -> tuple[dict[int, _Entry], bool, bool]:
    """The model's reading of each say the rules are unsure of (None: sure), one say at a
    time, the smallest question a small model answers well; whether a call gave nothing
    (that say keeps the rules' reading); whether the model says the person winds down."""
    read: dict[int, _Entry] = {}
    failed = lull = False
    for i, say in enumerate(unsure):
        if say is None:
            continue
        one = await ask_one(rt, texts, say)
        if one is None:
            failed = True
            continue
        if 0 in one[0]:
            read[i] = one[0][0]
        lull = lull or one[1]
    return read, failed, lull


async def ask_one(rt: Asking, texts: list[str], say: str) -> tuple[dict[int, _Entry], bool] | None:
    """The model's reading of one say against the candidates `texts` (oldest first): which
    it answers (`{0: (index or None, unclear)}`), and whether the person winds down; None
    without a usable answer."""
    return await ask_shaped(
        rt,
        TASK,
        numbered(texts, [say], LINE_CHARS),
        INSTRUCTIONS,
        lambda answer: _read_one(answer, len(texts)),
        shape(texts),
    )


def shape(texts: list[str]) -> Shape:
    """The answer: one label or "none". The labels offered are the candidates a say can
    answer: the questions, and the latest message, which a say may remark on."""
    labels = [f"A{i}" for i, text in enumerate(texts, 1) if asks(text) or i == len(texts)]
    answers = {"type": "string", "enum": [*labels, NONE]}
    return Shape.of(TASK, {"answers": answers}, ANSWER_TOKENS, weighed="answers")


def _questions(found: list[Turn]) -> tuple[UUID, ...]:
    return tuple(t.reply_id for t in found if t.reply_id is not None and asks(t.text))


def _each(
    req: TurnRequest, says: list[Turn], found: list[Turn], match: ReplyMatch
) -> dict[str, ReplyMatch]:
    """Every say but those that answer nothing read as `match`."""
    return _holding(req.new, {t.client_id: match for t in says if t.client_id}, _questions(found))


def _holding(
    new: list[Turn], decided: dict[str, ReplyMatch], waiting: tuple[UUID, ...]
) -> dict[str, ReplyMatch]:
    """`decided` with the says that answer nothing ("hold on", "lol") in their place: each
    leaves waiting what was waiting before it, so no question is taken as answered."""
    matches: dict[str, ReplyMatch] = {}
    for turn in new:
        if not turn.client_id:
            continue
        match = decided.get(turn.client_id)
        if match is None and is_holding(turn.text):
            match = ReplyMatch(None, True, open=waiting)
        if match is not None:
            matches[turn.client_id] = match
            waiting = match.open
    return matches


def _unsure(before: Turn, req: TurnRequest) -> bool:
    """Whether the says may not answer the one message just before them: they were sent
    while it was still being written, or it asked a question and they ask one back."""
    return req.during_reply or asks_back(before.text, [t.text for t in req.new])


def asks_back(before: str, says: Sequence[str]) -> bool:
    """Whether `before` asked a question and the says ask one back."""
    return "?" in before and any("?" in say for say in says)


# -- the answer ----------------------------------------------------------------------------

_Entry = tuple[int | None, tuple[int, ...]]  # the A it answers (None: new), unclear As


def _read(answer: dict[str, Any], assistant: int, people: int) -> dict[int, _Entry] | None:
    """The answer as indexes (0-based) by P line, or None if it is not of the task's shape.
    Read leniently where the meaning is plain: `{"answers": "A2"}` (or "none", null) for a
    lone P line; `{"answers": ["A2", "A1"]}`, labels for the P lines in order; or the
    contract's entries, `{"answers": [{"message": "P1", "answers": "A2"}]}`."""
    if "answers" not in answer:
        return None
    entries = answer["answers"]
    if people == 1 and (entries is None or isinstance(entries, str)):
        entries = [entries]
    if not isinstance(entries, list):
        return None
    if len(entries) == people and not any(isinstance(e, dict) for e in entries):
        entries = [{"message": f"P{i}", "answers": e} for i, e in enumerate(entries, 1)]
    read: dict[int, _Entry] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            return None
        said = line_index(entry.get("message"), "P", people)
        answers = entry.get("answers")
        new = answers is None or (isinstance(answers, str) and answers.lower() == NONE)
        to = None if new else line_index(answers, "A", assistant)
        unclear = entry.get("unclear") or []
        which = (
            [line_index(u, "A", assistant) for u in unclear]
            if isinstance(unclear, list)
            else [None]
        )
        if said is None or (not new and to is None) or None in which:
            return None
        read[said] = (to, tuple(sorted({w for w in which if w is not None})))
    return read


def _read_one(answer: dict[str, Any], assistant: int) -> tuple[dict[int, _Entry], bool] | None:
    """The answer about one say, and whether the model says the person winds down."""
    read = _read(weighed_pick(answer, assistant), assistant, 1)
    return None if read is None else (read, answer.get("lull") is True)


def weighed_pick(answer: dict[str, Any], assistant: int) -> dict[str, Any]:
    """The answer, its label the likeliest where the server gave each label's chance; when
    an older message is a candidate too, the latest's chance counted `LATEST_WEIGHT`
    times. The chances also undo a greedy writer's split: `A` written for A1 and A2
    together (0.52) over `none` (0.48), then A1 (0.37 in all) is still less likely than
    none."""
    chances = answer.get(CHANCES)
    if "answers" not in answer or not isinstance(chances, dict) or not chances:
        return answer
    latest = f"A{assistant}"
    weight = LATEST_WEIGHT if sum(k != NONE for k in chances) > 1 else 1.0
    weighed = {k: v * (weight if k == latest else 1.0) for k, v in chances.items()}
    return {**answer, "answers": max(weighed, key=weighed.__getitem__)}


def _matching(
    req: TurnRequest,
    says: list[Turn],
    found: list[Turn],
    read: dict[int, _Entry],
    how: str,
    failed: bool,
    lull: bool,
) -> Matching:
    latest = next((t.reply_id for t in reversed(req.history) if _is_message(t)), None)
    before = next((t.match for t in reversed(req.history) if t.role == "user"), None)
    settled = {
        found[to].reply_id for to, unclear in read.values() if to is not None and not unclear
    }
    open_ = tuple(q for q in _questions(found) if q not in settled)
    matches: dict[str, ReplyMatch] = {}
    for said, turn in enumerate(says):
        if said in read and turn.client_id:
            to, unclear = read[said]
            matches[turn.client_id] = _one(found, to, unclear, latest, before, open_)
            before = matches[turn.client_id]
    matches = _holding(req.new, matches, _questions(found))
    return Matching(how, matches, _note(req.new, found, matches), failed=failed, lull=lull)


def _one(
    found: list[Turn],
    to: int | None,
    unclear: tuple[int, ...],
    latest: UUID | None,
    before: ReplyMatch | None,
    open_: tuple[UUID, ...],
) -> ReplyMatch:
    if len(unclear) < 2:
        answered = found[to] if to is not None else None
        return _answering(answered, latest, open_)
    questions = tuple(found[i].reply_id for i in unclear if found[i].reply_id is not None)
    if before is not None and before.asked and set(before.unclear) == set(questions):
        likeliest = found[to] if to is not None else found[unclear[-1]]
        guess = _answering(likeliest, latest, open_)
        # The say also answers our asking which one they meant, if that came last.
        waiting = tuple(q for q in guess.open if q != latest)
        return ReplyMatch(
            guess.answers, guess.latest, guess.excerpt, waiting, questions, guessed=True
        )
    still = open_ + tuple(q for q in questions if q not in open_)
    return ReplyMatch(None, False, open=still, unclear=questions, asked=True)


def _answering(answered: Turn | None, latest: UUID | None, open_: tuple[UUID, ...]) -> ReplyMatch:
    if answered is None:
        return ReplyMatch(None, False, open=open_)
    waiting = tuple(q for q in open_ if q != answered.reply_id)
    return ReplyMatch(
        answered.reply_id, answered.reply_id == latest, excerpt(answered.text), waiting
    )


# -- the note ------------------------------------------------------------------------------


def _note(new: list[Turn], found: list[Turn], matches: dict[str, ReplyMatch]) -> str | None:
    noted = [(t, matches[t.client_id]) for t in new if t.client_id in matches]
    noted = [(t, m) for t, m in noted if not m.latest]
    if not noted:
        return None
    texts = {t.reply_id: t.text for t in found}
    lines = [REPLY_CONTEXT]
    for turn, match in noted:
        subject = (
            "This message" if len(new) == 1 else f'Their message "{excerpt(turn.text, NOTE_CHARS)}"'
        )
        lines.append(f"{subject} {_reading(match, texts)}")
    waiting = [q for q in noted[-1][1].open if q in texts]
    if waiting:
        lines.append(f"{REPLY_WAITING} {_quoted(waiting, texts, '; ')}.")
    return "\n".join(lines)


def _reading(match: ReplyMatch, texts: dict[UUID | None, str]) -> str:
    if match.asked:
        return f"could answer {_quoted(match.unclear, texts, ' or ')}. {REPLY_ASK}"
    answered = f'"{excerpt(texts.get(match.answers, match.excerpt), NOTE_CHARS)}"'
    if match.guessed:
        return (
            f"is unclear again between {_quoted(match.unclear, texts, ' and ')}: you asked "
            f"once already, so do not ask again; take it as the answer to {answered}."
        )
    if match.answers is None:
        return "starts something new: it answers none of your messages."
    return f"answers your earlier message {answered} (not your latest one)."


def _quoted(ids: Sequence[UUID], texts: dict[UUID | None, str], joint: str) -> str:
    return joint.join(f'"{excerpt(texts[i], NOTE_CHARS)}"' for i in ids if i in texts)
