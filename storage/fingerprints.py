"""Fingerprints in and out of PostgreSQL, read back the same whatever form they arrive in.

A fingerprint is stored as `bytea`: float32, little-endian, `dim * 4` bytes, compact and
exact. Reading it back must not depend on how a column, a query or a driver chose to hand
it over: bytes, a list of numbers (a `real[]` column), a numpy array (a driver codec), or
the text of a list (`"[0.1, 0.2]"` from a vector type or a text cast, `"{0.1,0.2}"` from a
PostgreSQL array cast to text) all decode to the same float32 vector.

A vector that is not what it should be raises `FingerprintError`. Comparing lengths without
decoding first is how dedup once failed for months without a sound: a text fingerprint's
length is its character count, never equal to the model's dimension, so every candidate was
skipped and no memory was ever recognised. Here nothing is skipped silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real
from typing import Any

import numpy as np
import orjson

_WIRE = np.dtype("<f4")
_EXCERPT = 60


class FingerprintError(ValueError):
    """A stored fingerprint that cannot be read as a vector of the expected length.

    `code` is stable: `missing`, `wrong_length`, `not_numeric`, `not_finite`, `bad_type`.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def encode(vector: Any) -> bytes:
    """The `bytea` form of a fingerprint: float32 little-endian, 4 bytes per dimension.

    Refuses what could not be read back as the same vector: not one-dimensional, empty,
    non-numeric, or holding NaN or infinity.
    """
    array = _numeric_array(vector)
    if array.ndim != 1 or array.size == 0:
        raise FingerprintError(
            "wrong_length", f"a fingerprint is one non-empty row, not shape {array.shape}"
        )
    with np.errstate(over="ignore"):
        wire = array.astype(_WIRE)
    _check_finite(wire)
    return wire.tobytes()


def decode(value: Any, dim: int) -> np.ndarray:
    """The float32 vector of length `dim` that `value` holds, whatever form it came in.

    Accepts bytes, bytearray or memoryview (the `bytea` form), a list or tuple of numbers,
    a numpy array, or text of a list. Returns a new, writable, C-contiguous array.
    """
    if value is None:
        # A memory whose fingerprint failed has none yet; callers decide what that means,
        # but they must decide: None is not an empty vector.
        raise FingerprintError("missing", "no fingerprint")
    if isinstance(value, bytes | bytearray | memoryview):
        vector = _from_bytes(value, dim)
    elif isinstance(value, str):
        vector = _from_text(value, dim)
    elif isinstance(value, np.ndarray):
        vector = _from_array(value, dim)
    elif isinstance(value, list | tuple):
        vector = _from_sequence(value, dim)
    else:
        raise FingerprintError(
            "bad_type", f"cannot read a fingerprint from a {type(value).__name__}"
        )
    _check_finite(vector)
    return vector


def decode_many(values: Sequence[Any], dim: int) -> np.ndarray:
    """Decode rows into one `(len(values), dim)` float32 matrix, for building an index.

    The first row that cannot be decoded raises, naming its position.
    """
    out = np.empty((len(values), dim), dtype=np.float32)
    for row, value in enumerate(values):
        try:
            out[row] = decode(value, dim)
        except FingerprintError as exc:
            raise FingerprintError(exc.code, f"row {row}: {exc}") from None
    return out


def _from_bytes(value: bytes | bytearray | memoryview, dim: int) -> np.ndarray:
    raw = value.tobytes() if isinstance(value, memoryview) else bytes(value)
    if len(raw) != dim * _WIRE.itemsize:
        raise FingerprintError(
            "wrong_length",
            f"{len(raw)} bytes, expected {dim * _WIRE.itemsize} ({dim} float32 values)",
        )
    return np.frombuffer(raw, dtype=_WIRE).astype(np.float32)


def _from_text(value: str, dim: int) -> np.ndarray:
    text = value.strip()
    if text.startswith("{") and text.endswith("}"):
        # PostgreSQL's own array text: same numbers, other brackets.
        text = "[" + text[1:-1] + "]"
    if not (text.startswith("[") and text.endswith("]")):
        raise FingerprintError("not_numeric", f"text is not a list of numbers: {_excerpt(value)}")
    try:
        items = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise FingerprintError(
            "not_numeric", f"text is not a list of numbers: {_excerpt(value)}"
        ) from None
    return _from_sequence(items, dim)


def _from_sequence(items: list[Any] | tuple[Any, ...], dim: int) -> np.ndarray:
    if len(items) != dim:
        raise FingerprintError("wrong_length", f"{len(items)} values, expected {dim}")
    for position, item in enumerate(items):
        # bool is an int to Python, and numpy would read "0.5" as a number: both are junk
        # in a fingerprint, so each item is checked rather than handed to numpy.
        if isinstance(item, bool | np.bool_) or not isinstance(item, Real):
            raise FingerprintError(
                "not_numeric", f"value {position} is {type(item).__name__} {item!r:.{_EXCERPT}}"
            )
    try:
        with np.errstate(over="ignore"):
            return np.asarray(items, dtype=np.float64).astype(np.float32)
    except OverflowError:
        # An integer beyond float64's range: as unusable as infinity.
        raise FingerprintError("not_finite", "a value too large for a float") from None


def _from_array(value: np.ndarray, dim: int) -> np.ndarray:
    if value.dtype.kind not in "fiu":
        raise FingerprintError("not_numeric", f"an array of {value.dtype}")
    if value.ndim != 1:
        raise FingerprintError(
            "wrong_length", f"an array of shape {value.shape}, expected ({dim},)"
        )
    if value.shape[0] != dim:
        raise FingerprintError("wrong_length", f"{value.shape[0]} values, expected {dim}")
    with np.errstate(over="ignore"):
        return np.array(value, dtype=np.float32, order="C", copy=True)


def _numeric_array(vector: Any) -> np.ndarray:
    if isinstance(vector, np.ndarray):
        if vector.dtype.kind not in "fiu":
            raise FingerprintError("not_numeric", f"an array of {vector.dtype}")
        return vector
    if isinstance(vector, list | tuple):
        return _from_sequence(vector, len(vector))
    raise FingerprintError("bad_type", f"cannot encode a {type(vector).__name__}")


def _check_finite(vector: np.ndarray) -> None:
    # NaN or infinity (including a float64 too large for float32) would poison every
    # similarity computed against this vector.
    if not np.isfinite(vector).all():
        raise FingerprintError("not_finite", "the fingerprint holds NaN or infinity")


def _excerpt(text: str) -> str:
    return repr(text[:_EXCERPT]) + ("..." if len(text) > _EXCERPT else "")
