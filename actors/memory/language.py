"""Is a memory written in English? Told by its function words.

all-MiniLM-L6-v2 reads only English, so the judge of paired fingerprints and the slot
guard need to know. A memory is one or two sentences, and its names, places and
numbers say nothing of its language, but its small words do: "the", "is", "with" against
"le", "est", "avec". A text with no function word at all ("Owen, Bristol, Saturday") counts
as English, where every model agrees anyway.
"""

from __future__ import annotations

import re

# Function words, as written: a word in each list is seen only in that language's sentences.
_ENGLISH = """
the an is are was were be been to of in on at for with from by and or but not my your her his
their our its this that these those will would has have had does did she he it they we you i
me him them who which what when where
"""
# French, Spanish, Italian, German, Portuguese; "a", "on", "son", "die", "do", "per", "non",
# "ma" and "o" (o'clock) are English words too, and "van" and "von" are in English names, so
# they are left out. Numerals in words mark a language too ("Tom a deux chiens").
_OTHER = """
le la les de du des à au aux en est et un une mon mes ton tes chez dans avec ne pas il elle
je nous vous sont qui que sur mais ou cette ce ces ses leur sa l j qu c n
el los las es y con por para una del muy pero su sus está
di è nel della alla gli che sono
der das und ist mit ein eine einem einen einer nicht ich auf den dem zu im bei für nach
wie aber oder auch sich sie wir ihr mein meine sein seine
os da em num uma não é
deux trois quatre cinq sept huit neuf dix douze vingt cent dos tres cuatro cinco
"""
ENGLISH_WORDS = frozenset(_ENGLISH.split())
OTHER_WORDS = frozenset(_OTHER.split())
_WORD = re.compile(r"[^\W\d_]+")


def english(text: str) -> bool:
    """More English function words than other languages' (or none of theirs at all)."""
    words = _WORD.findall(text.casefold())
    other = sum(w in OTHER_WORDS for w in words)
    return other == 0 or sum(w in ENGLISH_WORDS for w in words) > other
