"""The rehearsal analysis: a deterministic stand-in for the analysis model.

Without an analysis model (no --analysis-url, no --llm-url) the server still matches each
say to what it answers, by rules a person can predict: a say answers the assistant question
it shares words with, or whose kind of answer it is (yes/no against open questions, "it was
great" against "how was ..."); two yes/no questions with the same claim are unclear; a few
phrasings wind a topic down. It answers in the contract's shapes (providers/analysis.py), so
the turn cannot tell it from a model, and a first run shows the seed's stories.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from providers.analysis import request_text
from providers.stemming import stem


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_WORD = re.compile(r"[^\W\d_]+(?:['\u2019-][^\W\d_]+)*")
_QUOTED = re.compile(r'"[^"]*"|\u201c[^\u201d]*\u201d')
_LINE = re.compile(r"^([AP])(\d+):\s?(.*)$")
_YES_NO = _set("yes yeah yep yup no nope nah sure definitely absolutely oui ouais non carrément")
_ASKS_YES_NO = _set(
    "did do does are is was were will would can could have has had should shall may "
    "est-ce as-tu es-tu avez-vous êtes-vous veux-tu vas-tu"
)
_EVALUATIVE = _set(
    "great good fine nice lovely amazing awesome wonderful fun bad awful terrible rough "
    "okay ok meh boring super bien génial genial top nul sympa"
)
_LULLS = frozenset(
    {
        "you're welcome",
        "your welcome",
        "no problem",
        "no worries",
        "haha true",
        "haha",
        "lol",
        "true",
        "ok thanks",
        "okay thanks",
        "ok thank you",
        "thanks",
        "thank you",
        "cool",
        "ok",
        "okay",
        "fair enough",
        "de rien",
        "merci",
        "d'accord",
    }
)
_STOP = _set(
    "a an the and or but i you he she it we they me my your our their this that these those "
    "to of in on at for with about from by as is am are was were be been do did does have has "
    "had so just really very too how what when where why who which there here not no yes it's "
    "i'm im you're ok okay oh well some any all can could would will went go get got "
    "le la les un une des et ou mais je tu il elle on nous vous ils de du au aux en pour "
    "avec est était ça ce cette que qui quoi comment oui non"
)
# Claims at most this far apart are a tie: the reading is unclear.
_TIE = 0.25


@dataclass(frozen=True)  # no slots: its readings are cached on it
class _Message:
    """One line. Each reading is made once, not once per comparison: every say is weighed
    against every candidate, and it all runs on the loop."""

    ref: str
    text: str

    @cached_property
    def words(self) -> list[str]:
        return [w.lower().replace("\u2019", "'") for w in _WORD.findall(self.text)]

    @cached_property
    def content_words(self) -> set[str]:
        return {stem(w) for w in self.words if w not in _STOP and len(w) > 2}

    @cached_property
    def is_question(self) -> bool:
        return "?" in _QUOTED.sub("", self.text)  # a question quoted is not asked

    @cached_property
    def asks_yes_no(self) -> bool:
        question = self.text[: self.text.rfind("?")]
        sentence = re.split(r"[.!]\s+", question)[-1]
        first = _Message(self.ref, sentence).words[:1]
        return bool(first) and first[0] in _ASKS_YES_NO

    @cached_property
    def asks_how(self) -> bool:
        return bool(re.search(r"\bhow\s+(?:was|were|is|are|did)\b|\bcomment\b", self.text, re.I))


def _normal(text: str) -> str:
    words = _Message("", text).words
    return " ".join(words)


def is_lull(text: str) -> bool:
    return _normal(text) in _LULLS


def _claim(say: _Message, asked: _Message, latest: bool) -> float:
    """How strongly `say` looks like an answer to `asked`."""
    shared = len(say.content_words & asked.content_words)
    if not asked.is_question or say.is_question:
        return float(shared)  # a question in return answers none by its kind
    said = say.words
    kind = 0.0
    if said and said[0] in _YES_NO:
        kind = 1.0 if asked.asks_yes_no else 0.0
    elif asked.asks_how and _EVALUATIVE & set(said):
        kind = 1.5  # "it was great" to "how was ...": more than any open answer
    elif not asked.asks_yes_no:
        # An open question takes any answer: readily the latest one, weakly an earlier one.
        kind = 1.0 if latest else 0.5
    return 2.0 * shared + kind


def _match(say: _Message, assistant: list[_Message]) -> dict[str, Any]:
    entry: dict[str, Any] = {"message": say.ref, "answers": None}
    if not assistant:
        return entry
    latest = assistant[-1]
    claims = sorted(
        ((_claim(say, a, a is latest), i) for i, a in enumerate(assistant)), reverse=True
    )
    best, index = claims[0]
    if best < 1.0 or is_lull(say.text):
        # Nothing claims it: a remark on the latest message, unless that asked a question
        # this is no answer to, in which case the person starts something new.
        answers_latest = not latest.is_question or is_lull(say.text)
        entry["answers"] = latest.ref if answers_latest else None
        return entry
    tied = [assistant[i] for claim, i in claims if best - claim <= _TIE]
    entry["answers"] = assistant[index].ref  # the latest of the tied: the likeliest
    if len(tied) > 1 and all(a.asks_yes_no for a in tied):
        entry["unclear"] = sorted((a.ref for a in tied), key=_number)
    return entry


def _number(ref: str) -> int:
    return int(ref[1:])


def _parse(lines: Sequence[str]) -> tuple[list[_Message], list[_Message]]:
    assistant: list[_Message] = []
    person: list[_Message] = []
    for line in lines:
        found = _LINE.match(line)
        if found:
            side = assistant if found.group(1) == "A" else person
            side.append(_Message(found.group(1) + found.group(2), found.group(3)))
    return assistant, person


def reply_matching(lines: Sequence[str]) -> dict[str, Any]:
    assistant, person = _parse(lines)
    answers = [_match(say, assistant) for say in person]
    settled = {a["answers"] for a in answers if not a.get("unclear")}
    open_ = [a.ref for a in assistant if a.is_question and a.ref not in settled]
    lull = bool(person) and is_lull(person[-1].text)
    return {"answers": answers, "open": open_, "lull": lull}


_PROMISE = re.compile(
    r"\b(?:i(?:'|\u2019)ll|i will|let me)\s+(?:tell you|look into|get back to you|finish)"
    r"|\b(?:more on that|tell you the rest|tell you)\s+later\b|\bto be continued\b",
    re.IGNORECASE,
)


def loose_ends(lines: Sequence[str]) -> dict[str, Any]:
    """Unanswered questions of ours (but in the reply, the last A line: too soon), their
    questions the reply shares no word with, and promises to go on later (threads)."""
    assistant, person = _parse(lines)
    reply = assistant[-1] if assistant else None
    waiting = set(reply_matching(lines)["open"])
    found = [_end("assistant", a, "question") for a in assistant[:-1] if a.ref in waiting]
    if reply is not None:
        found += [
            _end("person", p, "question")
            for p in person
            if p.is_question and not p.content_words & reply.content_words
        ]
    found += [
        _end("assistant" if m.ref[0] == "A" else "person", m, "thread")
        for m in [*assistant, *person]
        if _PROMISE.search(m.text) and not (reply is not None and _taken_up(m, reply))
    ]
    return {"loose_ends": found}


def _taken_up(thread: _Message, reply: _Message) -> bool:
    """A thread is taken up by a later reply that speaks of it."""
    return thread is not reply and bool(thread.content_words & reply.content_words)


def _end(by: str, message: _Message, kind: str) -> dict[str, str]:
    return {"by": by, "ref": message.ref, "text": message.text, "kind": kind}


class RehearsalAnalysis:
    """The built-in analysis: the `Analysis` of a server without an analysis model."""

    label = "rehearsal (built-in rules, not a model)"

    async def ask(
        self, task: str, lines: Sequence[str], instructions: str
    ) -> dict[str, Any] | None:
        request_text(task, lines)  # the same refusal of unknown tasks as the model's
        if task == "reply-matching":
            return reply_matching(lines)
        if task == "loose-ends":
            return loose_ends(lines)
        return None  # no rules for it: the caller goes on as without an analysis

    async def close(self) -> None:
        """Nothing to release."""
