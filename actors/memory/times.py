"""Times of day said in words, written as a clock writes them.

"8 pm", "20:00", "eight in the evening" and "8 heures du soir" are one time, and "half past
seven" is 7:30. The value guard compares times as a clock writes them, and the word-by-word
checks compare wordings, so both read a text through `spoken_times`, which rewrites each
time said in words ("eight in the evening" -> "20:00", "sept heures et demie" -> "7:30").

A time whose half of the day is said ("pm", "du matin", "in the evening", or an hour past
twelve) is written with two digits for its hour ("08:00", "20:00"); one whose half is not
("half past seven", "à 8 heures", "7:30") has one digit: it may be morning or evening, and
`agree` reads it as whichever the other memory says.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# Hours said in words, English and French (with and without accents: `plain` drops them).
HOURS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "noon": 12, "midnight": 0,
    "une": 1, "deux": 2, "trois": 3, "quatre": 4, "cinq": 5, "sept": 7, "huit": 8,
    "neuf": 9, "dix": 10, "onze": 11, "douze": 12, "treize": 13, "quatorze": 14, "quinze": 15,
    "seize": 16, "dix-sept": 17, "dix-huit": 18, "dix-neuf": 19, "vingt": 20,
    "vingt et une": 21, "vingt-et-une": 21, "vingt-deux": 22, "vingt-trois": 23,
    "midi": 12, "minuit": 0,
}  # fmt: skip
# Minutes said after the hour ("seven thirty", "sept heures et demie", "20 heures 30").
MINUTES = {
    "o'clock": 0, "oclock": 0, "fifteen": 15, "thirty": 30, "forty-five": 45,
    "et demie": 30, "et demi": 30, "et quart": 15, "moins le quart": -15, "moins quart": -15,
    "quinze": 15, "trente": 30, "quarante-cinq": 45,
}  # fmt: skip
# Minutes said before the hour: "half past seven", "a quarter to eight".
PAST = {"half past": 30, "quarter past": 15, "a quarter past": 15, "quarter to": -15,
        "a quarter to": -15}  # fmt: skip
# Which half of the day.
HALF = {
    "am": "am", "a.m.": "am", "a.m": "am", "pm": "pm", "p.m.": "pm", "p.m": "pm",
    "in the morning": "am", "du matin": "am",
    "in the afternoon": "pm", "de l'apres-midi": "pm", "de l'après-midi": "pm",
    "in the evening": "pm", "du soir": "pm",
    "at night": "night", "de la nuit": "night",
}  # fmt: skip
# French "heures" is a duration too ("le trajet dure deux heures"): a time when it is said
# "at" one, or with its minutes or its half of the day.
_AT = r"(?:à|a|vers|dès|des|avant|après|apres|jusqu'à|jusqu'a)"


def _either(words: dict[str, int] | dict[str, str]) -> str:
    ordered = sorted(words, key=len, reverse=True)  # "dix-sept" before "dix"
    return "(?:" + "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in ordered) + ")"


_HOUR = rf"(?<![\w:.,])(\d{{1,2}}|{_either(HOURS)})"
_HALF = rf"(?:\s*({_either(HALF)}))"
_END = r"(?![\w'-])"
_BEFORE = re.compile(rf"\b({_either(PAST)})\s+{_HOUR}{_HALF}?{_END}", re.IGNORECASE)
_FRENCH = re.compile(
    rf"(\b{_AT}\s+)?{_HOUR}\s+heures?(?:\s+(\d{{2}}|{_either(MINUTES)}))?{_HALF}?{_END}",
    re.IGNORECASE,
)
_ENGLISH = re.compile(
    rf"{_HOUR}(?:[:.](\d{{2}})|\s+({_either(MINUTES)}))?{_HALF}{_END}"
    rf"|{_HOUR}\s+(o'?clock|thirty|fifteen|forty-five){_END}",
    re.IGNORECASE,
)


def _key(words: str) -> str:
    return " ".join(words.casefold().split())


def _number(word: str, table: dict[str, int]) -> int:
    return int(word) if word.isdigit() else table[_key(word)]


def clock(hour: int, minutes: int, half: str | None = None) -> str | None:
    """The time as written here (one digit for an hour whose half of the day is unsaid),
    or None for no time of day ("25 heures")."""
    if minutes < 0:
        hour, minutes = hour - 1, 60 + minutes
    if not (0 <= hour <= 23 and 0 <= minutes <= 59):
        return None
    if half is None:
        return f"{hour}:{minutes:02d}" if 1 <= hour <= 12 else f"{hour:02d}:{minutes:02d}"
    if hour < 12 and (half == "pm" or (half == "night" and hour >= 6)):
        hour += 12
    elif hour == 12 and half in ("am", "night"):
        hour = 0
    return f"{hour:02d}:{minutes:02d}"


def _half(said: str | None) -> str | None:
    return HALF[_key(said)] if said else None


def _before(match: re.Match[str]) -> str | None:
    past, hour, half = match.groups()
    return clock(_number(hour, HOURS), PAST[_key(past)], _half(half))


def _french(match: re.Match[str]) -> str | None:
    at, hour, minutes, half = match.groups()
    if not (at or minutes or half):
        return None  # a duration, as far as the words tell
    said = clock(_number(hour, HOURS), _number(minutes, MINUTES) if minutes else 0, _half(half))
    return None if said is None else (at or "") + said


def _english(match: re.Match[str]) -> str | None:
    hour, digits, minutes, half, hour_oc, minutes_oc = match.groups()
    if hour is None:
        return clock(_number(hour_oc, HOURS), MINUTES[_key(minutes_oc)])
    said = int(digits) if digits else MINUTES[_key(minutes)] if minutes else 0
    return clock(_number(hour, HOURS), said, _half(half))


def _rewriting(read: Callable[[re.Match[str]], str | None]) -> Callable[[re.Match[str]], str]:
    def rewrite(match: re.Match[str]) -> str:
        said = read(match)
        return match.group(0) if said is None else said

    return rewrite


_FORMS = ((_BEFORE, _rewriting(_before)), (_FRENCH, _rewriting(_french)),
          (_ENGLISH, _rewriting(_english)))  # fmt: skip


def spoken_times(text: str) -> str:
    """`text` with each time said in words written as a clock writes it."""
    for pattern, rewrite in _FORMS:
        text = pattern.sub(rewrite, text)
    return text


def agree(ours: frozenset[str], theirs: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
    """Both sets of times, each time whose half of the day is unsaid ("7:30") read in the
    half the other set has it in ("07:30" or "19:30"), else in the morning."""
    return _settled(ours, theirs), _settled(theirs, ours)


def _halves(time: str) -> tuple[str, ...]:
    hour, minutes = time.split(":")
    morning = f"{int(hour):02d}:{minutes}"
    return (morning, f"{(int(hour) + 12) % 24:02d}:{minutes}") if len(hour) == 1 else (morning,)


def _settled(times: frozenset[str], other: frozenset[str]) -> frozenset[str]:
    theirs = {half for time in other for half in _halves(time)}
    return frozenset(
        next((h for h in _halves(time) if h in theirs), _halves(time)[0]) for time in times
    )
