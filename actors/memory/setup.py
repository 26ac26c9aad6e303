"""Building the memory keeper from plain settings, the same way for the server and the CLI.

Without an embeddings URL the local pair is the embedder: all-MiniLM-L6-v2, which tells
English memories apart finely, beside USE multilingual v3, which matches them across
languages (`providers.multilingual`). Memory recognises rewordings and translations on a
first run, offline, with nothing to configure. The server loads the weights as it starts
(`warm`); the CLI's commands on their first fingerprint.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from actors.clock import Clock, SystemClock, parse_duration
from actors.memory.judging import judge_for
from actors.memory.keeper import DEFAULT_FINGERPRINT_WAIT_S, MemoryKeeper
from actors.memory.recognition import Thresholds
from providers.embedding import DEFAULT_TIMEOUT_S, Embedder, OpenAIEmbeddings
from providers.multilingual import Paired, UseMultilingual
from storage.memories import MemoryStore

log = logging.getLogger("stillhere.memory")

DEFAULT_API_MODEL = "text-embedding-3-small"
LOCAL_EMBEDDERS = ("pair", "minilm", "use")


def _env(name: str) -> str | None:
    return os.environ.get("STILLHERE_" + name.upper().replace("-", "_"))


def make_embedder(
    url: str | None = None,
    model: str | None = None,
    key: str | None = None,
    *,
    path: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    local: str = "pair",
) -> Embedder:
    """An OpenAI-compatible embeddings client if `url` is given, else the local `local`
    model: the pair (the default), or one of its two alone (MiniLM's weights from `path`,
    if given). The comparison that chose the pair is in docs/memories.md."""
    if url:
        return OpenAIEmbeddings(url, model or DEFAULT_API_MODEL, key, timeout=timeout)
    if local not in LOCAL_EMBEDDERS:
        raise ValueError(
            f"the local embedder is one of {', '.join(LOCAL_EMBEDDERS)}, not {local!r}"
        )
    if local == "use":
        return UseMultilingual()
    from providers.minilm import MiniLM  # ONNX Runtime; imported only when used

    return MiniLM(path) if local == "minilm" else Paired(MiniLM(path), UseMultilingual())


def parse_thresholds(text: str) -> Thresholds:
    """`0.85,0.70` -> Thresholds(0.85, 0.70); `0.87,0.73,0.55` also sets the worded floor."""
    try:
        high, low, *worded = (float(x) for x in text.split(","))
        if len(worded) > 1:
            raise ValueError(text)
        return Thresholds(high, low, worded[0] if worded else None)
    except ValueError as wrong:
        raise ValueError(
            f"thresholds are HIGH,LOW[,WORDED] with 0 <= WORDED <= LOW <= HIGH <= 1 "
            f"(e.g. 0.85,0.70), not {text!r}"
        ) from wrong


async def open_keeper(
    dsn: str,
    embedder: Embedder,
    clock: Clock,
    *,
    thresholds: Thresholds | None = None,
    max_persons: int = 256,
    fingerprint_wait: float = DEFAULT_FINGERPRINT_WAIT_S,
) -> MemoryKeeper:
    """A keeper with its own small pool on `dsn` (migrated already by `Store.open`)."""
    store = await MemoryStore.open(dsn)
    judge = judge_for(embedder, thresholds)
    log.info(
        "long-term memory: fingerprints by %s; recognised by %s (the shared tier needs the "
        "same type and a shared person or theme)",
        getattr(embedder, "label", embedder.name),
        judge.describe(),
    )
    return MemoryKeeper(
        store,
        embedder,
        clock,
        judge=judge,
        max_persons=max_persons,
        fingerprint_wait=fingerprint_wait,
    )


async def warm(embedder: Embedder) -> None:
    """Load a local embedder's weights now, before any traffic: loading holds the GIL in
    places, and done on a first memory under load it stalled the loop for up to 0.5 s
    (`bench flap`, 200 phones). An API embedder has nothing to load."""
    load = getattr(embedder, "warm", None)
    if load is None:
        return
    started = time.monotonic()
    await load()
    log.info("embedding models loaded in %.1f s", time.monotonic() - started)


async def close_keeper(keeper: MemoryKeeper) -> None:
    """Release the keeper's index, its pool and its embedder."""
    await keeper.close()
    await keeper.store.close()
    await keeper.embedder.close()


def _thresholds(text: str) -> Any:
    try:
        return parse_thresholds(text)
    except ValueError as wrong:
        raise argparse.ArgumentTypeError(str(wrong)) from None


def add_embed_options(parser: argparse.ArgumentParser) -> None:
    """Which embedder: an OpenAI-compatible API, else the local all-MiniLM-L6-v2 (shared
    with `stillhere eval dedup`)."""
    timeout = _env("embed-timeout")
    parser.add_argument(
        "--embed-url",
        default=_env("embed-url"),
        help="OpenAI-compatible embeddings API base URL; without it, the local "
        "all-MiniLM-L6-v2 (env STILLHERE_EMBED_URL)",
    )
    parser.add_argument(
        "--embed-model", default=_env("embed-model"), help="model name sent to the API"
    )
    parser.add_argument("--embed-key", default=_env("embed-key"), help="API key")
    parser.add_argument(
        "--embed-path",
        default=_env("embed-path"),
        help="folder of the local model's weights (otherwise looked for in the usual places)",
    )
    parser.add_argument(
        "--embed-local",
        choices=LOCAL_EMBEDDERS,
        default=_env("embed-local") or "pair",
        help="without --embed-url: both local models (pair, the default), or one alone",
    )
    parser.add_argument(
        "--embed-timeout",
        type=parse_duration,
        default=parse_duration(timeout) if timeout else DEFAULT_TIMEOUT_S,
        help="longest wait for one embeddings API answer (env STILLHERE_EMBED_TIMEOUT)",
    )
    parser.add_argument(
        "--thresholds",
        type=_thresholds,
        default=None,
        metavar="HIGH,LOW[,WORDED]",
        help="recognition thresholds for every judging model (default: measured per model)",
    )


@contextlib.asynccontextmanager
async def keeper_on(dsn: str, args: argparse.Namespace) -> AsyncIterator[MemoryKeeper]:
    embedder = make_embedder(
        args.embed_url,
        args.embed_model,
        args.embed_key,
        path=args.embed_path,
        timeout=args.embed_timeout,
        local=args.embed_local,
    )
    keeper = await open_keeper(dsn, embedder, SystemClock(), thresholds=args.thresholds)
    try:
        yield keeper
    finally:
        await close_keeper(keeper)
