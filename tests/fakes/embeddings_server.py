"""A scripted OpenAI-compatible embeddings server, spoken to over real HTTP.

Tests of the embeddings client, and of memory with a remote embedder, need vectors that are
the same for the same text every time, and a server that fails on cue in each way a real
one can: an HTTP error, a stall, a body that is not JSON, the wrong number of vectors,
vectors of the wrong or of mixed lengths, non-numbers. A real socket keeps the client's
timeouts and error mapping under test too.

Vectors are deliberately not normalised (`scale` times a unit vector), so a test can tell
that the client normalises them.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from tests.fakes.http_fake import FakeApi


def vector_for(text: str, dim: int) -> np.ndarray:
    """The fake's unit vector for a text: a seeded Gaussian, so texts never collide."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(dim)
    return vector / np.linalg.norm(vector)


@dataclass(frozen=True, slots=True)
class Fail:
    """An HTTP error. `{key}` in the body is replaced by the bearer token the client sent,
    as some providers quote a wrong key back."""

    status: int
    body: str = "overloaded"


@dataclass(frozen=True, slots=True)
class Hang:
    """Accept the request and never answer, to exercise the client's timeout."""


@dataclass(frozen=True, slots=True)
class Late:
    """Answer correctly, but only once the test sets `release`: an embedder that is slow."""

    release: asyncio.Event


@dataclass(frozen=True, slots=True)
class Garbage:
    """A 200 whose body is not JSON."""

    body: bytes = b"<html>not json</html>"


@dataclass(frozen=True, slots=True)
class WrongCount:
    """A 200 with `delta` more (or fewer, if negative) vectors than texts."""

    delta: int = -1


@dataclass(frozen=True, slots=True)
class WrongLength:
    """A 200 whose vectors all have length `dim` instead of the fake's dimension."""

    dim: int


@dataclass(frozen=True, slots=True)
class Ragged:
    """A 200 whose last vector is one number shorter than the others."""


@dataclass(frozen=True, slots=True)
class Junk:
    """A 200 whose first vector holds `value` (a string, null, a bool...) in place 0."""

    value: Any = "0.5"


@dataclass(frozen=True, slots=True)
class Zero:
    """A 200 whose first vector is all zeros: no direction at all."""


@dataclass(frozen=True, slots=True)
class Shuffled:
    """A 200 with correct vectors listed in reverse order, each with its right `index`."""


Response = Fail | Hang | Late | Garbage | WrongCount | WrongLength | Ragged | Junk | Zero | Shuffled


class FakeEmbeddings(FakeApi["Response"]):
    """Serves `POST /v1/embeddings`: scripted responses first (FIFO), then good answers."""

    path = "/v1/embeddings"

    def __init__(self, dim: int = 32, scale: float = 3.0) -> None:
        super().__init__()
        self.dim = dim
        self.scale = scale

    def expected(self, texts: list[str]) -> np.ndarray:
        """What a correct client returns for these texts: the fake's unit vectors."""
        return np.stack([vector_for(t, self.dim) for t in texts]).astype(np.float32)

    async def handle(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        texts = body["input"] if isinstance(body.get("input"), list) else [body.get("input")]
        response = self._script.popleft() if self._script else None
        if isinstance(response, Fail):
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
            return web.Response(status=response.status, text=response.body.replace("{key}", bearer))
        if isinstance(response, Hang):
            await self._stopping.wait()
            return web.Response(status=503, text="stopping")
        if isinstance(response, Late):
            await response.release.wait()
        if isinstance(response, Garbage):
            return web.Response(body=response.body, content_type="text/html")
        vectors: list[list[Any]] = [
            (vector_for(str(t), self.dim) * self.scale).tolist() for t in texts
        ]
        order = list(range(len(vectors)))
        if isinstance(response, WrongCount):
            if response.delta < 0:
                order = order[: len(order) + response.delta]
            else:
                vectors += [vectors[-1]] * response.delta
                order += list(range(len(texts), len(texts) + response.delta))
        elif isinstance(response, WrongLength):
            vectors = [(vector_for(str(t), response.dim) * self.scale).tolist() for t in texts]
        elif isinstance(response, Ragged):
            vectors[-1] = vectors[-1][:-1]
        elif isinstance(response, Junk):
            vectors[0][0] = response.value
        elif isinstance(response, Zero):
            vectors[0] = [0.0] * self.dim
        elif isinstance(response, Shuffled):
            order.reverse()
        data = [{"object": "embedding", "index": i, "embedding": vectors[i]} for i in order]
        answer = {
            "object": "list",
            "data": data,
            "model": body.get("model", "fake"),
            "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)},
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")
