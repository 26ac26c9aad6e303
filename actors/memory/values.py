"""The contradiction guard: two memories that give different values to the same thing.

"The trip is to Lisbon" and "The trip is to Porto" are as close as two fingerprints get,
and merging them would lose the one fact that matters. So before two memories are taken for
one, the values each states are pulled out of its text (numbers, times, dates, weekdays,
months, years, colours, relative ages, names of places and people) and compared kind by
kind: when both memories state values of one kind and neither set contains the other, they
disagree, and are never merged however close. A memory that only adds a value ("Owen
arrives Friday" / "Owen arrives Friday at 6pm") or drops one does not disagree.

Names are the capitalised words of the text, less the subject both memories share (the
people and themes both were given: "Owen" in "Owen lives in Bristol" / "Owen lives in
Leeds" is what they are about, "Bristol" and "Leeds" are the values). A sentence's first
word is capitalised anyway, so it only counts as a name when it is one of the memory's
people. The people lists themselves are values too: two memories about disjoint
people are about different things.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime

from actors.memory.times import agree, clock, spoken_times
from providers.stemming import stem
from storage.records import MemoryDraft

WEEKDAYS = {
    **dict.fromkeys(("monday", "mon", "lundi"), "mon"),
    **dict.fromkeys(("tuesday", "tue", "tues", "mardi"), "tue"),
    **dict.fromkeys(("wednesday", "wed", "mercredi"), "wed"),
    **dict.fromkeys(("thursday", "thu", "thurs", "jeudi"), "thu"),
    **dict.fromkeys(("friday", "fri", "vendredi"), "fri"),
    **dict.fromkeys(("saturday", "sat", "samedi"), "sat"),
    **dict.fromkeys(("sunday", "sun", "dimanche"), "sun"),
}
MONTHS = {
    **dict.fromkeys(("january", "jan", "janvier"), "01"),
    **dict.fromkeys(("february", "feb", "février", "fevrier"), "02"),
    **dict.fromkeys(("march", "mars"), "03"),
    **dict.fromkeys(("april", "apr", "avril"), "04"),
    **dict.fromkeys(("may", "mai"), "05"),
    **dict.fromkeys(("june", "jun", "juin"), "06"),
    **dict.fromkeys(("july", "jul", "juillet"), "07"),
    **dict.fromkeys(("august", "aug", "août", "aout"), "08"),
    **dict.fromkeys(("september", "sep", "sept", "septembre"), "09"),
    **dict.fromkeys(("october", "oct", "octobre"), "10"),
    **dict.fromkeys(("november", "nov", "novembre"), "11"),
    **dict.fromkeys(("december", "dec", "décembre", "decembre"), "12"),
}
# Short month forms double as ordinary words ("may", "march", "sun", "sat"...): they only
# count when capitalised, or next to a day number.
_AMBIGUOUS = frozenset({"may", "mar", "sun", "sat", "wed", "mon", "jan", "dec", "sept", "oct"})
NUMBER_WORDS = {
    "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13",
    "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18",
    "nineteen": "19", "twenty": "20", "thirty": "30", "forty": "40", "fifty": "50",
    "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90", "hundred": "100",
    "thousand": "1000", "dozen": "12", "douzaine": "12", "half": "0.5", "twice": "2",
    "deux": "2", "trois": "3", "quatre": "4", "cinq": "5", "sept": "7", "huit": "8",
    "neuf": "9", "dix": "10", "onze": "11", "douze": "12", "vingt": "20", "trente": "30",
    "quarante": "40", "cinquante": "50", "soixante": "60", "cent": "100", "mille": "1000",
}  # fmt: skip
ORDINALS = {
    "first": "1", "second": "2", "third": "3", "fourth": "4", "fifth": "5", "sixth": "6",
    "seventh": "7", "eighth": "8", "ninth": "9", "tenth": "10",
    "premier": "1", "première": "1", "deuxième": "2", "troisième": "3", "quatrième": "4",
    "cinquième": "5",
}  # fmt: skip
COLOURS = {
    **{c: c for c in ("red", "blue", "green", "yellow", "black", "white", "grey", "brown",
                      "pink", "purple", "orange", "silver", "gold", "beige")},
    "gray": "grey", "rouge": "red", "bleu": "blue", "bleue": "blue", "vert": "green",
    "verte": "green", "jaune": "yellow", "noir": "black", "noire": "black", "blanc": "white",
    "blanche": "white", "gris": "grey", "grise": "grey", "marron": "brown", "violet": "purple",
}  # fmt: skip
# Relative age, the one ordered attribute people state about family all the time.
AGES = {"younger": "younger", "youngest": "younger", "older": "older", "elder": "older",
        "eldest": "older", "oldest": "older", "cadet": "younger", "cadette": "younger",
        "aîné": "older", "aînée": "older"}  # fmt: skip
# Whose fact it is: "Léa works as a nurse" and "Léa's mother works as a nurse" share every
# word but one. A relation only counts when it is possessed ("Owen's dog", "my brother",
# "la sœur de Léa"), and relations are compared for equality, not inclusion.
RELATIONS = {
    **dict.fromkeys(("mother", "mum", "mom", "mère", "maman"), "mother"),
    **dict.fromkeys(("father", "dad", "père", "papa"), "father"),
    **dict.fromkeys(("parents",), "parents"),
    **dict.fromkeys(("brother", "frère"), "brother"),
    **dict.fromkeys(("sister", "sœur", "soeur"), "sister"),
    **dict.fromkeys(("husband", "mari"), "husband"),
    **dict.fromkeys(("wife", "femme"), "wife"),
    **dict.fromkeys(("partner", "boyfriend", "girlfriend", "compagnon", "compagne"), "partner"),
    **dict.fromkeys(("son", "fils"), "son"),
    **dict.fromkeys(("daughter", "fille"), "daughter"),
    **dict.fromkeys(("niece", "nièce"), "niece"),
    **dict.fromkeys(("nephew", "neveu"), "nephew"),
    **dict.fromkeys(("aunt", "tante"), "aunt"),
    **dict.fromkeys(("uncle", "oncle"), "uncle"),
    **dict.fromkeys(("cousin", "cousine"), "cousin"),
    **dict.fromkeys(
        ("grandmother", "grandma", "granny", "nan", "grand-mère", "mamie", "mémé"), "grandmother"
    ),
    **dict.fromkeys(
        ("grandfather", "grandad", "grandpa", "grand-père", "papi", "papy", "pépé"), "grandfather"
    ),
    **dict.fromkeys(("friend", "ami", "amie", "copain", "copine"), "friend"),
    **dict.fromkeys(("neighbour", "neighbor", "voisin", "voisine"), "neighbour"),
    **dict.fromkeys(("boss", "manager", "chef", "patron", "patronne"), "boss"),
    **dict.fromkeys(("colleague", "collègue"), "colleague"),
    **dict.fromkeys(("dog", "chien", "chienne"), "dog"),
    **dict.fromkeys(("cat", "chat", "chatte"), "cat"),
    **dict.fromkeys(("children", "kids", "enfants"), "children"),
}
TIME_WORDS = {"noon": "12:00", "midday": "12:00", "midnight": "00:00", "midi": "12:00",
              "minuit": "00:00"}  # fmt: skip

_WORD = r"[^\W\d_][\w'\u2019-]*"
_TIME = re.compile(
    r"\b(\d{1,2})(?:(?::|h|\.)(\d{2}))?\s*(a\.?m\.?|p\.?m\.?)(?!\w)"  # 3pm, 3:30 pm
    r"|\b(\d{1,2})(?::|\s?h\s?)(\d{2})\b"  # 15:30, 15h30, 7 h 40
    r"|\b(\d{1,2})\s?h\b",  # 15h, 20 h
    re.IGNORECASE,
)
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_NUMERIC_DATE = re.compile(r"\b(\d{1,2})/(\d{1,2})(?:/(\d{2,4}))?\b")
# A day of the month, in digits or as an ordinal word ("the first of May", "le premier mai").
_DAY = "(\\d{1,2}|" + "|".join(ORDINALS) + ")"
_DAY_MONTH = re.compile(rf"\b{_DAY}(?:st|nd|rd|th|er)?\s+(?:of\s+)?({_WORD})", re.I)
_MONTH_DAY = re.compile(rf"\b({_WORD})\s+(?:the\s+)?{_DAY}(?:st|nd|rd|th)?\b", re.I)
# 1,050 and 1 050 are one number (thousands grouped); 2.5 and 2,5 are one too.
_NUMBER = re.compile(
    r"(?<![\w.])(?:\d{1,3}(?:[,\u00a0\u202f ]\d{3})+(?![\d,.])|\d+(?:[.,]\d+)?)"
    r"(?:st|nd|rd|th|er|e|ème)?(?!\w)"
)
_WORDS = re.compile(_WORD)
# "Owen's dog", "la sœur de Léa": a relation possessed by a name, which the other memory
# must at least mention ("kin": the relation words anywhere in it). "my brother" is not
# counted (the owner's relations are what most memories are about), nor a relation that is
# named ("Hannah's neighbour Mr Okafor", "Owen's wife is called Nadia", "Priya is Hannah's
# boss"): there the name, not the relation, says who it is.
_POSSESSED = re.compile(
    rf"'s\s+(?=({_WORD}))|\b(?:le|la|les|l')\s*(?=({_WORD})\s+(?:de|d'|du)\b)",
    re.IGNORECASE,
)
_NAME_AFTER = re.compile(
    r"^[,:]?\s*(?:(?:is|are|was|were|est)\s+)?(?:(?:called|named)\s+)?([A-Z][\w-]*)"
)
_NAME_BEFORE = re.compile(r"([A-Z][\w-]*)\s+(?:is|was|,)\s+[\w'-]*$")
_SENTENCE_START = re.compile(r"(?:^|[.!?:;…\"“«(]\s*|\n\s*)$")
_CURLY = "\u2019"  # voice transcripts write a curly apostrophe
_FIRST_PERSON = frozenset({"i", "my", "me", "mine", "i'm", "je", "j", "mon", "ma", "mes", "moi"})
_NOT_NAMES = frozenset({"i", "i'm", "i'll", "i've", "i'd"})
_YEAR = re.compile(r"^(19|20)\d\d$")


@dataclass(frozen=True, slots=True)
class Conflict:
    """Both memories state a `kind` of value, and neither's values contain the other's."""

    kind: str
    ours: frozenset[str]
    theirs: frozenset[str]

    def __str__(self) -> str:
        return f"{self.kind} {sorted(self.ours)} vs {sorted(self.theirs)}"


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).replace(_CURLY, "'").strip().casefold()


def _words(items: tuple[str, ...]) -> set[str]:
    """Every word of a list of people or themes ("dr patel" -> dr, patel), case-folded,
    possessives dropped ("Hannah's" -> hannah)."""
    return {w.removesuffix("'s").strip("'") for item in items for w in _WORDS.findall(_fold(item))}


def values(
    draft: MemoryDraft,
    shared: frozenset[str] | set[str] = frozenset(),
    me: frozenset[str] = frozenset(),
) -> dict[str, frozenset[str]]:
    """The values `draft` states, by kind, leaving out the words of `shared`. A relation
    of the person's own (`me`: "Hannah's colleague") is theirs, as "my colleague" is."""
    text = spoken_times(unicodedata.normalize("NFKC", draft.text).replace(_CURLY, "'"))
    found: dict[str, set[str]] = {}

    def add(kind: str, value: str) -> None:
        found.setdefault(kind, set()).add(value)

    spans: list[tuple[int, int]] = []

    def taken(start: int, end: int) -> bool:
        return any(start < e and s < end for s, e in spans)

    for match in _TIME.finditer(text):
        add("time", _time(match))
        spans.append(match.span())
    for match in _ISO_DATE.finditer(text):
        if not taken(*match.span()):
            year, month, day = match.groups()
            add("date", f"{int(month):02d}-{int(day):02d}")
            add("month", f"{int(month):02d}")
            add("year", year)
            spans.append(match.span())
    for match in _NUMERIC_DATE.finditer(text):
        if not taken(*match.span()):
            day, month, year = match.groups()  # day first: the set is British and French
            add("date", f"{int(month):02d}-{int(day):02d}")
            add("month", f"{int(month):02d}")
            if year:
                add("year", year if len(year) == 4 else "20" + year)
            spans.append(match.span())
    day_month = [(m, m.group(1), m.group(2)) for m in _DAY_MONTH.finditer(text)]
    month_day = [(m, m.group(2), m.group(1)) for m in _MONTH_DAY.finditer(text)]
    for match, day, month in day_month + month_day:
        number = MONTHS.get(_fold(month).rstrip("."))
        if not day.isdigit() and not month[0].isupper() and _fold(month) in _AMBIGUOUS:
            continue  # "you may first call": no date
        day = day if day.isdigit() else ORDINALS[_fold(day)]
        if number is None or int(day) > 31 or taken(*match.span()):
            continue
        add("date", f"{number}-{int(day):02d}")
        add("month", number)
        spans.append(match.span())
    for match in _NUMBER.finditer(text):
        if taken(*match.span()):
            continue
        number = re.sub(r"(?:st|nd|rd|th|er|e|ème)$", "", match.group(0))
        if re.fullmatch(r"\d{1,3}(?:[,\u00a0\u202f ]\d{3})+", number):
            digits = re.sub(r"\D", "", number)
        else:
            digits = number.replace(",", ".")
        add("year" if _YEAR.match(digits) else "number", digits)

    people = _words(draft.people)
    for match in _WORDS.finditer(text):
        if taken(*match.span()):
            continue
        word = match.group(0)
        folded = _fold(word).strip("'-")
        day = singular_day(folded)
        if day in WEEKDAYS and (word[0].isupper() or day not in _AMBIGUOUS):
            add("weekday", WEEKDAYS[day])
        elif folded in MONTHS and (word[0].isupper() or folded not in _AMBIGUOUS):
            add("month", MONTHS[folded])
        elif folded in TIME_WORDS:
            add("time", TIME_WORDS[folded])
        elif folded in NUMBER_WORDS or folded in ORDINALS:
            add("number", NUMBER_WORDS.get(folded) or ORDINALS[folded])
        elif folded in COLOURS:
            add("colour", COLOURS[folded])
        elif folded in AGES:
            add("age", AGES[folded])
        elif word[0].isupper():
            starts = _SENTENCE_START.search(text[: match.start()]) is not None
            for part in word.split("-"):
                name = _fold(part).removesuffix("'s").strip("'")
                if not part[:1].isupper() or name in _NOT_NAMES or name in shared:
                    continue
                if starts and name not in people:
                    continue  # capitalised because it starts a sentence
                add("name", name)
    for match in _POSSESSED.finditer(text):
        word = match.group(1) or match.group(2)
        relation = RELATIONS.get(_fold(word).removesuffix("'s"))
        after = text[match.end() + len(word) :].lstrip("'s")
        before = text[: match.start()].rstrip()
        if not relation:
            continue
        named = _NAME_AFTER.match(after) or _NAME_BEFORE.search(before)
        if named is None:
            # "Hannah's colleague", "la collègue de Hannah": hers, as "my colleague" is.
            if not _owner(before if match.group(1) else after, me):
                add("relation", relation)
        else:  # "Hannah's brother Owen": who Owen is to her, a value of its own
            add("named", f"{_fold(named.group(1))}={relation}")
    for match in _WORDS.finditer(text):
        kin = RELATIONS.get(_fold(match.group(0)).removesuffix("'s").rstrip("'"))
        if kin is not None:
            add("kin", kin)
            if kin in ("mother", "father"):
                add("kin", "parents")
    for label, when in (("starts", draft.starts_at), ("due", draft.due_at)):
        if when is not None:
            add(label, _instant(when))
    return {kind: frozenset(v) for kind, v in found.items()}


