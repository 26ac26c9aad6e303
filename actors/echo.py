"""The echo guard: a reply never opens with a repetition of what was just said.

Models, small local ones most, sometimes open a reply by repeating the person's message, or
the message they sent last time. The guard watches the start of the reply as it streams and
compares it with the person's messages since the assistant's last one (8 compared characters
or more) and the assistant's own last three messages (20 or more). While the start could
still be a repetition, the text is held back; a full repetition is cut and the rest goes
on (watched again, as it is the reply's new start); once the start cannot be one, everything
held is released unchanged. Only letters and digits are compared, case-folded and without
accents ("&" as "and"), so case, spacing and punctuation make no difference. A repetition
counts only as a whole sentence or clause of the reply: "Thank you so much for saying that"
does not repeat "Thank you so much!".

Three repetitions are not echoes, and pass: a greeting or wish returned ("Good night!" for
"Good night!"), a repetition the person asked for ("read that back to me"), and a reply that
opens with a quotation mark (it quotes on purpose).

The guard is pure: it is fed the model's text and answers what may be sent now.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from storage.records import Turn

PERSON_MIN_CHARS = 8
ASSISTANT_MIN_CHARS = 20
OWN_MESSAGES = 3

# Told to the model when its whole reply was a repetition and it is asked again.
NO_REPEAT = (
    "Your reply must not repeat the person's message, nor any message you sent before. "
    "Answer it instead, in your own words."
)

# Ends of a cut repetition, swallowed with it; also stripped from the start of what follows.
_SEPARATORS = " \t\r\n.,;:!?\u2026)]}\u00bb\u201d\u2019-\u2013\u2014"
# Inside a word: a repetition that stops before one of these stops mid-word.
_JOINERS = "-'\u2019"
_QUOTES = "\"'\u201c\u2018\u00ab\u201e"
_FORMULA = re.compile(
    r"(?:good ?(?:night|morning|evening|afternoon|day)|good ?bye|bye bye|hello|hi|hey"
    r"|happy (?:birthday|new year|holidays|easter|anniversary|weekend|friday)"
    r"|merry christmas|sweet dreams|sleep (?:well|tight)|take care|cheers"
    r"|see you(?: soon| later| tomorrow)?|have a (?:nice|good|great|lovely) \w+"
    r"|bonne (?:nuit|journee|soiree|annee)|bonjour|bonsoir|salut|a demain|au revoir"
    r"|joyeux noel|joyeux anniversaire|dors bien|fais de beaux reves"
    r"|(?:nice|pleased|good|great|lovely) to (?:meet|see|hear from) you|welcome back"
    r"|(?:i )?(?:love|miss) you(?: so much)?|enchantee?|(?:je )?t aime)"
    r"(?: there| (?:to )?you(?: too)?| too| everyone| all| a toi| a vous| aussi)?"
)
_ASKS_REPEAT = re.compile(
    r"\b(?:repeat|read (?:\w+ ){0,3}back|say (?:it|that|this|those|them) (?:back|again)"
    r"|word for word|verbatim|back to me|repete[sz]?|repeter|redis|redites)\b"
)


@dataclass(frozen=True, slots=True)
class Source:
    """A message the reply must not open with: whose it was, and its compared characters."""

    kind: str  # person | assistant
    folded: str


@dataclass(frozen=True, slots=True)
class Cut:
    kind: str  # whose message the reply repeated
    text: str  # what was cut, as the model wrote it


@lru_cache(maxsize=4096)
def _fold_char(char: str) -> str:
    if char == "&":
        return "and"
    decomposed = unicodedata.normalize("NFKD", char).casefold()
    return "".join(c for c in decomposed if c.isalnum())


FOLDS_KEPT = 4096  # characters whose fold is kept


class _Folds(dict[int, str]):
    """Each character's fold by its code, for `str.translate`: a text folds in one call,
    not one per character. Filled as characters come, up to a bound."""

    def __missing__(self, code: int) -> str:
        folded = _fold_char(chr(code))
        if len(self) < FOLDS_KEPT:
            self[code] = folded
        return folded


_FOLDS = _Folds()


@lru_cache(maxsize=1024)  # a reply is folded again by the next three turns' guards
def fold(text: str) -> str:
    """The characters compared: letters and digits, case-folded, accents dropped."""
    return text.translate(_FOLDS)


def _words(text: str) -> str:
    """Lower-case words, accents dropped, one space between: for the phrase patterns."""
    words = re.split(r"[\s.,;:!?\u2026'\u2019\"()-]+", text)
    return " ".join(f for f in (w.translate(_FOLDS) for w in words) if f)


def sources_for(history: Sequence[Turn], new: Sequence[Turn]) -> list[Source]:
    """What a reply to `new` must not open with, given the conversation before it."""
    turns = [*history, *new]
    last_own = max((i for i, t in enumerate(turns) if t.role == "assistant"), default=-1)
    said = [(t.text, _words(t.text)) for t in turns[last_own + 1 :] if t.role == "user"]
    if any(_ASKS_REPEAT.search(words) for _, words in said):
        return []  # the person asked for a repetition: it is no echo
    own = [t.text for t in turns if t.role == "assistant"][-OWN_MESSAGES:]
    people = [
        Source("person", folded)
        for folded, words in ((fold(text), words) for text, words in said)
        if len(folded) >= PERSON_MIN_CHARS and not _FORMULA.fullmatch(words)
    ]
    mine = [Source("assistant", f) for f in map(fold, own) if len(f) >= ASSISTANT_MIN_CHARS]
    return people + mine


class EchoGuard:
    """Holds back the start of one reply while it could be a repetition of a `Source`.

    `feed` takes each piece of the model's text and answers what may go out now; `end` is
    called when the model's text stops (the end of a model call), and answers the rest.
    """

    def __init__(self, sources: Sequence[Source]) -> None:
        self._sources = tuple(sources)
        self.cuts: list[Cut] = []
        self._watching = bool(self._sources)
        self._held = ""
        self._folded = ""
        self._ends: list[int] = []  # for each folded character, where its text ends in _held
        self._after_cut = False

    @property
    def watching(self) -> bool:
        """Still at the reply's start: nothing released yet."""
        return self._watching

    @property
    def held(self) -> str:
        return self._held

    def feed(self, text: str) -> str:
        if not self._watching:
            return text
        self._hold(text)
        return self._settle(ended=False)

    def end(self) -> str:
        """The model's text stopped: a repetition running to here is whole, any other
        start is released."""
        return self._settle(ended=True) if self._watching else ""

    def drop(self) -> None:
        """Forget what is held: the reply was cut off, or its model call failed."""
        self._held, self._folded, self._ends = "", "", []

    def _hold(self, text: str) -> None:
        if self._after_cut:
            text = text.lstrip(_SEPARATORS)  # the cut's own trailing punctuation and space
            self._after_cut = not text
        base = len(self._held)
        folded = [_fold_char(char) for char in text]
        for offset, chars in enumerate(folded):
            self._ends.extend([base + offset + 1] * len(chars))
        self._folded += "".join(folded)
        self._held += text

    def _settle(self, *, ended: bool) -> str:
        while self._held:
            if self._could_still_repeat(ended):
                return ""
            match = self._longest_repetition(ended)
            if match is None:
                released = self._held
                self._watching = False
                self.drop()
                return released
            self._cut(*match)
        return ""  # nothing yet, or all of it cut: still the reply's start

    def _could_still_repeat(self, ended: bool) -> bool:
        if ended or self._quotes():
            return False
        for source in self._sources:
            if source.folded.startswith(self._folded):
                return True  # all of it so far is the source's start
            if self._folded.startswith(source.folded) and self._ends_sentence(source) is None:
                return True  # all of the source, and nothing but spaces after it yet
        return False

    def _ends_sentence(self, source: Source) -> bool | None:
        """Whether the held text's repetition of `source` ends a sentence or clause, as an
        echo does; None while only spaces follow it (the next character decides)."""
        rest = self._held[self._ends[len(source.folded) - 1] :]
        if rest and _goes_on(rest[0]):
            return False  # the word goes on: "work" is not "workout"
        following = rest.lstrip()[:1]
        if not following:
            return None
        return not _fold_char(following)  # a next word: "Thank you so much for ..." goes on

    def _longest_repetition(self, ended: bool) -> tuple[int, Source] | None:
        """The end in the held text of the longest source it opens with as a whole
        sentence (the end of the model's text ends one too)."""
        if self._quotes():
            return None
        best: tuple[int, Source] | None = None
        for source in self._sources:
            if not self._folded.startswith(source.folded):
                continue
            whole = self._ends_sentence(source)
            if not (whole or (whole is None and ended)):
                continue
            end = self._ends[len(source.folded) - 1]
            if best is None or end > best[0]:
                best = (end, source)
        return best

    def _quotes(self) -> bool:
        """The reply opens with a quotation mark: it quotes on purpose."""
        opening = self._held.lstrip()[:1]
        return not self.cuts and opening != "" and opening in _QUOTES

    def _cut(self, end: int, source: Source) -> None:
        while end < len(self._held) and self._held[end] in _SEPARATORS:
            end += 1
        self.cuts.append(Cut(source.kind, self._held[:end]))
        rest = self._held[end:]
        self.drop()
        self._after_cut = True
        self._hold(rest)

    def describe(self) -> str:
        """For the turn's log: what was cut."""
        parts = [f"{len(c.text)} chars repeating {_WHOSE[c.kind]}" for c in self.cuts]
        return "echo cut: " + ", ".join(parts)


def _goes_on(char: str) -> bool:
    """Whether `char`, right after a word, is still part of it."""
    return bool(_fold_char(char)) or char in _JOINERS or unicodedata.category(char)[0] == "M"


_WHOSE = {"person": "the person's message", "assistant": "an earlier reply"}
