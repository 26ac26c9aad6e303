"""Shared by the memory tests: a keeper on a real PostgreSQL, fingerprinted by the fake
embeddings server over real HTTP with scripted cosines, or by the real local MiniLM.

The fake gives every text its own random direction; a test that needs two texts at a
chosen cosine scripts it: `script.close_to(base, text, 0.78)` makes `text` lie at exactly
that cosine from `base` (each scripted text gets an axis of its own, so texts scripted
against different bases stay apart).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator

import numpy as np
import pytest

from actors.clock import ManualClock
from actors.memory.judging import OneModel
from actors.memory.keeper import MemoryKeeper
from actors.memory.recognition import Thresholds
from providers.embedding import OpenAIEmbeddings
from storage.memories import MemoryStore
from storage.store import Store
from tests.fakes import embeddings_server
from tests.fakes.embeddings_server import FakeEmbeddings

DIM = 64
MODEL = "fake-embed"


class Script:
    """Texts with chosen cosines, for the fake embeddings server."""

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self._vectors: dict[str, np.ndarray] = {}
        self._axes = 0
        self._original = embeddings_server.vector_for

    def _axis(self) -> np.ndarray:
        vector = np.zeros(self.dim)
        vector[self._axes] = 1.0
        self._axes += 1
        return vector

    def base(self, text: str) -> None:
        if text not in self._vectors:
            self._vectors[text] = self._axis()

    def close_to(self, base: str, text: str, cosine: float) -> None:
        self.base(base)
        own = self._axis()
        self._vectors[text] = cosine * self._vectors[base] + math.sqrt(1 - cosine**2) * own

    def vector_for(self, text: str, dim: int) -> np.ndarray:
        if text in self._vectors:
            return self._vectors[text]
        return self._original(text, dim)


def scripted(monkeypatch: pytest.MonkeyPatch) -> Script:
    """Script the fake embeddings server's vectors for this test."""
    script = Script()
    monkeypatch.setattr(embeddings_server, "vector_for", script.vector_for)
    return script


@contextlib.asynccontextmanager
async def fake_server() -> AsyncIterator[FakeEmbeddings]:
    async with FakeEmbeddings(dim=DIM) as fake:
        yield fake


async def open_memory(
    dsn: str, url: str, clock: ManualClock, **options: object
) -> tuple[Store, MemoryKeeper]:
    """A migrated database and a keeper on it, fingerprinting through `url`."""
    store = await Store.open(dsn)
    embedder = OpenAIEmbeddings(url, MODEL, dim=DIM)
    options.setdefault("judge", OneModel(MODEL, Thresholds(0.85, 0.70)))
    keeper = MemoryKeeper(await MemoryStore.open(dsn), embedder, clock, **options)  # type: ignore[arg-type]
    return store, keeper


async def close_memory(store: Store, keeper: MemoryKeeper) -> None:
    await keeper.close()
    await keeper.store.close()
    await keeper.embedder.close()
    await store.close()
