"""Which cosine decides: one model's, or, with paired fingerprints, MiniLM's between English
memories and the multilingual model's otherwise, each against its own thresholds."""

from __future__ import annotations

import numpy as np
import pytest

from actors.memory.judging import ByLanguage, OneModel, judge_for
from actors.memory.language import english
from actors.memory.recognition import THRESHOLDS, Thresholds
from providers.multilingual import Paired


class Fixed:
    """An embedder of known name and size (never asked to embed here)."""

    def __init__(self, name: str, dim: int) -> None:
        self.name, self.dim = name, dim

    async def embed(self, texts: list[str]) -> np.ndarray:
        raise AssertionError("not used")

    async def close(self) -> None:
        pass


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


@pytest.mark.parametrize(
    ("text", "is_english"),
    [
        ("My brother Owen lives in Bristol.", True),
        ("Léa is moving to Montreal in the autumn.", True),  # an accent in a name
        ("Dinner at Léa's on Saturday at 8pm.", True),
        ("Call Ma on Sunday at 5 o'clock.", True),  # "ma", "o": English words too
        ("Owen, Bristol, Saturday", True),  # no function word at all
        ("Mon frère Owen habite à Bristol.", False),
        ("Hannah a peur de l'avion.", False),
        ("L'anniversaire de Maya est le 12 juin.", False),
        ("Hannah ne mange pas de viande.", False),
        ("Mi hermano vive en Bristol con su perro.", False),
        ("Mein Bruder wohnt in Bristol und ist Arzt.", False),
        ("Owen arbeitet in einem Labor.", False),
        ("Owen lavora in un laboratorio di Bristol.", False),
        ("O Owen trabalha num laboratório em Bristol.", False),
        ("Dinner with Ana de Armas on Friday.", True),  # a name's "de"
        ("Buy a von Trapp DVD for Maya.", True),
    ],
)
def test_english_is_told_by_its_function_words(text: str, is_english: bool) -> None:
    assert english(text) is is_english


def test_one_model_judges_by_its_cosine_and_thresholds() -> None:
    judge = judge_for(Fixed("api-model", 2))
    assert isinstance(judge, OneModel) and judge.thresholds == {"api-model": Thresholds()}
    judged = judge.judge("a", unit(1, 0), "b", unit(1, 1))
    assert judged.score == pytest.approx(0.7071, abs=1e-4) and judged.model == "api-model"
    assert judge.floor == Thresholds().low


def test_paired_fingerprints_are_judged_by_language() -> None:
    paired = Paired(Fixed("all-MiniLM-L6-v2", 2), Fixed("use-multilingual-v3", 2))
    judge = judge_for(paired)
    assert isinstance(judge, ByLanguage)
    assert judge.thresholds == {
        "all-MiniLM-L6-v2": THRESHOLDS["all-MiniLM-L6-v2"],
        "use-multilingual-v3": THRESHOLDS["use-multilingual-v3"],
    }
    # Two paired vectors whose first halves agree and whose second halves do not.
    a = np.concatenate([unit(1, 0), unit(1, 0)]) / np.sqrt(2)
    b = np.concatenate([unit(1, 0), unit(0, 1)]) / np.sqrt(2)
    both = judge.judge("Owen works in a lab.", a, "Owen is in the lab.", b)
    assert (both.model, both.thresholds) == ("all-MiniLM-L6-v2", THRESHOLDS["all-MiniLM-L6-v2"])
    assert both.score == pytest.approx(1.0)
    across = judge.judge("Owen works in a lab.", a, "Owen travaille dans un labo.", b)
    assert across.model == "use-multilingual-v3" and across.score == pytest.approx(0.0)
    assert across.thresholds == THRESHOLDS["use-multilingual-v3"]
    # The index ranks by the mean of both cosines; the floor lets a pair through whose
    # other model scores it near zero.
    assert float(a @ b) == pytest.approx(0.5)
    assert judge.floor == pytest.approx(THRESHOLDS["use-multilingual-v3"].low / 2)


def test_an_override_replaces_every_models_thresholds() -> None:
    paired = Paired(Fixed("all-MiniLM-L6-v2", 2), Fixed("use-multilingual-v3", 2))
    t = Thresholds(0.9, 0.8)
    assert set(judge_for(paired, t).thresholds.values()) == {t}


def test_the_multilingual_model_vouches_only_for_english_pairs_it_finds_close() -> None:
    paired = Paired(Fixed("all-MiniLM-L6-v2", 2), Fixed("use-multilingual-v3", 2))
    judge = judge_for(paired)
    close = np.concatenate([unit(1, 0), unit(1, 0)]) / np.sqrt(2)
    far = np.concatenate([unit(1, 0.1), unit(1, 0.6)]) / np.sqrt(2)  # USE: cosine 0.86
    farther = np.concatenate([unit(1, 0.1), unit(1, 1)]) / np.sqrt(2)  # USE: cosine 0.71
    assert judge.judge("Owen lives in Bristol.", close, "Owen's home is Bristol.", far).vouched
    assert not judge.judge("Owen lives in Bristol.", close, "Owen is in Bristol.", farther).vouched
    # Across languages USE decides already: there is no second reader.
    assert not judge.judge("Owen lives in Bristol.", close, "Owen habite à Bristol.", far).vouched
    assert not judge_for(Fixed("api-model", 2)).judge("a", unit(1, 0), "b", unit(1, 0)).vouched
