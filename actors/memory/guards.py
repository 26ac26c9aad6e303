"""The guards: checks that keep two memories apart whatever their fingerprints say.

A fingerprint sees what a sentence is about far better than what it says of it: "I am
allergic to cats" and "My daughter is allergic to cats" score 0.87, "I love coriander" and
"I hate coriander" 0.88. Merging such a pair loses a fact without a trace, so before any
merge, whatever the tier, these run on the words (English and French):

- subject: who the fact is about. "I" is not a named person ("I'm vegetarian" / "Léa is
  vegetarian"), and a relation one memory brings in that the other does not even mention
  makes it someone else's fact ("my daughter", "Owen's son", "Priya is my sister's boss",
  "Léa is dating a pilot", "la femme de Paul"). A relation that names someone already there
  ("my brother Owen", "Owen, that's my brother") is no other person. The same words with the
  roles exchanged are someone else's fact too ("Rose knits for the grandchildren" / "The
  grandchildren knit for Rose");
- negation: one says what the other denies, in the same words (past "still", "anymore"), or
  in two languages ("I drink coffee" / "Je ne bois pas de café"); "quit" and "arrêté de"
  deny too, so "Paul a arrêté de fumer" and "Paul ne fume plus" agree;
- opposite: the other end of one scale (likes/hates, window/aisle, open/closed, hot/iced,
  morning/evening), or the same preference the other way round ("the mountains to the
  beach" / "the beach to the mountains");
- slot: the same sentence but for one word that carries the fact ("allergic to cats" / "to
  dogs"; at the end of the sentence, its small words aside: "peur de l'avion" / "peur des
  araignées"), and every value `actors.memory.values` compares (numbers, dates, times,
  places, named people, relations).

A subject or a one-word slot makes the new memory `distinct`: another fact, stored. A value,
a negation or an opposite makes it a `contradiction`: stored, and linked to the other for
the person to settle. A contradiction is a new value for the same slot of the same subject:
values of two different people ("Lea" / "Mira"), or of sentences whose other words say
different things ("My sister Lea is allergic to cats" / "The cat sitter is called Mira"),
are two facts, `distinct`.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from dataclasses import dataclass

from actors.memory.language import english
from actors.memory.values import (
    RELATIONS,
    STOP_WORDS,
    Conflict,
    conflict,
    content_words,
    negated,
    plain,
    spells_value,
    tokens,
)
from providers.stemming import stem
from storage.records import MemoryDraft

DISTINCT = "distinct"
CONTRADICTION = "contradiction"


@dataclass(frozen=True, slots=True)
class Guarded:
    """Why two memories are never one: the guard (`subject`, `negation`, `opposite`,
    `slot`), what it saw, and the verdict it gives (`distinct` or `contradiction`)."""

    guard: str
    detail: str
    verdict: str

    def __str__(self) -> str:
        return f"{self.guard}: {self.detail}"


_KIN = {plain(word): value for word, value in RELATIONS.items()}
# Predicates that bring in a partner: "Léa is dating a pilot" is about the pilot's job.
_PARTNERED = re.compile(
    r"\b(?:dating|going out with|married to|engaged to|in love with|sort avec|"
    r"mariee? (?:a|avec)|fiancee? (?:a|avec)|en couple avec|amoureuse? de)\s+(\S+)"
)
# Words that mention a partner without bringing one in ("Mon frère s'est marié" is about him).
_PARTNER_WORDS = frozenset({"married", "marrie", "marie", "mariee", "epouse", "wedding", "mariage"})
# Relations that are one another's, mentioned: "Mum and Dad" are "Hannah's parents".
_SAME_PEOPLE = (
    frozenset({"mother", "father", "parents"}),
    frozenset({"partner", "wife", "husband"}),
)
_FIRST_PERSON = frozenset({"i", "je", "j", "moi"})
_OWNERS = frozenset({"my", "our", "mon", "ma", "mes", "notre", "nos"})
_WORD = re.compile(r"[^\W\d_][\w'\u2019-]*")
_NAMING = frozenset({"called", "named", "is", "s", "that", "est", "c", "appelle", "qui"})


def _words_with_case(text: str) -> list[tuple[str, bool]]:
    """The plain form of each word, and whether it was written with a capital."""
    text = unicodedata.normalize("NFKC", text).replace("\u2019", "'")
    return [(plain(w), w[0].isupper()) for w in _WORD.findall(text)]


def _relations(
    draft: MemoryDraft, other: MemoryDraft, me: frozenset[str] = frozenset()
) -> dict[str, bool]:
    """The relations `draft` brings in, each with whether it names a person already there:
    "my brother Owen" (named), "my daughter" (not), "Owen's son" (never: Owen is the owner).
    A "my R" in a memory about named people whom `other` names too may be one of them. The
    person's own name (`me`) owns as "my" does: "Ines, Hannah's colleague"."""
    words = _words_with_case(draft.text)
    people = {plain(p) for p in draft.people}
    others = {w for w, _ in _words_with_case(other.text)} & people
    found: dict[str, bool] = {}
    for i, (word, _) in enumerate(words):
        relation = _KIN.get(word.removesuffix("'s").rstrip("'"))  # "the kids' bedtime"
        if relation is None:
            continue
        before = words[i - 1][0] if i else ""
        after = words[i + 1 : i + 3]
        if (before.endswith("'s") and before[:-2] in me) or (
            len(after) == 2 and after[0][0] == "de" and after[1][0] in me
        ):
            before = "my"  # "Hannah's colleague", "la collègue de Hannah": hers
        owned_by_name = before.endswith("'s") and words[i - 1][1]
        # "my sister's boss", "le chat de la voisine": the sister, the neighbour, is another
        # person, whoever owns them.
        chained = word.endswith("'") or word.endswith("'s") or _owns_before(words, i)
        # "Owen's son" is another person, unless named after ("Owen's wife Nadia").
        steps = (1,) if owned_by_name else (1, -1)
        named = not chained and _names_someone(words, i, people, steps)
        if not named and before in _OWNERS and not chained and others:
            named = True  # "my brother" in a memory about Owen, beside one naming Owen
        found[relation] = found.get(relation, False) or named
    partnered = _PARTNERED.search(unicodedata.normalize("NFKC", draft.text))
    if partnered is None:
        partnered = _PARTNERED.search(plain(draft.text))
    if partnered is not None:
        named = partnered.group(1)[:1].isupper()  # "married to Owen"
        found["partner"] = found.get("partner", False) or named
    return found


