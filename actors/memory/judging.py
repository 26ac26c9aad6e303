"""Which cosine decides whether two memories are one, and against which thresholds.

With one model, that is the cosine of the two fingerprints, held to the model's measured
thresholds. With the local default's paired fingerprints (`providers.multilingual.Paired`),
all-MiniLM-L6-v2 judges two English memories, which it separates finely, and the
multilingual model judges every other pair, since MiniLM reads only English: "Owen works in
a lab." / "Owen travaille dans un laboratoire." is 0.34 by MiniLM, 0.93 by USE. Each
model's cosine is held to that model's own thresholds. Between two English memories the
multilingual model reads the pair too: when it finds them close by its own `high`, it vouches
for a restatement whose words say more than a word traded (`actors.memory.recognition`).

Which texts are English: `actors.memory.language`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from actors.memory.language import english
from actors.memory.recognition import Judged, Thresholds, thresholds_for
from providers.embedding import Embedder
from providers.multilingual import Paired


class Judge(Protocol):
    """Turns two memories' texts and fingerprints into the score that decides."""

    def judge(self, a: str, va: np.ndarray, b: str, vb: np.ndarray) -> Judged: ...

    def describe(self) -> str: ...

    @property
    def thresholds(self) -> dict[str, Thresholds]:
        """Each judging model's thresholds, by model name."""
        ...

    @property
    def floor(self) -> float:
        """The lowest fingerprint inner product any pair can be recognised at (the
        consolidation pass looks at neighbours above it)."""
        ...


@dataclass(frozen=True, slots=True)
class OneModel:
    """One model's cosine, its thresholds."""

    model: str
    pair: Thresholds

    def judge(self, a: str, va: np.ndarray, b: str, vb: np.ndarray) -> Judged:
        return Judged(float(np.dot(va, vb)), self.model, self.pair)

    def describe(self) -> str:
        return f"{self.model} {_pair(self.pair)}"

    @property
    def thresholds(self) -> dict[str, Thresholds]:
        return {self.model: self.pair}

    @property
    def floor(self) -> float:
        return self.pair.low


@dataclass(frozen=True, slots=True)
class ByLanguage:
    """Paired fingerprints: the English model's cosine for two English texts, the
    multilingual model's for any other pair."""

    paired: Paired
    english_t: Thresholds
    other_t: Thresholds

    def judge(self, a: str, va: np.ndarray, b: str, vb: np.ndarray) -> Judged:
        part = self.paired.part
        both_english = english(a) and english(b)
        which, t = (0, self.english_t) if both_english else (1, self.other_t)
        score = float(np.dot(part(va, which), part(vb, which)))
        # The second reader: only MiniLM's pairs have one (it cannot read the others).
        vouched = both_english and float(np.dot(part(va, 1), part(vb, 1))) >= self.other_t.high
        return Judged(score, self.paired.parts[which].name, t, vouched)

    @property
    def thresholds(self) -> dict[str, Thresholds]:
        first, second = (p.name for p in self.paired.parts)
        return {first: self.english_t, second: self.other_t}

    def describe(self) -> str:
        first, second = (p.name for p in self.paired.parts)
        return (
            f"{first} {_pair(self.english_t)} between English memories, "
            f"{second} {_pair(self.other_t)} otherwise"
        )

    @property
    def floor(self) -> float:
        # The paired inner product is the mean of both cosines, and the model that does
        # not decide may score a pair near zero: half the lower threshold is the floor.
        return min(self.english_t.low, self.other_t.low) / 2


def judge_for(embedder: Embedder, override: Thresholds | None = None) -> Judge:
    """The judge for `embedder`'s fingerprints; `override` replaces every measured pair."""
    if isinstance(embedder, Paired):
        first, second = (override or thresholds_for(p.name) for p in embedder.parts)
        return ByLanguage(embedder, first, second)
    return OneModel(embedder.name, override or thresholds_for(embedder.name))


def _pair(t: Thresholds) -> str:
    worded = "" if t.worded is None else f", worded alike {t.worded:.2f}"
    return f"(close {t.high:.2f}, shared {t.low:.2f}{worded})"
