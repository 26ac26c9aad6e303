"""Recognising a memory that is already there: the rule, apart from any storage.

Nobody says the same thing twice in the same words, so one threshold cannot do: high
enough to refuse false twins, it refuses natural rewordings too. Two tiers instead:

- `close`: cosine at or above `high`: a near copy or a tight paraphrase;
- `shared`: cosine in `[low, high)`, and the two memories have the same type and share at
  least one person or theme (set by the model when each memory was made, so two unrelated
  Owens do not share one).

Whatever the score, two memories that state different values about one thing are never
the same (`actors.memory.values`): the new one is stored, and linked to the other as a
possible contradiction for the person to settle.

The thresholds depend on the embedding model (cosines of a 384-dimension local model and
of a 1536-dimension API model are not on one scale), so they are looked up by model name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from actors.memory.values import Conflict, conflict
from storage.records import Memory, MemoryDraft


@dataclass(frozen=True, slots=True)
class Thresholds:
    high: float = 0.85
    low: float = 0.70

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(f"thresholds need 0 <= low <= high <= 1, not {self}")


SEED = Thresholds(0.85, 0.70)
# Measured with `stillhere eval dedup` on tests/data/dedup_pairs.jsonl (182 pairs): for
# all-MiniLM-L6-v2, 0.87/0.73 is the pair with the best recall at the best precision the
# model reaches there (precision 0.83, recall 0.81; the seed's 0.85/0.70 gives 0.79/0.81).
THRESHOLDS: dict[str, Thresholds] = {
    "all-MiniLM-L6-v2": Thresholds(0.87, 0.73),
}


def thresholds_for(model: str, overrides: dict[str, Thresholds] | None = None) -> Thresholds:
    """The pair for `model`: an override, else the measured table, else the seed's pair."""
    return (overrides or {}).get(model) or THRESHOLDS.get(model) or SEED


@dataclass(frozen=True, slots=True)
class Candidate:
    """A stored memory, and how close its fingerprint is to the new one's."""

    memory: Memory
    score: float


@dataclass(frozen=True, slots=True)
class Match:
    """The new memory is `existing`, by `tier` (exact, close or shared)."""

    existing: Memory
    tier: str
    score: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """What recognition decided: a match, or a new memory (with what it contradicts)."""

    match: Match | None
    contradicts: tuple[tuple[Memory, Conflict], ...] = ()


def shares_subject(a: MemoryDraft, b: MemoryDraft) -> bool:
    """At least one person or theme in common (compared case-folded)."""
    ours = {x.casefold().strip() for x in (*a.people, *a.themes)}
    theirs = {x.casefold().strip() for x in (*b.people, *b.themes)}
    return bool(ours & theirs - {""})


def tier(new: MemoryDraft, existing: MemoryDraft, score: float, t: Thresholds) -> str | None:
    """The tier by which `new` would be `existing`, before the contradiction guard."""
    if score >= t.high:
        return "close"
    if score >= t.low and new.type == existing.type and shares_subject(new, existing):
        return "shared"
    return None


def same_text(a: str, b: str) -> bool:
    """Equal but for case, spacing and punctuation: a verbatim restatement."""
    return _bare(a) == _bare(b)


def _bare(text: str) -> str:
    return " ".join("".join(c if c.isalnum() else " " for c in text.casefold()).split())


def recognise(new: MemoryDraft, candidates: Iterable[Candidate], t: Thresholds) -> Verdict:
    """Decide whether `new` is one of `candidates` (best score first wins).

    A candidate that would match but disagrees on a value is recorded as a contradiction
    and skipped: a lower one may still be the memory (the other side of an old
    contradiction, say)."""
    contradicts: list[tuple[Memory, Conflict]] = []
    for candidate in sorted(candidates, key=lambda c: -c.score):
        existing = candidate.memory
        found = "exact" if same_text(new.text, existing.text) else None
        found = found or tier(new, existing.draft, candidate.score, t)
        if found is None:
            continue
        disagreement = conflict(existing.draft, new)
        if disagreement is not None:
            contradicts.append((existing, disagreement))
            continue
        return Verdict(Match(existing, found, candidate.score), tuple(contradicts))
    return Verdict(None, tuple(contradicts))