_OF_THE = frozenset({"du", "des", "de la"})


def _owns_before(words: list[tuple[str, bool]], at: int) -> bool:
    """A French relation that owns the one before it: "le chat de la voisine", "le fils
    du voisin"."""
    small = [w for w, _ in words[max(0, at - 3) : at]]
    for n in (1, 2):
        if len(small) > n and " ".join(small[-n:]) in _OF_THE and _kin(small[-n - 1]):
            return True
    return False


def _names_someone(
    words: list[tuple[str, bool]], at: int, people: set[str], steps: tuple[int, ...]
) -> bool:
    """A name next to the relation word, past "called", "is", "that's"...: who it is."""
    for step in steps:
        i = at + step
        while 0 <= i < len(words) and words[i][0] in _NAMING | _OWNERS:
            i += step
        if 0 <= i < len(words) and abs(i - at) <= 4:
            word, upper = words[i]
            word = word.removesuffix("'s")
            if upper and (i > 0 or word in people) and word not in _FIRST_PERSON:
                return True
    return False


def _kin(word: str) -> str | None:
    """The relation a word names, plurals too ("cats", "chiens")."""
    return _KIN.get(word) or (_KIN.get(word[:-1]) if word.endswith(("s", "x")) else None)


def _mentions(draft: MemoryDraft) -> set[str]:
    """Every relation the memory's words touch, named or not, partners included."""
    words = {w.removesuffix("'s").rstrip("'") for w, _ in _words_with_case(draft.text)}
    found = {kin for w in words if (kin := _kin(w)) is not None}
    if words & _PARTNER_WORDS or _PARTNERED.search(plain(draft.text)):
        found.add("partner")
    for group in _SAME_PEOPLE:
        if found & group:
            found |= group
    return found


