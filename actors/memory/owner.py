"""The person's own name: "Hannah is going to Lisbon" is told in the first person.

The chat model writes a person's memories sometimes in the first person ("My brother Owen
lives in Bristol"), sometimes in the third, by the name the person gave ("Hannah's brother
lives in Bristol"). The guards keep "I" and a named person apart ("I'm vegetarian" / "Léa
is vegetarian"), so without knowing the person's own name they keep two wordings of one of
the person's facts apart too: "The Lisbon trip is with Maya." / "Hannah is going to Lisbon
with Maya." names someone the first does not mention.

The server knows a person by a key, never by a name; the name is what the person said it
was, in a memory of theirs ("My name is Hannah", "Call me Hannah", "Je m'appelle Hannah").
`own_names` reads it from those; the guards then take that name for "I" where they ask who
a fact is about (`actors.memory.guards`, `actors.memory.values.conflict`), and for someone
every memory of the person mentions. Anywhere else it stays a name like any other, so "Maya
owes Hannah £50" / "Hannah owes Maya £50" are still told apart. The shared tier's words
leave it out with the other names, so "Hannah's parents live in York." / "Mum and Dad live
in York." trade one word, not two. The read scans the person's memories, so the keeper
makes it only when the name could change the verdict: the subject guard kept a candidate
apart, or a candidate's words said more than the other's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from actors.memory.values import STOP_WORDS, plain

_NAME = r"([^\W\d_][\w'\u2019-]*)"
# How a person says their name, or the model writes it down (on the plain form of a text).
NAMING = re.compile(
    r"\b(?:my (?:first )?name is|i am called|i'm called|call me|"
    r"(?:the )?(?:user|person)(?:'s)? (?:first )?name is|(?:the )?(?:user|person) is called|"
    r"je m'appelle|mon (?:pre)?nom (?:est|c'est)|appelle[- ]moi)\s+" + _NAME
)
# What a store looks for first (in SQL, case-insensitively): a text that may say a name.
NAMING_HINT = r"(name is|called|call me|appelle|nom)"


def own_names(texts: Iterable[str]) -> frozenset[str]:
    """The names the person gave themself in `texts`, in their plain form: written with a
    capital ("Owen will call me tomorrow" names no one), unless nothing in the text is (a
    voice transcript may be all lower case)."""
    names = set()
    for text in texts:
        written = {plain(w).strip("'-") for w in re.findall(_NAME, text) if w[0].isupper()}
        for match in NAMING.finditer(plain(text)):
            name = match.group(1).strip("'-")
            if name and name not in STOP_WORDS and (name in written or text.islower()):
                names.add(name)
    return frozenset(names)


def names_self(text: str) -> bool:
    """Whether `text` says the person's name ("My name is Hannah."). Such a memory is where
    the name is read from: no other memory of theirs is that one, whatever a judge says (and
    one that says more, "My name is Hannah and I live in Bristol", is not it either)."""
    return NAMING.search(plain(text)) is not None
