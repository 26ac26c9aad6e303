"""Fingerprints decode to the same vector from every form a database or driver hands back,
and anything else is an error, never a silent skip."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import asyncpg
import numpy as np
import pytest

from storage.fingerprints import FingerprintError, decode, decode_many, encode

DIM = 8


@pytest.fixture
def vector() -> np.ndarray:
    rng = np.random.default_rng(7)
    v = rng.standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def forms(v: np.ndarray) -> dict[str, Any]:
    """Every form a fingerprint may come back in."""
    wire = encode(v)
    listed = [float(x) for x in v]
    return {
        "bytes": wire,
        "bytearray": bytearray(wire),
        "memoryview": memoryview(wire),
        "list": listed,
        "tuple": tuple(listed),
        "list of float32": list(v),
        "float32 array": v.copy(),
        "float64 array": v.astype(np.float64),
        "text": str(listed),
        "compact text": "[" + ",".join(repr(x) for x in listed) + "]",
        "padded text": "  [ " + " , ".join(str(x) for x in listed) + " ]\n",
        "postgres array text": "{" + ",".join(str(np.float32(x)) for x in listed) + "}",
    }


def test_encode_is_float32_little_endian(vector: np.ndarray) -> None:
    wire = encode(vector)
    assert len(wire) == DIM * 4
    assert wire == vector.astype("<f4").tobytes()
    assert encode(list(map(float, vector))) == wire


def test_every_form_decodes_to_the_same_vector(vector: np.ndarray) -> None:
    for name, value in forms(vector).items():
        decoded = decode(value, DIM)
        assert decoded.dtype == np.float32, name
        assert decoded.shape == (DIM,), name
        np.testing.assert_array_equal(decoded, vector, err_msg=name)


def test_decoded_vectors_are_fresh_writable_arrays(vector: np.ndarray) -> None:
    source = vector.copy()
    decoded = decode(source, DIM)
    decoded[0] = 99.0
    assert source[0] != 99.0
    assert decode(encode(vector), DIM).flags.writeable


def test_the_text_of_a_1536_fingerprint_is_not_taken_for_its_length() -> None:
    """The seed's bug: the length of the text (thousands of characters) was compared with
    the dimension, so every stored fingerprint was skipped."""
    v = np.linspace(-1, 1, 1536, dtype=np.float32)
    text = str([float(x) for x in v])
    assert len(text) > 20_000
    np.testing.assert_array_equal(decode(text, 1536), v)


@pytest.mark.parametrize("form", ["bytes", "list", "text", "float32 array", "postgres array text"])
@pytest.mark.parametrize("dim", [DIM - 1, DIM + 1, 384])
def test_a_wrong_length_raises(vector: np.ndarray, form: str, dim: int) -> None:
    with pytest.raises(FingerprintError) as info:
        decode(forms(vector)[form], dim)
    assert info.value.code == "wrong_length"


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (None, "missing"),
        ("", "not_numeric"),
        ("not a vector", "not_numeric"),
        ("[0.1, 0.2", "not_numeric"),
        ("[0.1, 'a', 0.3]", "not_numeric"),
        ("{0.1,NULL,0.3}", "not_numeric"),
        ("[NaN, 0.1, 0.2]", "not_numeric"),
        ('["0.1", "0.2", "0.3"]', "not_numeric"),
        (["0.1", "0.2", "0.3"], "not_numeric"),
        ([0.1, None, 0.3], "not_numeric"),
        ([True, False, True], "not_numeric"),
        ([0.1, Decimal("0.2"), 0.3], "not_numeric"),
        ([[0.1], [0.2], [0.3]], "not_numeric"),
        ([0.1, float("nan"), 0.3], "not_finite"),
        ([0.1, float("inf"), 0.3], "not_finite"),
        ([0.1, 1e300, 0.3], "not_finite"),
        ([0.1, 10**400, 0.3], "not_finite"),
        (np.array(["a", "b", "c"]), "not_numeric"),
        (np.array([0.1, np.nan, 0.3]), "not_finite"),
        (np.zeros((1, 3)), "wrong_length"),
        (
            np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32).tobytes()[:12] + b"\x00\x00\xc0\x7f",
            "not_finite",
        ),
        ({"a": 1}, "bad_type"),
        (3.0, "bad_type"),
    ],
)
def test_junk_raises_with_a_stable_code(value: Any, code: str) -> None:
    dim = 4 if isinstance(value, bytes) else 3
    with pytest.raises(FingerprintError) as info:
        decode(value, dim)
    assert info.value.code == code


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ([], "wrong_length"),
        (np.zeros((2, 3)), "wrong_length"),
        ([0.1, float("nan")], "not_finite"),
        (["a"], "not_numeric"),
        ("[0.1]", "bad_type"),
    ],
)
def test_encode_refuses_what_would_not_read_back(value: Any, code: str) -> None:
    with pytest.raises(FingerprintError) as info:
        encode(value)
    assert info.value.code == code


def test_fingerprint_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        decode("junk", 3)


def test_decode_many_builds_a_matrix_and_names_the_bad_row(vector: np.ndarray) -> None:
    values = list(forms(vector).values())
    matrix = decode_many(values, DIM)
    assert matrix.shape == (len(values), DIM)
    np.testing.assert_array_equal(matrix, np.tile(vector, (len(values), 1)))
    with pytest.raises(FingerprintError) as info:
        decode_many([encode(vector), encode(vector)[:-4]], DIM)
    assert info.value.code == "wrong_length"
    assert "row 1" in str(info.value)


async def test_what_postgresql_hands_back_decodes_to_what_was_stored(
    db: asyncpg.Connection, vector: np.ndarray
) -> None:
    """Stored as bytea, a real[] and text, read back as asyncpg returns them, and through
    the casts a query might apply: all the same vector."""
    await db.execute("CREATE TABLE fp (b bytea, a real[], t text)")
    listed = [float(x) for x in vector]
    await db.execute("INSERT INTO fp VALUES ($1, $2, $3)", encode(vector), listed, str(listed))
    row = await db.fetchrow("SELECT b, a, t, a::text AS a_text, b::text AS hex FROM fp")
    assert isinstance(row["b"], bytes)
    assert isinstance(row["a"], list)
    assert isinstance(row["a_text"], str) and row["a_text"].startswith("{")
    for column in ("b", "a", "t", "a_text"):
        np.testing.assert_array_equal(decode(row[column], DIM), vector, err_msg=column)
    # bytea cast to text is hex ("\x3e..."), not a list: refused, not misread.
    with pytest.raises(FingerprintError):
        decode(row["hex"], DIM)