def _subject(draft: MemoryDraft, me: frozenset[str]) -> str | None:
    """`self` for a memory told in the first person or by the person's own name (`me`), a
    name for one that opens with a person it is about (one of its people), else None."""
    words = _words_with_case(draft.text)
    if not words:
        return None
    first = words[0][0].removesuffix("'s")
    if first in _FIRST_PERSON or first.startswith(("i'", "j'")):
        return "self"
    if first in {plain(p) for p in draft.people} and not words[0][0].endswith("'s"):
        return "self" if first in me else first
    return None


def subject_guard(
    a: MemoryDraft, b: MemoryDraft, me: frozenset[str] = frozenset()
) -> Guarded | None:
    """Another person's fact: a first-person memory against one about a named person it
    does not mention (the person's own names, `me`, are "I"), or a relation one brings in
    that the other does not mention."""
    ours, theirs = _subject(a, me), _subject(b, me)
    if ours and theirs and ours != theirs and "self" in (ours, theirs):
        named = theirs if ours == "self" else ours
        mine = a if ours == "self" else b
        if named not in {w for w, _ in _words_with_case(mine.text)}:
            return Guarded("subject", f"{ours} vs {theirs}", DISTINCT)
    if _roles_exchanged(a, b):
        return Guarded("subject", "the roles exchanged", DISTINCT)
    for one, other in ((a, b), (b, a)):
        extra = {r for r, named in _relations(one, other, me).items() if not named}
        extra -= _mentions(other)
        if extra:
            return Guarded("subject", f"{', '.join(sorted(extra))} of someone else", DISTINCT)
    return None


_PASSIVE = frozenset({"by", "par"})


def _roles_exchanged(a: MemoryDraft, b: MemoryDraft) -> bool:
    """The same words with who does what and to whom swapped around what they do: "Rose
    knits scarves for the grandchildren" / "The grandchildren knit scarves for Rose",
    "Léa appelle sa mère le dimanche" / "Sa mère appelle Léa le dimanche". A
    passive ("by", "par") says the same with its roles swapped, so it is left alone."""
    if _PASSIVE & (set(tokens(a.text)) | set(tokens(b.text))):
        return False
    ours, theirs = content_words(a.text), content_words(b.text)
    if ours == theirs or sorted(ours) != sorted(theirs):
        return False
    while ours[0] == theirs[0]:  # what both open or close with plays no role ("le dimanche")
        ours, theirs = ours[1:], theirs[1:]
    while ours[-1] == theirs[-1]:
        ours, theirs = ours[:-1], theirs[:-1]
    n = len(ours)
    return any(
        theirs == ours[j:] + ours[i:j] + ours[:i] for i in range(1, n) for j in range(i + 1, n)
    )


# -- negation ------------------------------------------------------------------------------

# Verbs that deny what follows: "Sam quit smoking" says he does not smoke.
_STOPPED = re.compile(r"\b(?:quit|quits|stopped|gave up|given up|arrete de|arrete d|cesse de)\b")
# Words that only say how long or how firmly: "Sam still smokes" / "Sam no longer smokes".
_DEGREE = frozenset({"still", "anymore", "longer", "always", "ever", "encore", "toujours", "tout"})


def _denies(text: str) -> bool:
    return negated(tokens(text)) or _STOPPED.search(plain(text)) is not None


def negation_guard(a: MemoryDraft, b: MemoryDraft) -> Guarded | None:
    """One denies what the other says: in one language, with the other's words (one set of
    words holding the other's); across two, whenever only one denies."""
    if _denies(a.text) == _denies(b.text):
        return None
    said = a.text if not _denies(a.text) else b.text
    if english(a.text) != english(b.text):
        return Guarded("negation", f"denied in the other language: {said!r}", CONTRADICTION)
    ours = set(content_words(a.text)) - _DEGREE
    theirs = set(content_words(b.text)) - _DEGREE
    # The same words, give or take one ("I don't drink coffee in the evening").
    if ours and theirs and (ours <= theirs or theirs <= ours) and len(ours ^ theirs) <= 1:
        return Guarded("negation", f"denies {said!r}", CONTRADICTION)
    return None


