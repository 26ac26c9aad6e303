"""The rehearsal analysis: a deterministic stand-in for the analysis model.

Without an analysis model (no --analysis-url, no --llm-url) the server still matches each
say to what it answers, by rules a person can predict, in English and in French (the words
they read by are in providers/rehearsal_lexicon.py): a say answers the assistant question
it shares words with, or whose kind of answer it is (yes/no against open questions, "it was
great" against "how was ...", "eight next month" against "how old ..."); two yes/no
questions with the same claim on a bare yes are unclear; a few phrasings wind a topic down.
It reads what an exchange leaves open the same way, a say by its parts (`loose_reading`).
It answers in the contract's shapes (providers/analysis.py), so the turn cannot tell it
from a model, and a first run shows the seed's stories.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from itertools import takewhile
from typing import Any

from providers import rehearsal_lexicon as lexicon
from providers.analysis import Shape, request_text
from providers.stemming import stem

_WORD = re.compile(r"[^\W\d_]+(?:['\u2019-][^\W\d_]+)*")
_QUOTED = re.compile(r'"[^"]*"|\u201c[^\u201d]*\u201d')
_LINE = re.compile(r"^([AP])(\d+):\s?(.*)$")
_ELISION = re.compile(r"^(?:l|d|j|c|s|n|m|t|qu|jusqu|lorsqu|puisqu)'(?=[^\W\d_])")
_CLITIC = re.compile(
    r"-(?:t-)?(?:moi|toi|le|la|les|lui|leur|nous|vous|y|en|tu|il|elle|on|ils|elles)$"
)
# Where a say splits into parts that each do something: after a sentence, or before a clause
# that adds to it ("add milk, and when's Sam's birthday?", "ajoute du lait, et envoie...").
_PART = re.compile(r"(?<=[.!?;])\s+|,\s+(?=(?:and|also|plus|et|aussi|au fait)\b)", re.IGNORECASE)
_LAUGH = re.compile(r"(?:ha|ah|he|hi){2,}h?")
_EVALUATIVE = frozenset(stem(w) for w in lexicon.EVALUATIVE)
# The words of a bare yes or no, however padded: "oui parfait", "yes please", "c'est fait".
_BARE = _EVALUATIVE | frozenset(
    stem(w)
    for phrase in (
        *lexicon.YES_NO_PHRASES,
        *lexicon.DONT_KNOW,
        *lexicon.LULLS,
        *lexicon.FILLERS,
        *((w,) for w in lexicon.YES_NO | lexicon.LEADING),
    )
    for w in phrase
)
_STOP = {"en": lexicon.EN_STOP, "fr": lexicon.EN_STOP | lexicon.FR_STOP}
_HOLDS = lexicon.HOLDING | lexicon.FILLERS
# Claims at most this far apart are a tie: the reading is unclear.
_TIE = 0.25
# Readings of a text kept from call to call: a turn's two analyses read the same lines, and
# the next turn's again (its candidates, the reply before). At most this many texts of each
# reading, most of them excerpts of a few hundred characters.
_READINGS = 1024
_VOCABULARY = 8192  # words whose reading is kept


@lru_cache(maxsize=_READINGS)
def _words(text: str) -> tuple[str, ...]:
    return tuple(map(str.lower, _WORD.findall(text.replace("\u2019", "'"))))


def _bare(word: str) -> str:
    """The word without its elision or its hyphenated pronoun: "l'hôtel", "rappelle-moi"."""
    return _CLITIC.sub("", _ELISION.sub("", word))


def language(texts: Sequence[str]) -> str:
    """French ("fr") when French function words outnumber English ones over `texts`, else
    English ("en"): a conversation is read in one language, so that a short line ("Autre
    chose ?") is read as the rest is."""
    votes = [_language_votes(text) for text in texts]
    return "fr" if sum(f for f, _ in votes) > sum(e for _, e in votes) else "en"


@lru_cache(maxsize=_READINGS)
def _language_votes(text: str) -> tuple[int, int]:
    """The French and the English function words of `text`."""
    said = _words(text)
    french = sum(w in lexicon.FR_ONLY or ("'" in w and _ELISION.match(w) is not None) for w in said)
    return french, sum(w in lexicon.EN_ONLY for w in said)


@dataclass(frozen=True)  # no slots: its readings are cached on it
class _Message:
    """One line, read in its conversation's language. Each reading is made once, not once
    per comparison: every say is weighed against every candidate, and it all runs on the
    loop."""

    ref: str
    text: str
    lang: str = "en"

    @cached_property
    def words(self) -> tuple[str, ...]:
        return _words(self.text)

    @cached_property
    def content_words(self) -> frozenset[str]:
        return _content_words(self.text, self.lang)

    @cached_property
    def is_question(self) -> bool:
        return asks(self.text)

    @cached_property
    def is_lull(self) -> bool:
        return is_lull(self.text)

    @cached_property
    def asks_yes_no(self) -> bool:
        question = self.text[: self.text.rfind("?")]
        sentence = re.split(r"[.!]\s+", question)[-1]
        if self.lang == "fr":
            return _french_asks_yes_no(sentence)
        first = _words(sentence)[:1]
        return bool(first) and first[0] in lexicon.EN_ASKS_YES_NO

    @cached_property
    def parts(self) -> tuple[_Message, ...]:
        """Its sentences, and the clauses that add to them, each read on its own."""
        return tuple(_Message(self.ref, part, self.lang) for part in _parts(self.text))

    @cached_property
    def answering(self) -> _Message:
        """What of it may answer a question: all of it, but for a say that asks something
        after first answering ("not yet. can you find me a plumber?"), what comes first."""
        lead = list(takewhile(lambda part: not part.is_question, self.parts))
        if not lead or len(lead) == len(self.parts):
            return self
        return _Message(self.ref, " ".join(part.text for part in lead), self.lang)

    @cached_property
    def answers_any(self) -> bool:
        """Whether it answers by not knowing ("no idea", "aucune idée"): any question."""
        return _opens_with(self.words, lexicon.DONT_KNOW)

    @cached_property
    def requests(self) -> bool:
        """Whether it asks the assistant to do something ("and text Leo", "rappelle-moi")."""
        first = next((w for w in self.words if w not in lexicon.LEADING), "")
        return _bare(first) in lexicon.REQUESTS

    @cached_property
    def adds(self) -> bool:
        """Whether it adds a point of its own ("oh and ...", "au fait, ...")."""
        return _opens_with(self.words, lexicon.ADDING)

    @cached_property
    def asks_either(self) -> bool:
        """Whether it takes a yes or a no as well as any answer ("Anything else?")."""
        first = self.words[:1]
        return self.is_question and bool(first) and first[0] in lexicon.EN_ASKS_EITHER

    @cached_property
    def asks_amount(self) -> bool:
        """Whether it asks for a number, a time or a date ("how old", "quelle heure")."""
        said = self.words
        return self.is_question and any(
            said[i : i + len(p)] == p for p in lexicon.ASKS_AMOUNT for i in range(len(said))
        )

    @cached_property
    def gives_amount(self) -> bool:
        """Whether it gives one: a digit, or a number word ("eight", "huit ans")."""
        return bool(re.search(r"\d", self.text)) or not lexicon.NUMBERS.isdisjoint(self.words)

    @cached_property
    def asks_how(self) -> bool:
        return bool(re.search(r"\bhow\s+(?:was|were|is|are|did)\b|\bcomment\b", self.text, re.I))

    @cached_property
    def answers_yes_no(self) -> bool:
        said = self.words
        return bool(said) and (
            said[0] in lexicon.YES_NO or _opens_with(said, lexicon.YES_NO_PHRASES)
        )

    @cached_property
    def evaluates(self) -> bool:
        """Whether it says how something was: "great", "c'était délicieux"."""
        said = self.words
        describes = _opens_with(said, lexicon.DESCRIBING)
        return describes or not _EVALUATIVE.isdisjoint(stem(w) for w in said)


@lru_cache(maxsize=_READINGS)
def _parts(text: str) -> tuple[str, ...]:
    return tuple(part for part in (p.strip() for p in _PART.split(text)) if part)


@lru_cache(maxsize=_READINGS)
def _content_words(text: str, lang: str) -> frozenset[str]:
    return frozenset(c for c in (_content_word(w, lang) for w in _words(text)) if c is not None)


@lru_cache(maxsize=_VOCABULARY)
def _content_word(word: str, lang: str) -> str | None:
    """The word's stem, or None for a word that carries no content (a stop word, a short
    one): most words of a text are words of the texts before it."""
    bare = _bare(word)
    return stem(bare) if bare not in _STOP[lang] and len(bare) > 2 else None


def _opens_with(said: tuple[str, ...], phrases: Sequence[tuple[str, ...]]) -> bool:
    return any(tuple(said[: len(p)]) == p for p in phrases)


def _french_asks_yes_no(sentence: str) -> bool:
    """French asks yes/no by "est-ce que", by intonation or by inversion; a question with an
    interrogative (lexicon.FR_OPEN_*) or offering alternatives is open."""
    said = _words(sentence)
    if not said:
        return False
    clauses = [_words(clause) for clause in sentence.split(",")]
    if _first_past_leaders(clauses[0]) == "est-ce":
        return True
    edges = {w for c in clauses if c for w in (_first_past_leaders(c), c[-1])}
    if not lexicon.FR_OPEN_ANYWHERE.isdisjoint(said):
        return False
    if any(w in lexicon.FR_OPEN_AT_EDGES or w.startswith("qu'") for w in edges):
        return False
    if any(
        w in lexicon.FR_OPEN_BUT_CLAUSE and not _opens_clause(said[i + 1 :])
        for i, w in enumerate(said)
    ):
        return False
    return not any(
        w == lexicon.FR_OR and (i + 1 == len(said) or said[i + 1] not in lexicon.FR_OR_DENIAL)
        for i, w in enumerate(said)
    )


def _opens_clause(after: tuple[str, ...]) -> bool:
    return bool(after) and (after[0] in lexicon.FR_SUBJECTS or _ELISION.match(after[0]) is not None)


def _first_past_leaders(words: tuple[str, ...]) -> str:
    return next((w for w in words if w not in lexicon.FR_LEADERS), "")


def _normal(text: str) -> tuple[str, ...]:
    return tuple(lexicon.LAUGHTER if _LAUGH.fullmatch(w) else w for w in _words(text))


@lru_cache(maxsize=_READINGS)
def is_lull(text: str) -> bool:
    """Whether `text` is made only of lull phrasings (lexicon.LULLS): "ok thanks", "haha,
    true", "d'accord, bonne soirée"."""
    said = _normal(text)
    return bool(said) and _spans(said, lexicon.LULLS)


@lru_cache(maxsize=_READINGS)  # a turn reads its says by it more than once
def is_holding(text: str) -> bool:
    """Whether `text` plainly answers nothing: made only of phrasings that hold the floor,
    laugh or step away (lexicon.HOLDING, with fillers such as "ok"), at least one of them
    not a filler: "hold on, thinking", "ok, back in a sec", "lol", "attends, je réfléchis"."""
    said = _normal(text)
    return _spans(said, _HOLDS) and not _spans(said, lexicon.FILLERS)


def asks(text: str) -> bool:
    """Whether `text` asks something (a question quoted is not asked)."""
    return "?" in _QUOTED.sub("", text)


def _spans(said: tuple[str, ...], phrases: frozenset[tuple[str, ...]]) -> bool:
    """Whether `phrases` cover `said` end to end (and it says something): the positions
    reachable from its start by whole phrasings, word by word (no recursion: a say may be
    thousands of words)."""
    longest = _longest(phrases)
    reach = {0}
    for i in range(len(said)):
        if i in reach:
            reach.update(
                i + n
                for n in range(1, min(longest, len(said) - i) + 1)
                if said[i : i + n] in phrases
            )
    return bool(said) and len(said) in reach


@cache  # a few phrase sets, the lexicon's, each read once rather than on every call
def _longest(phrases: frozenset[tuple[str, ...]]) -> int:
    return max(len(p) for p in phrases)


def _claim(say: _Message, asked: _Message, latest: bool) -> tuple[float, bool]:
    """How strongly `say` looks like an answer to `asked`, and whether that rests on
    evidence (shared words, the kind of answer a yes/no or a "how was" question takes)
    rather than on an open question's taking any answer. A say that answers, then asks
    ("yes, when is it?", "not yet. can you...?"), is weighed by its answer. A point added
    ("oh and the boiler is making noises") is no open question's any answer."""
    adds, say = say.adds, say.answering
    shared = len(say.content_words & asked.content_words)
    in_return = (say.is_question or say.requests) and not (say.answers_yes_no or say.answers_any)
    if not asked.is_question or in_return:
        # A question in return, or a request, answers none by its kind.
        return float(shared), shared > 0
    kind, evidence = 0.0, shared > 0
    if say.answers_any:
        kind = 1.0 if latest else 0.5  # "no idea": an answer, to whichever was asked
    elif say.answers_yes_no:
        takes = asked.asks_yes_no or asked.asks_either
        kind = 1.0 if takes else 0.0
        evidence = evidence or takes
    elif asked.asks_amount and say.gives_amount:
        kind, evidence = 1.5, True  # "eight next month" to "how old ...": the answer it takes
    elif asked.asks_how and say.evaluates:
        kind, evidence = 1.5, True  # "it was great" to "how was ...": more than any open answer
    elif not asked.asks_yes_no and not adds:
        # An open question takes any answer: readily the latest one, weakly an earlier one.
        kind = 1.0 if latest else 0.5
    return 2.0 * shared + kind, evidence


def _match(say: _Message, assistant: list[_Message]) -> tuple[dict[str, Any], bool]:
    """The say's entry of the answer, and whether the rules are sure of it: a lull, a
    claim resting on evidence and above all others, or a tie of yes/no questions (unclear).
    Where nothing claims the say, or only an open question's taking any answer does, or
    other questions tie, they are not: that is for a model to judge."""
    entry: dict[str, Any] = {"message": say.ref, "answers": None}
    if not assistant:
        return entry, True
    latest = assistant[-1]
    claims = sorted(
        ((*_claim(say, a, a is latest), i) for i, a in enumerate(assistant)), reverse=True
    )
    best, evidence, index = claims[0]
    if best < 1.0 or say.is_lull:
        # Nothing claims it: a remark on the latest message, unless that asked a question
        # this is no answer to, in which case the person starts something new.
        answers_latest = not latest.is_question or say.is_lull
        entry["answers"] = latest.ref if answers_latest else None
        return entry, say.is_lull
    tied = [assistant[i] for claim, _, i in claims if best - claim <= _TIE]
    entry["answers"] = assistant[index].ref  # the latest of the tied: the likeliest
    if len(tied) > 1 and all(a.asks_yes_no for a in tied) and say.content_words <= _BARE:
        # A bare yes or no; one that says more ("yes, loved it, the cast...") is for a model.
        entry["unclear"] = sorted((a.ref for a in tied), key=_number)
        return entry, True
    others = sum(a.is_question for a in assistant if a is not assistant[index])
    return entry, len(tied) == 1 and (evidence or not others)


def _number(ref: str) -> int:
    return int(ref[1:])


def _parse(lines: Sequence[str]) -> tuple[list[_Message], list[_Message]]:
    found = [m for m in map(_LINE.match, lines) if m]
    lang = language([m.group(3) for m in found])
    assistant: list[_Message] = []
    person: list[_Message] = []
    for line in found:
        side = assistant if line.group(1) == "A" else person
        side.append(_Message(line.group(1) + line.group(2), line.group(3), lang))
    return assistant, person


def reply_matching(lines: Sequence[str]) -> dict[str, Any]:
    return sure_reply_matching(lines)[0]


def sure_reply_matching(lines: Sequence[str]) -> tuple[dict[str, Any], list[bool]]:
    """The rules' answer, and for each P line whether they are sure of it (`_match`)."""
    return _sure_matching(*_parse(lines))


def _sure_matching(
    assistant: list[_Message], person: list[_Message]
) -> tuple[dict[str, Any], list[bool]]:
    read = [_match(say, assistant) for say in person]
    answers = [entry for entry, _ in read]
    settled = {a["answers"] for a in answers if not a.get("unclear")}
    open_ = [a.ref for a in assistant if a.is_question and a.ref not in settled]
    lull = bool(person) and person[-1].is_lull
    return {"answers": answers, "open": open_, "lull": lull}, [sure for _, sure in read]


# Promises to come back once something is found out: "I'll look into it and get back to
# you", "I'll let you know", "je reviens vers toi", "je te redis", "je te tiens au courant".
_DEFERRING = (
    r"\b(?:let you know|keep you posted|get back to you)\b"
    r"|\b(?:i(?:'|\u2019)ll|i will|let me)\s+look into"
    r"|\bje\s+(?:te|vous)\s+(?:redis|redirai|tiens\s+au\s+courant)"
    r"|\bje\s+(?:reviens|reviendrai)\s+vers\s+(?:toi|vous)"
)
_DEFERS = re.compile(_DEFERRING, re.IGNORECASE)
# Those, and promises to tell or finish something later: "I'll tell you later", "to be
# continued", "je te raconterai", "je t'en dirai plus", "je te raconte ce soir", "à suivre".
# Matched against the lower-cased text: read every turn, and twice as fast as IGNORECASE.
_PROMISE = re.compile(
    _DEFERRING + r"|\b(?:i(?:'|\u2019)ll|i will|let me)\s+(?:tell you|fill you in|finish)"
    r"|\b(?:more on that|tell you the rest|tell you|fill you in)\s+(?:later|tonight|tomorrow)\b"
    r"|\bto be continued\b"
    r"|\bje\s+(?:te|vous|t['\u2019]en|vous\s+en)\s+(?:l[ea]\s+)?(?:raconterai|dirai|reparlerai)"
    r"|\b(?:la suite|je te raconte|je te dis|je t['\u2019]explique)\s+(?:plus\s+tard|ce\s+soir"
    r"|demain)\b|\bà\s+suivre\b"
)


@dataclass(frozen=True, slots=True)
class LooseRead:
    """The rules' reading of one line of an exchange: whether it is left open, and whether
    they are sure of that (where they are not, a model's reading decides)."""

    by: str  # person | assistant
    ref: str  # its label, "A1", "P2"
    text: str
    kind: str  # question | point | thread
    open: bool
    sure: bool

    def entry(self) -> dict[str, str]:
        return {"by": self.by, "ref": self.ref, "text": self.text, "kind": self.kind}


def loose_ends(lines: Sequence[str]) -> dict[str, Any]:
    """The rules' answer: the lines they read as left open (`loose_reading`)."""
    return {"loose_ends": [r.entry() for r in loose_reading(lines) if r.open]}


def loose_reading(lines: Sequence[str]) -> list[LooseRead]:
    """Each line that may be left open, read by the rules: our questions before the reply
    (the last A line: its own are too soon, and so is one it asks again) that no say
    answers; what the reply does not
    deal with of the says (`_skipped`); promises to go on later (threads) that no later
    line of the same side takes up. The says came before the reply, so they are matched
    to the lines before it only; a lull ("ok thanks") answers no question. They are unsure
    of one of our questions only when they are unsure of a say's match
    (`sure_reply_matching`)."""
    assistant, person = _parse(lines)
    reply = assistant[-1] if assistant else None
    waiting, answers, sure = _our_questions(assistant, person)
    found = [
        LooseRead("assistant", a.ref, a.text, "question", a.ref in waiting, sure)
        for a in assistant[:-1]
        if a.is_question and not promises(a.text) and not (reply and _asks_again(reply, a))
    ]
    if reply is not None:
        found += _skipped(person, reply, answers)
    for by, side in (("assistant", assistant), ("person", person)):
        found += [
            LooseRead(by, m.ref, m.text, "thread", True, True)
            for i, m in enumerate(side)
            if promises(m.text) and not _taken_up(m, side[i + 1 :])
        ]
    return found


def _our_questions(
    assistant: list[_Message], person: list[_Message]
) -> tuple[set[str], set[str], bool]:
    """Our questions before the reply (the last A line) that no say answers, the says that
    answer one, and whether the rules are sure of both. With no question of ours before the
    reply there is nothing to answer: the says are not matched, which spares most turns the
    matching."""
    if not any(a.is_question for a in assistant[:-1]):
        return set(), set(), True
    skipped = {m.ref for m in person if m.is_lull} | {assistant[-1].ref}
    matched, sure = _sure_matching(*_without(skipped, assistant, person))
    asked = {a.ref for a in assistant if a.is_question}
    answers = {a["message"] for a in matched["answers"] if a["answers"] in asked}
    return set(matched["open"]), answers, all(sure)


def _without(
    skipped: set[str], assistant: list[_Message], person: list[_Message]
) -> tuple[list[_Message], list[_Message]]:
    """The lines but those `skipped`, as `_parse` reads them alone: the lines already read
    are taken again, unless leaving some out changes the language they are read in."""
    kept = [[m for m in side if m.ref not in skipped] for side in (assistant, person)]
    lang = language([m.text for side in kept for m in side])
    a_kept, p_kept = (
        [m if m.lang == lang else _Message(m.ref, m.text, lang) for m in side] for side in kept
    )
    return a_kept, p_kept


def _asks_again(reply: _Message, question: _Message) -> bool:
    """Whether the reply asks of what `question` asked: that is its own question now."""
    return any(p.is_question and p.content_words & question.content_words for p in reply.parts)


def _skipped(person: list[_Message], reply: _Message, answers: set[str]) -> list[LooseRead]:
    """The says with a part the reply does not deal with: a question or a request it shares
    no word with, unless that is all the says said (a reply that says more than "right" is
    to it) or the reply puts
    it off until it finds out (its thread carries it: "I'll get back to you"); a point
    added ("oh and ...") that it shares no word with while it speaks of the rest, in a say
    that answers none of our questions (`answers`: "oh and yes, I booked it" answers)."""
    parts = [
        (say, part)
        for say in person
        if not promises(say.text) and not say.is_lull
        for part in say.parts
        if not is_holding(part.text)
    ]
    heard = [part.content_words & reply.content_words for _, part in parts]
    skipped: dict[str, LooseRead] = {}
    for (say, part), shared in zip(parts, heard, strict=True):
        if shared:
            continue
        if part.is_question or part.requests:
            if (len(parts) == 1 and not reply.is_lull) or _DEFERS.search(reply.text):
                continue
            kind = "question"
        elif part.adds and any(heard) and say.ref not in answers:
            kind = "point"
        else:
            continue
        skipped.setdefault(say.ref, LooseRead("person", say.ref, say.text, kind, True, True))
    return list(skipped.values())


@lru_cache(maxsize=_READINGS)
def promises(text: str) -> bool:
    """Whether `text` leaves something to go on later: "I'll tell you later", "je reviens
    vers toi", "to be continued"."""
    return _PROMISE.search(text.lower()) is not None


def _taken_up(thread: _Message, later: list[_Message]) -> bool:
    """A thread is taken up by a later line of the side that left it which speaks of it:
    ours by a reply, theirs by a say (the reply right after a promise of theirs cannot
    tell what they have not told yet)."""
    return any(thread.content_words & line.content_words for line in later)


class RehearsalAnalysis:
    """The built-in analysis: the `Analysis` of a server without an analysis model."""

    label = "rehearsal (built-in rules, not a model)"

    async def ask(
        self, task: str, lines: Sequence[str], instructions: str, shape: Shape | None = None
    ) -> dict[str, Any] | None:
        request_text(task, lines)  # the same refusal of unknown tasks as the model's
        if task == "reply-matching":
            return reply_matching(lines)
        if task == "loose-ends":
            return loose_ends(lines)
        return None  # no rules for it: the caller goes on as without an analysis

    async def close(self) -> None:
        """Nothing to release."""
