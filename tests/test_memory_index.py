"""One person's fingerprint index: half precision, and partitioned once it is large."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from storage import memory_index
from storage.memory_index import PersonIndex

DIM = 32


def unit_rows(n: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def near(row: np.ndarray, cosine: float, seed: int = 1) -> np.ndarray:
    """A unit vector at about `cosine` from `row`."""
    noise = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    noise -= (noise @ row) * row
    noise /= np.linalg.norm(noise)
    return (cosine * row + np.sqrt(1 - cosine**2) * noise).astype(np.float32)


def test_scores_are_cosines_to_half_precision() -> None:
    rows = unit_rows(50)
    ids = [uuid.uuid4() for _ in rows]
    index = PersonIndex(DIM, 1)
    index.add(ids, rows)
    hits = index.search(near(rows[7], 0.8), 3)
    assert hits[0][0] == ids[7] and hits[0][1] == pytest.approx(0.8, abs=2e-3)
    assert not index.partitioned


@pytest.fixture
def small_partitions(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(memory_index, "PARTITION_ABOVE", 300)
    monkeypatch.setattr(memory_index, "PROBES", 8)
    return 300


def test_a_large_index_partitions_and_still_finds_each_memory(small_partitions: int) -> None:
    rows = unit_rows(1000)
    ids = [uuid.uuid4() for _ in rows]
    index = PersonIndex(DIM, 1)
    index.add(ids[:small_partitions], rows[:small_partitions])
    assert not index.partitioned  # not above the line yet
    index.add(ids[small_partitions:], rows[small_partitions:])
    assert index.partitioned and len(index) == 1000
    # A close restatement (cosine 0.95) of any memory finds it first.
    assert all(index.search(near(rows[i], 0.95, i), 1)[0][0] == ids[i] for i in range(0, 1000, 7))
    # Removing and adding back work by id, as before partitioning.
    index.remove([ids[3]])
    assert ids[3] not in index and index.search(rows[3], 1)[0][0] != ids[3]
    index.add([ids[3]], rows[3:4])
    assert index.search(rows[3], 1)[0][0] == ids[3]


def test_a_partitioned_index_finds_a_near_duplicate_pair(small_partitions: int) -> None:
    rows = unit_rows(600)
    rows[599] = near(rows[10], 0.95)
    ids = [uuid.uuid4() for _ in rows]
    index = PersonIndex(DIM, 1)
    index.add(ids, rows)
    assert index.partitioned
    pairs = {frozenset((a, b)) for a, b, _ in index.neighbours(4, 0.9)}
    assert pairs == {frozenset((ids[10], ids[599]))}