# -- opposites -----------------------------------------------------------------------------

# Each scale's words, by the value they give it (plain forms: no accents).
_SCALES: dict[str, dict[str, tuple[str, ...]]] = {
    "liking": {
        "likes": ("love", "loves", "loved", "like", "likes", "adore", "adores", "enjoy",
                  "enjoys", "aime", "aiment", "adorent", "kiffe"),
        "dislikes": ("hate", "hates", "hated", "dislike", "dislikes", "detest", "detests",
                     "loathe", "loathes", "deteste", "detestent"),
    },
    "seat": {"window": ("window", "hublot", "fenetre"), "aisle": ("aisle", "couloir")},
    "open": {
        "open": ("open", "opened", "ouvert", "ouverte", "ouverts", "ouvertes"),
        "closed": ("closed", "shut", "ferme", "fermee", "fermes", "fermees"),
    },
    "heat": {
        "hot": ("hot", "warm", "chaud", "chaude"),
        "cold": ("cold", "iced", "chilled", "froid", "froide", "glace", "glacee"),
    },
    "direction": {"up": ("up", "higher"), "down": ("down", "lower")},
    "daypart": {
        "morning": ("morning", "mornings", "matin", "matins", "matinee"),
        "afternoon": ("afternoon", "afternoons", "apres"),
        "evening": ("evening", "evenings", "night", "nights", "tonight", "soir", "soirs",
                    "soiree", "nuit"),
    },
    "hour": {"early": ("early", "tot"), "late": ("late", "tard")},
}  # fmt: skip
_POLE = {word: (scale, value) for scale, values in _SCALES.items() for value, words in
         values.items() for word in words}  # fmt: skip
_FLIPPED = {"likes": "dislikes", "dislikes": "likes"}
# After these, "like" compares ("tastes like soap") rather than likes.
_LIKE_NOT_LIKING = frozenset(
    {"taste", "tastes", "look", "looks", "sound", "sounds", "feel", "feels", "smell", "smells",
     "seem", "seems", "is", "was", "are", "just", "more", "much", "something", "nothing"}
)  # fmt: skip
_COMPARING = frozenset({"prefer", "prefers", "rather", "than", "over", "prefere", "preferes"})


def _poles(text: str) -> dict[str, set[str]]:
    """The values the text gives each scale; "don't like" is on the dislike end."""
    words = tokens(text)
    denied = negated(words)
    found: dict[str, set[str]] = {}
    for i, word in enumerate(words):
        if word == "like" and i and words[i - 1] in _LIKE_NOT_LIKING:
            continue  # "tastes like soap"
        if word in _POLE:
            scale, value = _POLE[word]
            if denied and scale == "liking":
                value = _FLIPPED[value]
            found.setdefault(scale, set()).add(value)
    return found


def opposite_guard(a: MemoryDraft, b: MemoryDraft) -> Guarded | None:
    """The other end of a scale both state, or one preference the other way round."""
    ours, theirs = _poles(a.text), _poles(b.text)
    for scale in ours.keys() & theirs.keys():
        if not ours[scale] & theirs[scale]:
            detail = f"{scale} {sorted(ours[scale])} vs {sorted(theirs[scale])}"
            return Guarded("opposite", detail, CONTRADICTION)
    words_a, words_b = content_words(a.text), content_words(b.text)
    compares = _COMPARING & set(tokens(a.text)) and _COMPARING & set(tokens(b.text))
    if compares and words_a != words_b and sorted(words_a) == sorted(words_b):
        return Guarded("opposite", "the same preference the other way round", CONTRADICTION)
    return None


# -- one word that carries the fact --------------------------------------------------------

