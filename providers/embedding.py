"""The embedder port: what long-term memory needs from any embedding model, and a client for
OpenAI-compatible embeddings APIs.

A fingerprint is only comparable with fingerprints made by the same model, so every embedder
has a `name` that is stored beside each fingerprint, and a `dim` that every row it returns
has. Rows come back L2-normalised so that cosine similarity is a plain dot product, which is
what a faiss inner-product index computes; an API that returns raw vectors is normalised here
rather than trusted.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Any, Protocol

import aiohttp
import numpy as np
import orjson

from providers.http import ApiClient, excerpt

# One embeddings API call, in all: the back-fill pass and a search wait this long at most.
DEFAULT_TIMEOUT_S = 30.0

# Below this norm a vector has no direction: normalising it would turn noise into a
# fingerprint that matches anything.
_MIN_NORM = 1e-12


class EmbeddingError(Exception):
    """An embedding could not be made.

    `code` is stable and short (`connect`, `timeout`, `http_429`, `bad_response`,
    `weights_missing`, ...) so logs and the back-fill pass can tell failures apart without
    parsing the message.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Embedder(Protocol):
    """Anything that turns texts into fingerprints of one model.

    `name` is the model's name, stored beside each fingerprint so that fingerprints of
    different models are never compared. `dim` is the length of every row `embed` returns.
    """

    name: str
    dim: int

    async def embed(self, texts: list[str]) -> np.ndarray:
        """One float32 row per text, shape `(len(texts), dim)`, each row of L2 norm 1."""
        ...

    async def close(self) -> None: ...


class LocalEmbedder(ABC):
    """An embedder computed in this process, in a worker thread, so that the event loop
    never waits on a forward pass (numpy releases the GIL while it multiplies)."""

    name: str
    dim: int

    async def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return await asyncio.to_thread(self.embed_sync, list(texts))

    async def warm(self) -> None:
        """Load the weights now rather than on the first fingerprint."""
        await asyncio.to_thread(self.load)

    @abstractmethod
    def embed_sync(self, texts: list[str]) -> np.ndarray:
        """`embed` in the calling thread, for code already off the event loop."""

    @abstractmethod
    def load(self) -> None:
        """Load the weights in this thread (a no-op once loaded)."""


def normalise_rows(matrix: np.ndarray) -> np.ndarray:
    """Scale each row to L2 norm 1, as float32; raise `ValueError` for a row with no length.

    Shared by the embedders so that "normalised" means the same thing for all of them.
    """
    rows = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    if rows.size and float(norms.min()) < _MIN_NORM:
        raise ValueError("a vector of length zero cannot be normalised")
    return np.ascontiguousarray(rows / norms, dtype=np.float32)


class OpenAIEmbeddings:
    """An `Embedder` backed by any OpenAI-compatible `POST {url}/embeddings` endpoint.

    OpenAI, Ollama, vLLM and llama.cpp all speak this format. Texts are sent in batches of
    `batch_size` (some local servers refuse large inputs), one batch at a time so that a
    local server is not flooded. `dim` is learned from the first answer when not given, and
    every later answer must keep it: a model swapped behind the URL would otherwise mix
    incomparable fingerprints in one index.
    """

    def __init__(
        self,
        url: str,
        model: str,
        key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        dim: int | None = None,
        batch_size: int = 64,
    ) -> None:
        if dim is not None and dim <= 0:
            raise ValueError(f"dim must be positive, not {dim}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, not {batch_size}")
        self.name = model
        self.label = f"openai-compatible embeddings {model} at {url}"
        # 0 until the first answer says how long the model's vectors are.
        self.dim = dim or 0
        self._model = model
        self._batch_size = batch_size
        # One total timeout per request: an embedding answer is not streamed, so there is
        # no long-but-alive case to allow for.
        timeout_ = aiohttp.ClientTimeout(total=timeout)
        self._api = ApiClient(f"{url.rstrip('/')}/embeddings", key, timeout_)

    async def close(self) -> None:
        await self._api.close()

    async def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = [
            await self._embed_batch(texts[start : start + self._batch_size])
            for start in range(0, len(texts), self._batch_size)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    async def _embed_batch(self, texts: list[str]) -> np.ndarray:
        body = {"model": self._model, "input": texts}
        api = self._api
        with api.network_failures(EmbeddingError):
            async with api.session().post(
                api.endpoint, data=orjson.dumps(body), headers=api.headers("application/json")
            ) as response:
                raw = await response.read()
                if not 200 <= response.status < 300:
                    raise api.http_error(EmbeddingError, response.status, raw)
        return self._parse(raw, len(texts))

    def _parse(self, raw: bytes, expected: int) -> np.ndarray:
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise self._bad(f"the answer is not JSON: {excerpt(raw)}") from None
        if not isinstance(answer, dict):
            raise self._bad(f"the answer is not an object: {excerpt(raw)}")
        if answer.get("error"):
            raise self._bad(f"the server reported an error: {excerpt(raw)}")
        data = answer.get("data")
        if not isinstance(data, list):
            raise self._bad(f"the answer has no data list: {excerpt(raw)}")
        if len(data) != expected:
            raise self._bad(f"asked for {expected} embeddings, got {len(data)}")
        rows: list[list[float] | None] = [None] * expected
        for position, item in enumerate(data):
            index, vector = self._item(item, position, expected)
            if rows[index] is not None:
                raise self._bad(f"embedding index {index} appears twice")
            rows[index] = vector
        # Every slot is filled: `expected` distinct indices in range(expected).
        return self._to_matrix([row for row in rows if row is not None])

    def _item(self, item: Any, position: int, expected: int) -> tuple[int, list[float]]:
        if not isinstance(item, dict):
            raise self._bad(f"data[{position}] is not an object")
        # The spec orders `data` like `input`, but says so with `index`; trust the index.
        index = item.get("index", position)
        if type(index) is not int or not 0 <= index < expected:
            raise self._bad(f"data[{position}] has index {index!r}, outside 0..{expected - 1}")
        vector = item.get("embedding")
        if not isinstance(vector, list):
            # A string here is base64, which this client never asks for.
            raise self._bad(f"data[{position}].embedding is not a list of numbers")
        if not all(type(x) is float or type(x) is int for x in vector):
            raise self._bad(f"data[{position}].embedding holds something other than numbers")
        return index, vector

    def _to_matrix(self, rows: list[list[float]]) -> np.ndarray:
        lengths = {len(row) for row in rows}
        if len(lengths) != 1:
            raise self._bad(f"embeddings of different lengths in one answer: {sorted(lengths)}")
        length = lengths.pop()
        if length == 0:
            raise self._bad("empty embeddings")
        if self.dim and length != self.dim:
            raise self._bad(f"embeddings of length {length}, expected {self.dim}")
        with np.errstate(over="ignore"):
            matrix = np.asarray(rows, dtype=np.float64).astype(np.float32)
        if not np.isfinite(matrix).all():
            raise self._bad("embeddings hold numbers too large for float32")
        try:
            normalised = normalise_rows(matrix)
        except ValueError:
            raise self._bad("an embedding is all zeros") from None
        # Learned only from an answer that passed every check.
        self.dim = length
        return normalised

    def _bad(self, message: str) -> EmbeddingError:
        return EmbeddingError("bad_response", self._api.scrub(f"{self._api.endpoint}: {message}"))
