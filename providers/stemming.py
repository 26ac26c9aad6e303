"""The crude English stemmer that the rehearsal analysis and memory recognition share.

Both only need word forms to meet ("books" and "book", "hiking" and "hike", "moves" and
"moving"), not a linguist's stem; one rule keeps their notions of "the same word" equal."""

from __future__ import annotations

_SUFFIXES = ("ing", "ed", "es", "s", "e")


def stem(word: str) -> str:
    """`word` without its first matching suffix, if at least three letters remain."""
    for suffix in _SUFFIXES:
        if len(word) - len(suffix) >= 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word