# Words kept around a swapped word for the pair to be the same sentence but for it.
SLOT_FRAME = 3


def slot_guard(a: MemoryDraft, b: MemoryDraft) -> Guarded | None:
    """Relations or animals of one kind in one and of another in the other, in any two
    languages ("allergic to cats" / "allergique aux chiens"); or the same words in the same
    order but for one word that carries the fact (not a small word: "I'm" / "I am" is no
    other fact), or two for one with more kept around ("birthday" / "wedding anniversary")."""
    kin_a, kin_b = _mentions(a), _mentions(b)
    if kin_a and kin_b and not kin_a & kin_b:
        return Guarded("slot", f"{sorted(kin_a)} vs {sorted(kin_b)}", DISTINCT)
    if english(a.text) != english(b.text):
        return None  # two languages are never one sentence
    words_a, words_b = tokens(a.text), tokens(b.text)
    matcher = difflib.SequenceMatcher(a=words_a, b=words_b, autojunk=False)
    edits = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    if len(edits) != 1 or edits[0][0] != "replace":
        return None
    _, i1, i2, j1, j2 = edits[0]
    ours, theirs = words_a[i1:i2], words_b[j1:j2]
    kept = len(words_a) - len(ours)
    if i2 == len(words_a) and j2 == len(words_b):
        # The sentence's last words, its object: only what they carry counts, not their
        # small words ("peur de l'avion" / "peur des araignées").
        ours, theirs = _carrying(ours), _carrying(theirs)
    if sorted((len(ours), len(theirs))) not in ([1, 1], [1, 2]) or kept < SLOT_FRAME:
        return None
    if len(ours) + len(theirs) == 3 and kept < SLOT_FRAME + 1:
        return None
    if any(w in STOP_WORDS for w in ours + theirs) or "".join(ours) == "".join(theirs):
        return None  # a small word, or a spelling ("wifi" / "wi-fi")
    if any(spells_value(w) for w in ours + theirs):
        return None  # a value: `conflict` compares those ("two" / "2" is one)
    if {stem(w) for w in ours} & {stem(w) for w in theirs}:
        return None
    return Guarded("slot", f"{' '.join(ours)!r} vs {' '.join(theirs)!r}", DISTINCT)


# Of the words around two differing values, the share the memories must have in common for
# the values to fill one slot ("The trip is to Lisbon" / "... to Porto": all of them).
SAME_FRAME = 0.5


def _verdict(found: Conflict, a: MemoryDraft, b: MemoryDraft) -> str:
    """A contradiction is a new value for the same slot of the same subject: not when the
    memories are about different people, nor when the words around the values differ."""
    if found.kind == "people":
        return DISTINCT
    values = {w for value in found.ours | found.theirs for w in tokens(value)}
    frame_a, frame_b = _frame(a.text, values), _frame(b.text, values)
    fewer = min(len(frame_a), len(frame_b))
    if fewer and len(frame_a & frame_b) < SAME_FRAME * fewer:
        return DISTINCT
    return CONTRADICTION


def _frame(text: str, values: set[str]) -> set[str]:
    """The words that carry a memory's fact, less its values: the slot they fill."""
    return {w for w in content_words(text, values) if not spells_value(w)}


def _carrying(words: list[str]) -> list[str]:
    return [w for w in words if w not in STOP_WORDS] or words


def guard(
    existing: MemoryDraft, new: MemoryDraft, me: frozenset[str] = frozenset()
) -> Guarded | None:
    """The first guard that keeps `new` apart from `existing`, or None: they may be one.
    `me` are the person's own names (`actors.memory.owner`), if they gave one."""
    found = conflict(existing, new, me)
    if found is not None:
        which = "subject" if found.kind in ("people", "relation", "roles") else "slot"
        which = "negation" if found.kind == "negation" else which
        return Guarded(which, str(found), _verdict(found, existing, new))
    guarded = subject_guard(existing, new, me)
    for check in (negation_guard, opposite_guard, slot_guard):
        guarded = guarded or check(existing, new)
    return guarded