def _time(match: re.Match[str]) -> str:
    """The time as `actors.memory.times` writes it: "7:30" and "19h" as said, "07:30" (a
    two-digit hour) and "7.30 pm" in their half of the day."""
    if match.group(1) is not None:
        hour, minute = int(match.group(1)), int(match.group(2) or 0)
        said = clock(hour, minute, match.group(3).replace(".", "").casefold())
    else:
        written = match.group(4) or match.group(6)
        hour, minute = int(written), int(match.group(5) or 0)
        said = clock(hour, minute, "am" if written.startswith("0") else None)
    return said or f"{hour:02d}:{minute:02d}"


def _instant(when: datetime) -> str:
    return when.isoformat()


def shared_subject(a: MemoryDraft, b: MemoryDraft) -> set[str]:
    """The words of the people and themes both memories were given: what they are about."""
    return (_words(a.people) | _words(a.themes)) & (_words(b.people) | _words(b.themes))


def _named_relations(found: dict[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """Who each named person is to the memory's owner ("owen" -> {"brother"})."""
    out: dict[str, set[str]] = {}
    for value in found.get("named", frozenset()):
        name, relation = value.split("=", 1)
        out.setdefault(name, set()).add(relation)
    return {name: frozenset(relations) for name, relations in out.items()}


# -- the same words, said the other way round ------------------------------------------------
#
# Two checks the values above cannot make, both on memories that use the same words: who
# does what to whom ("Maya owes Hannah £50" / "Hannah owes Maya £50"), and whether it is so
# at all ("Hannah's flat has a balcony" / "... has no balcony", "Hannah aime le café" /
# "n'aime pas le café"). A fingerprint barely sees either (cosines above 0.95); the words do.

# Negation words, English and French. "ne"/"n'" stands for the whole French negation, whose
# second half (pas, plus, jamais...) is dropped with it; "no longer" is one negation.
_NEGATIONS = frozenset({"not", "no", "never", "nor", "none", "nothing", "nobody", "ne", "n"})
_FRENCH_NEGATION_ENDS = frozenset({"pas", "plus", "jamais", "rien", "aucun", "aucune", "guère"})
# Words that take the place of a person already named (they follow who does what, so two
# sentences with the roles swapped differ in them too: "Farid lent Hannah his tent").
_PRONOUNS = frozenset(
    {"he", "she", "him", "her", "his", "hers", "they", "them", "their", "il", "elle", "lui",
     "son", "sa", "ses", "leur", "leurs"}
)  # fmt: skip
_TITLES = frozenset({"mr", "mrs", "ms", "miss", "dr", "m", "mme", "mlle", "prof"})
_TOKEN = re.compile(r"[^\W_]+")


def plain(text: str) -> str:
    """Case-folded, accents and curly quotes gone, "n't" spelled "not": the form in which
    two wordings are compared word by word ("Léa" and "Lea" are one word)."""
    text = unicodedata.normalize("NFKD", text.replace(_CURLY, "'"))
    text = "".join(c for c in text if not unicodedata.combining(c)).casefold()
    return spoken_times(re.sub(r"(?<=\w)n't\b", " not", text.replace("can't", "can not")))


def tokens(text: str) -> list[str]:
    """The words of `text` in its plain form, in order ("Hannah's" -> hannah, s)."""
    return _TOKEN.findall(plain(text))


def negated(words: list[str]) -> bool:
    """Does a sentence (its plain words) say "not"? Two negations are counted as one."""
    return any(w in _NEGATIONS for w in words)


def affirmed(words: list[str]) -> list[str]:
    """The words less those that only say "not" ("no longer sings" -> sings)."""
    french = "ne" in words or "n" in words
    out = []
    for i, word in enumerate(words):
        if word in _NEGATIONS or (french and word in _FRENCH_NEGATION_ENDS):
            continue
        if word == "longer" and i and words[i - 1] == "no":
            continue
        out.append(word)
    return out


# Words that state no fact of their own (articles and "every", auxiliaries, prepositions,
# pronouns), English and French: two wordings are compared on the rest.
_STOP_TEXT = """a an the this that these those it its is are was were be been being am do does did
    done has have had having will would shall should can could may might must to of in on at
    for with by from into onto about as and or but so than then there here very just also too
    i me my mine you your we our us he she him her his hers they them their s t every each
    le la les l un une des du de d et ou a au aux en dans sur pour par avec ce cet cette ces
    ca c est sont ete etre ai as avons avez ont va vont j je tu il elle ils elles nous vous
    on y se sa son ses leur leurs mon ma mes qui que qu chaque"""
STOP_WORDS = frozenset(_STOP_TEXT.split())


def content_words(text: str, leave_out: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The words that carry the fact, in order: plain, stemmed, without stop words,
    negations or the words of `leave_out` (names, say)."""
    return [stem(w) for w in affirmed(tokens(text)) if w not in STOP_WORDS and w not in leave_out]


def _plain_keys(*tables: dict[str, str]) -> dict[str, str]:
    return {plain(word): value for table in tables for word, value in table.items()}


# Words that only spell a value the guard compares ("two" and "2", "Friday" and "Fri"), and
# the one name of each relation ("mum" is "mother"): wording is compared past them.
_VALUE_WORDS = frozenset(_plain_keys(WEEKDAYS, MONTHS, NUMBER_WORDS, ORDINALS, TIME_WORDS))
_KIN = _plain_keys(RELATIONS)


# The memory types that ask for something to be done, and the words that only frame the
# doing ("remember to", "need to", "remind Hannah to", "penser à", "il faut"): in those,
# the action is the fact.
TODO_TYPES = frozenset({"task", "reminder"})
TODO_FRAMING = frozenset(
    {"remember", "remind", "need", "needs", "forget"}
    | {"penser", "pense", "oublier", "oublie", "faut"}
)


def fact_words(
    text: str, leave_out: frozenset[str] | set[str] = frozenset(), todo: bool = False
) -> list[str]:
    """`content_words` less numbers and the words of dates and times, with each relation
    under one name, and (`todo`: a task or reminder) less the words that frame the doing:
    what two wordings of one fact are compared on."""
    out = []
    for word in affirmed(tokens(text)):
        if word in STOP_WORDS or word in leave_out or spells_value(word):
            continue
        if todo and word in TODO_FRAMING:
            continue
        out.append(stem(_KIN.get(word, word)))
    return out


def spells_value(word: str) -> bool:
    """A number, or a word of a number, date or time: what `conflict` compares."""
    return singular_day(word) in _VALUE_WORDS or any(c.isdigit() for c in word)


def singular_day(word: str) -> str:
    """A weekday's full name without its plural ("Wednesdays", "les jeudis": each one);
    any other word as it is ("thus" is no Thursday)."""
    day = word.removesuffix("s")
    return day if day != word and len(day) >= 5 and day in WEEKDAYS else word


def _negation_flip(a: str, b: str) -> bool:
    """One memory says what the other denies: the same words but for a negation."""
    if negated(tokens(a)) == negated(tokens(b)):
        return False
    rest_a, rest_b = content_words(a), content_words(b)
    return bool(rest_a) and rest_a == rest_b


def capitalised(text: str) -> set[str]:
    """Words written with a capital inside a sentence (names, mostly), in their plain form."""
    text = unicodedata.normalize("NFKC", text).replace(_CURLY, "'")
    found = set()
    for match in _WORDS.finditer(text):
        word = match.group(0)
        if word[0].isupper() and _SENTENCE_START.search(text[: match.start()]) is None:
            found.update(tokens(word.removesuffix("'s")))
    return found - _NOT_NAMES


def roles(text: str, names: set[str]) -> tuple[list[str], list[frozenset[str]]]:
    """The sentence as a frame with a slot for each run of `names` ("Mr Okafor",
    "Ella and Sam" are one slot each), and who fills the slots, in order."""
    frame: list[str] = []
    slots: list[frozenset[str]] = []
    run: set[str] = set()
    for word in tokens(text):
        if word in names or (word in _TITLES and not run):
            run.add(word)
            continue
        if run and word in ("and", "et") and frame[-1:] != ["_"]:
            continue  # "Ella and Sam": still the same slot
        if run:
            frame.append("_")
            slots.append(frozenset(run - _TITLES))
            run = set()
        frame.append("him" if word in _PRONOUNS else word)
    if run:
        frame.append("_")
        slots.append(frozenset(run - _TITLES))
    return frame, slots


def _written(text: str, upper: bool) -> set[str]:
    """The plain forms of the words `text` writes with a capital (or without one)."""
    found: set[str] = set()
    for word in _WORDS.findall(unicodedata.normalize("NFKC", text).replace(_CURLY, "'")):
        if word[0].isupper() == upper:
            found.update(tokens(word))
    return found


def _roles_swapped(a: str, b: str) -> tuple[str, str] | None:
    """The same sentence with its people in other places: someone else does it to whom.
    Who the people are: words both write with a capital (even first in the sentence, as
    "Maya owes Hannah" starts) and neither writes in lower case. Gives who is where in
    each, when they differ."""
    names = _written(a, upper=True) & _written(b, upper=True)
    names -= _written(a, upper=False) | _written(b, upper=False) | _NOT_NAMES | {"s"}
    if len(names) < 2:
        return None
    (frame_a, slots_a), (frame_b, slots_b) = roles(a, names), roles(b, names)
    if (
        frame_a != frame_b
        or slots_a == slots_b
        or sorted(map(sorted, slots_a)) != sorted(map(sorted, slots_b))
    ):
        return None
    return _order(slots_a), _order(slots_b)


_DE = re.compile(r"^\s*(?:de|d')\s*(" + _WORD + ")", re.IGNORECASE)


def _owner(around: str, me: frozenset[str]) -> bool:
    """Whether who owns a relation is one of the person's own names: the word before an
    English "'s" (`around` is the text before it), or after a French "de" (the text after
    the relation)."""
    french = _DE.match(around)
    words = [french.group(1)] if french else _WORDS.findall(_fold(around))[-1:]
    return any(plain(w).removesuffix("'s") in me for w in words)


def _order(slots: list[frozenset[str]]) -> str:
    return " > ".join(" & ".join(sorted(slot)) for slot in slots)


# The kinds in the order a conflict is reported (the first found wins).
KINDS = (
    "people", "starts", "due", "date", "time", "weekday", "month", "year", "number", "colour",
    "age", "name",
)  # fmt: skip


def conflict(a: MemoryDraft, b: MemoryDraft, me: frozenset[str] = frozenset()) -> Conflict | None:
    """How `a` and `b` disagree, or None if they state no differing values of one kind.
    `me` are the person's own names (`actors.memory.owner`): every memory of theirs is
    about them, said or not."""
    people_a = frozenset(_fold(p) for p in a.people)
    people_b = frozenset(_fold(p) for p in b.people)
    if people_a and people_b and not people_a & people_b:
        return Conflict("people", people_a, people_b)
    # Someone one memory is about, whom the other does not even mention: another fact.
    for one, other in ((a, b), (b, a)):
        mentioned = _words(other.people) | _words((other.text,)) | me
        if mentioned & _FIRST_PERSON:
            continue  # "my brother": the owner is there, by a name the server may not know
        for person in one.people:
            if not _words((person,)) & mentioned:
                return Conflict("people", frozenset(one.people), frozenset(other.people))
    swapped = _roles_swapped(a.text, b.text)
    if swapped is not None:
        return Conflict("roles", frozenset({swapped[0]}), frozenset({swapped[1]}))
    if _negation_flip(a.text, b.text):
        return Conflict("negation", frozenset({a.text}), frozenset({b.text}))
    shared = shared_subject(a, b)
    ours, theirs = values(a, shared, me), values(b, shared, me)
    # Whose fact: a relation one memory states must at least be mentioned by the other.
    none: frozenset[str] = frozenset()
    relations = ours.get("relation", none), theirs.get("relation", none)
    if not relations[0] <= theirs.get("kin", none) or not relations[1] <= ours.get("kin", none):
        return Conflict("relation", *relations)
    named = _named_relations(ours), _named_relations(theirs)
    for name in named[0].keys() & named[1].keys():
        if named[0][name] != named[1][name]:
            return Conflict("relation", named[0][name], named[1][name])
    for kind in KINDS[1:]:
        x, y = ours.get(kind), theirs.get(kind)
        if kind == "time" and x and y:
            x, y = agree(x, y)  # "7:30" is 07:30 or 19:30, whichever the other says
        if kind == "name" and x and y:
            # A name the other memory says too, even where it starts a sentence, is shared;
            # accents aside, as a name keeps them in one language only ("Crete", "Crète").
            x = frozenset(plain(v) for v in x) - {plain(w) for w in _words((b.text,))}
            y = frozenset(plain(v) for v in y) - {plain(w) for w in _words((a.text,))}
        if x and y and not (x <= y or y <= x):
            return Conflict(kind, x, y)
    return None
