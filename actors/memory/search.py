"""Search by meaning: what answers "what do you know about Owen?".

One search serves the model's `search_memories` tool, `GET /v1/memories/search` and
`stillhere memory search`. A memory is found three ways, and `why` says which:

- **meaning**: the fingerprint index's closest memories to the query, scored by the cosine
  the judge trusts for that pair of texts (with the local pair: MiniLM's between two English
  texts, the multilingual model's otherwise, so a French query finds English memories);
- **names**: a query that names a person or a theme set on memories finds every active one
  set with it, however far its wording (a bonus on top of its meaning);
- **links**: one hop from each hit along its links (a contradiction, a correction, a related
  memory) brings the memory at the other end, with `via` naming the link. An erroneous
  memory comes only with the memory that corrects it, and is marked so.

Only the person's own memories are ever read. Muted and forgotten ones never appear: the
index and the name look-up hold active memories only, and a link never brings a muted one.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any
from uuid import UUID

import numpy as np

from providers.embedding import Embedder, EmbeddingError
from providers.multilingual import Paired
from storage.records import Memory, MemoryLink
from storage.text import text_fault

# What a name adds to a memory's meaning: a person or theme named in the query lifts every
# memory set with it above memories merely close in wording. With a theme's at 0.15, the
# eval's theme queries had a recall@5 of 0.95 instead of 1.0 (docs/memories.md).
PERSON_WEIGHT = 0.35
THEME_WEIGHT = 0.3
# Below this score (meaning plus names) a memory is no result: a query about nothing the
# person said finds nothing rather than the least unrelated. On the eval's corpus the
# weakest right answer by meaning alone scored 0.22, unrelated memories mostly under 0.1
# (docs/memories.md, "The floor").
RELEVANCE_FLOOR = 0.15
CANDIDATES = 32  # the index's closest memories per query view, before ranking
NAMED_ROWS = 100  # memories a name may bring, at most
NEIGHBOURS_PER_HIT = 3
FOLLOWED = ("contradicts", "corrects", "related")  # merges and "distinct" are bookkeeping
LINKED_STATUSES = ("active", "done")
MIN_NAME_CHARS = 2
MAX_QUERY_CHARS = 1000  # a question, not a document: longer is a mistake, not a search
_WORD = re.compile(r"[^\W_]+")
_SQRT2 = float(np.sqrt(2.0))


@dataclass(frozen=True, slots=True)
class Via:
    """How a memory came along: `link`, from the hit `through`."""

    link: MemoryLink
    through: UUID

    def wire(self) -> dict[str, Any]:
        return {
            "kind": self.link.kind,
            "source": str(self.link.source),
            "target": str(self.link.target),
            "through": str(self.through),
        }


@dataclass(frozen=True, slots=True)
class Found:
    """A search result: its score (a linked memory takes its hit's), and what made it."""

    memory: Memory
    score: float
    why: str
    via: Via | None = None

    def wire(self) -> dict[str, Any]:
        return {
            "memory": self.memory.wire(),
            "score": round(self.score, 4),
            "why": self.why,
            "via": self.via.wire() if self.via else None,
        }


class BadQuery(ValueError):
    """A query that cannot be searched; the message says why, naming the field."""


def query_text(value: object, field: str = "query") -> str:
    """A search's query, checked alike whichever way it came in (HTTP, the model, CLI)."""
    fault = text_fault(value, field)
    if fault is not None:
        raise BadQuery(fault)
    if len(value) > MAX_QUERY_CHARS:
        raise BadQuery(f"{field} is limited to {MAX_QUERY_CHARS} characters")
    return value.strip()


def query_limit(value: object, most: int) -> int:
    """A search's limit, checked alike whichever way it came in (HTTP, the model)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise BadQuery(f"limit must be an integer from 1 to {most}")
    return value


def name_words(query: str) -> list[str]:
    """The words and two-word phrases of `query` that could be a person or a theme set on a
    memory (those are lowercase, as the model sets them), also without accents, and plurals
    also singular."""
    words = [w for w in _WORD.findall(query.lower()) if len(w) >= MIN_NAME_CHARS]
    names = dict.fromkeys(words)
    names.update((_unaccented(w), None) for w in words)  # "Zoé" finds a memory set with "zoe"
    names.update((w[:-1], None) for w in words if len(w) > 3 and w.endswith("s"))
    names.update((f"{a} {b}", None) for a, b in pairwise(words))
    return list(names)


def _unaccented(word: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c))


class Meaning:
    """How close in meaning a memory is to the query, from their fingerprints.

    One model: its cosine. The local pair: the multilingual model's cosine alone, one scale
    for every pair of languages (MiniLM reads English only, so the pair's mean, or the
    judge's choice of model, puts a French memory behind English near-misses). Measured by
    `stillhere eval search` over the labelled corpus (docs/memories.md): cross-language
    MRR 0.96 by the multilingual cosine, 0.79 by the judge's, 0.68 by the mean; the other
    kinds alike. So a query is embedded by the multilingual model alone, which halves its
    cost, and the index is looked up by the multilingual half of each fingerprint.
    """

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self._split = embedder.parts[0].dim if isinstance(embedder, Paired) else 0

    async def embed(self, query: str) -> np.ndarray:
        """The query's vector to look the index up with, shaped as the embedder's
        fingerprints: with a pair, the multilingual model's unit vector in its half and the
        other half zero, so the index ranks by the multilingual cosine, which is all `score`
        reads. Raises EmbeddingError."""
        if not self._split:
            return await _one(self._embedder, query)
        vector = np.zeros(self._embedder.dim, dtype=np.float32)
        vector[self._split :] = await _one(self._embedder.parts[1], query)
        return vector

    def score(self, vector: np.ndarray, stored: np.ndarray) -> float:
        # Each half of a paired fingerprint is scaled by 1/sqrt(2) (`Paired`), and the
        # query's other half is zero: sqrt(2) times their dot is the multilingual cosine.
        dot = float(np.dot(vector, stored))
        return dot * _SQRT2 if self._split else dot


async def _one(embedder: Embedder, text: str) -> np.ndarray:
    vectors = await embedder.embed([text])
    if vectors.shape != (1, embedder.dim):
        raise EmbeddingError("bad_response", f"embedder gave shape {vectors.shape}")
    return vectors[0]


def rank(
    query: str,
    vector: np.ndarray,
    meaning: Meaning,
    candidates: Sequence[Memory],
    fingerprints: dict[UUID, np.ndarray],
    limit: int,
) -> list[Found]:
    """The `limit` best of `candidates` by meaning plus names, best first, none below
    RELEVANCE_FLOOR."""
    names = set(name_words(query))
    scored = []
    for memory in dict((m.id, m) for m in candidates).values():
        if memory.status != "active":
            continue
        stored = fingerprints.get(memory.id)
        close = None if stored is None else meaning.score(vector, stored)
        found = _scored(memory, close, names)
        if found.score >= RELEVANCE_FLOOR:
            scored.append(found)
    scored.sort(key=lambda f: f.score, reverse=True)
    return scored[:limit]


def _scored(memory: Memory, meaning: float | None, names: set[str]) -> Found:
    people = [p for p in memory.people if p.lower() in names]
    themes = [t for t in memory.themes if t.lower() in names]
    score = (meaning or 0.0) + PERSON_WEIGHT * bool(people) + THEME_WEIGHT * bool(themes)
    why = [f"meaning {meaning:.2f}" if meaning is not None else "no fingerprint"]
    why += [f"person {p}" for p in people] + [f"theme {t}" for t in themes]
    return Found(memory, score, ", ".join(why))


def with_neighbours(
    hits: list[Found], neighbours: Sequence[tuple[MemoryLink, Memory]]
) -> list[Found]:
    """Each hit followed by the memories one link away from it that may come along."""
    shown = {f.memory.id for f in hits}
    results = []
    for hit in hits:
        results.append(hit)
        brought = 0
        for link, other in neighbours:
            if brought == NEIGHBOURS_PER_HIT or hit.memory.id not in (link.source, link.target):
                continue
            if other.id in shown or not _may_come(link, other, hit.memory):
                continue
            shown.add(other.id)
            brought += 1
            why = _linked_why(link, other, hit.memory)
            results.append(Found(other, hit.score, why, Via(link, hit.memory.id)))
    return results


def _may_come(link: MemoryLink, other: Memory, hit: Memory) -> bool:
    """Muted never; erroneous only from the memory that corrects it."""
    if link.kind not in FOLLOWED:
        return False
    if other.status == "erroneous":
        return link.kind == "corrects" and link.source == hit.id and other.corrected_by == hit.id
    return other.status in LINKED_STATUSES


def _linked_why(link: MemoryLink, other: Memory, hit: Memory) -> str:
    if other.status == "erroneous":
        return f'erroneous, corrected by "{_brief(hit.text)}"'
    return f'linked to "{_brief(hit.text)}" ({link.kind})'


def _brief(text: str, chars: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else flat[: chars - 1].rstrip() + "…"
