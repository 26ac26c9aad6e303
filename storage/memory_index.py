"""The fingerprint index: one faiss index per active person, rebuilt from PostgreSQL.

PostgreSQL is the source of truth; this is a cache of one thing in it, the fingerprints of
a person's active memories made by the current model, laid out for fast inner-product
search (the rows are L2-normalised, so the inner product is the cosine). It holds only
persons in use: built on a person's first look-up, dropped when their conversation goes,
and the least recently used are evicted past `max_persons`, so memory tracks the people
actually connected.

It is never silently stale. Each person's index remembers the generation of the person's
memories it reflects (a counter a trigger bumps on every change that matters to it, whoever
writes). Each look-up reads the current generation first and rebuilds on a mismatch (or,
with `search_then`, reads it with the hits' rows and searches again on a mismatch); a
write made through this process hands back the generation it produced, and the index
applies the change itself only if that generation directly follows its own.

A look-up scans every fingerprint of a small person, and only the closest partitions of a
large one (`PARTITION_ABOVE`), so it stays well under a couple of milliseconds at 10,000
memories and more.

faiss is CPU work: below `offload_above` vectors a search takes microseconds and runs on
the loop; above it, searches and rebuilds run in a worker thread, with as many OpenMP
threads as the loop's (`--compute-threads`). A per-person lock keeps one operation at a
time on each index, since a faiss index is not safe to search while it changes.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar
from uuid import UUID

import faiss
import numpy as np

from storage.fingerprints import FingerprintError, decode
from storage.memories import MemoryStore

log = logging.getLogger("stillhere.memory")

T = TypeVar("T")
R = TypeVar("R")


# Above this many memories a person's index is partitioned: faiss k-means groups the
# fingerprints into about sqrt(n) cells, and a look-up scans the `PROBES` cells whose centres
# are closest to the query instead of every fingerprint. Measured on the labelled pairs'
# fingerprints among 8,500 others (paired, 896 dimensions, one core of the bench machine):
# the restated memory was among the 8 candidates for 102 of 109 restatements, as with an
# exact scan (101 with 16 probes), in 0.9 ms at p50 instead of 2.2 ms.
PARTITION_ABOVE = 4096
PROBES = 24
# A search by meaning looks the index up by the multilingual half of the fingerprints alone
# (actors/memory/search.py), farther from the cells' centres, trained on whole ones: at
# 10,000 memories `stillhere eval search --size 10000 --persons 1` gave recall@5 0.952 with
# 24 of the 99 cells (memories restated in other words missed outright), 0.991 with 64.
SEARCH_PROBES = 64
TRAIN_PER_CELL = 128
TRAIN_ROUNDS = 10
HALF = faiss.ScalarQuantizer.QT_fp16


def _half(dim: int) -> faiss.Index:
    return faiss.IndexScalarQuantizer(dim, HALF, faiss.METRIC_INNER_PRODUCT)


class PersonIndex:
    """One person's fingerprints in a faiss inner-product index, keyed by memory id.

    Kept at half precision: an exhaustive look-up reads every fingerprint, so half the bytes
    is nearly half the time and half the memory, and ranking needs no more (scores are off
    by under 1e-3). Recognition judges its candidates from the full-precision fingerprints
    in PostgreSQL, never from these scores. Past `PARTITION_ABOVE` memories it partitions
    itself (see there)."""

    def __init__(self, dim: int, generation: int) -> None:
        self.dim = dim
        self.generation = generation
        self._index: faiss.Index = faiss.IndexIDMap2(_half(dim))
        self._partitioned = False
        self._ids: dict[int, UUID] = {}
        self._keys: dict[UUID, int] = {}
        self._next = 0

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, memory: UUID) -> bool:
        return memory in self._keys

    def ids(self) -> set[UUID]:
        return set(self._keys)

    def add(self, ids: list[UUID], vectors: np.ndarray) -> None:
        if not ids:
            return
        self.remove([i for i in ids if i in self._keys])
        rows = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(ids), self.dim)
        faiss.normalize_L2(rows)  # stored rows should be unit already; a cheap guarantee
        keys = np.arange(self._next, self._next + len(ids), dtype=np.int64)
        self._next += len(ids)
        self._index.add_with_ids(rows, keys)
        for key, memory in zip(keys.tolist(), ids, strict=True):
            self._ids[key] = memory
            self._keys[memory] = key
        if not self._partitioned and len(self._ids) > PARTITION_ABOVE:
            self._partition()

    def _partition(self) -> None:
        """Move every fingerprint into a partitioned index trained on them."""
        keys = np.fromiter(self._ids.keys(), dtype=np.int64, count=len(self._ids))
        rows = self._rows(keys)
        cells = int(np.sqrt(len(keys)))
        centres = faiss.IndexFlatIP(self.dim)
        index = faiss.IndexIVFScalarQuantizer(
            centres, self.dim, cells, HALF, faiss.METRIC_INNER_PRODUCT
        )
        index.own_fields = True  # the partitioned index keeps its cell centres alive
        centres.this.disown()
        # A sample of 128 per cell and 10 rounds place the centres as well as faiss's
        # defaults for these look-ups (the same 102 of 109 above), at less than half the cost:
        # 7 s instead of 16 to build 100,000 fingerprints of 896 dimensions (flat: 0.3 s).
        index.cp.max_points_per_centroid, index.cp.niter = TRAIN_PER_CELL, TRAIN_ROUNDS
        index.train(rows)
        index.nprobe = PROBES
        index.set_direct_map_type(faiss.DirectMap.Hashtable)  # reconstruct and remove by key
        index.add_with_ids(rows, keys)
        self._index, self._partitioned = index, True

    def _rows(self, keys: np.ndarray) -> np.ndarray:
        return np.vstack([self._index.reconstruct(int(key)) for key in keys])

    def remove(self, ids: list[UUID]) -> None:
        keys = [self._keys.pop(i) for i in ids if i in self._keys]
        if keys:
            self._index.remove_ids(np.asarray(keys, dtype=np.int64))
            for key in keys:
                del self._ids[key]

    def search(self, vector: np.ndarray, k: int) -> list[tuple[UUID, float]]:
        """The `k` closest memories, best first, with their cosine."""
        if not self._ids or k <= 0:
            return []
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, self.dim)
        scores, keys = self._index.search(query, min(k, len(self._ids)))
        return [
            (self._ids[key], float(score))
            for key, score in zip(keys[0].tolist(), scores[0].tolist(), strict=True)
            if key >= 0
        ]

    def near(self, queries: np.ndarray, k: int, extra: list[UUID]) -> dict[UUID, np.ndarray]:
        """The `k` closest memories to each row of `queries` (scanning `SEARCH_PROBES`
        cells of a partitioned index), and those of `extra` that are here, each with its
        fingerprint (as held: half precision, back in float32), for a caller that scores
        them its own way."""
        keys: dict[int, None] = {}
        if self._ids and k > 0:
            rows = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
            params = faiss.SearchParametersIVF(nprobe=SEARCH_PROBES) if self._partitioned else None
            _, found = self._index.search(rows, min(k, len(self._ids)), params=params)
            keys.update((key, None) for key in found.ravel().tolist() if key >= 0)
        keys.update((self._keys[i], None) for i in extra if i in self._keys)
        return {self._ids[key]: self._index.reconstruct(key) for key in keys}

    def neighbours(self, k: int, floor: float) -> list[tuple[UUID, UUID, float]]:
        """Every pair `(a, b, cosine)` with cosine >= floor, a among each b's k nearest:
        what the consolidation pass looks at."""
        n = len(self._ids)
        if n < 2:
            return []
        keys = np.fromiter(self._ids.keys(), dtype=np.int64, count=n)
        rows = self._rows(keys)
        scores, found = self._index.search(rows, min(k + 1, n))
        pairs: dict[tuple[UUID, UUID], float] = {}
        for row, key in enumerate(keys.tolist()):
            for other, score in zip(found[row].tolist(), scores[row].tolist(), strict=True):
                if other < 0 or other == key or score < floor:
                    continue
                a, b = sorted((self._ids[key], self._ids[other]), key=str)
                pairs[(a, b)] = max(score, pairs.get((a, b), -1.0))
        return [(a, b, score) for (a, b), score in pairs.items()]


class FingerprintIndex:
    """Per-person indexes for one embedding model, LRU-capped, consistent with the db."""

    def __init__(
        self,
        store: MemoryStore,
        model: str,
        dim: int,
        *,
        max_persons: int = 256,
        offload_above: int = 2048,
    ) -> None:
        self.store = store
        self.model = model
        self.dim = dim
        self.max_persons = max_persons
        self.offload_above = offload_above
        self._persons: OrderedDict[str, PersonIndex] = OrderedDict()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self.builds = 0  # how many times an index was built from the database

    def __contains__(self, person: str) -> bool:
        return person in self._persons

    def __len__(self) -> int:
        return len(self._persons)

    def cached(self, person: str) -> PersonIndex | None:
        return self._persons.get(person)

    def drop(self, person: str) -> None:
        """Forget a person's index (their conversation went); rebuilt on the next use."""
        self._persons.pop(person, None)

    def clear(self) -> None:
        self._persons.clear()

    def lock(self, person: str) -> asyncio.Lock:
        lock = self._locks.get(person)
        if lock is None:
            lock = self._locks[person] = asyncio.Lock()
        return lock

    async def search(self, person: str, vector: np.ndarray, k: int) -> list[tuple[UUID, float]]:
        """The person's `k` closest active memories to `vector`, best first."""
        async with self.lock(person):
            index = await self._current(person)
            return await self._cpu(len(index), index.search, vector, k)

    async def search_then(
        self,
        person: str,
        vector: np.ndarray,
        k: int,
        read: Callable[[list[UUID]], Awaitable[tuple[R, int]]],
    ) -> tuple[list[tuple[UUID, float]], R]:
        """`search`, then `read` what the hits need. `read` answers with the person's
        generation from the same statement, which spares `search`'s own generation read:
        if it is not the index's, the index was stale, and is rebuilt, searched and read
        again."""
        async with self.lock(person):
            index = self._persons.get(person)
            if index is None:
                index = await self._current(person)
            hits = await self._cpu(len(index), index.search, vector, k)
            rows, generation = await read([memory for memory, _ in hits])
            if generation == index.generation:
                self._persons.move_to_end(person)
                return hits, rows
            index = await self._current(person)
            hits = await self._cpu(len(index), index.search, vector, k)
            rows, _ = await read([memory for memory, _ in hits])
            return hits, rows

    async def near(
        self,
        person: str,
        queries: np.ndarray,
        k: int,
        extra: list[UUID],
        read: Callable[[list[UUID]], Awaitable[tuple[R, int]]],
    ) -> tuple[dict[UUID, np.ndarray], R]:
        """`PersonIndex.near`, then `read` the memories found, as `search_then` does: a
        generation that is not the index's means it was stale, and it is done again."""
        async with self.lock(person):
            index = self._persons.get(person)
            if index is None:
                index = await self._current(person)
            found = await self._cpu(len(index), index.near, queries, k, extra)
            rows, generation = await read(list(found))
            if generation == index.generation:
                self._persons.move_to_end(person)
                return found, rows
            index = await self._current(person)
            found = await self._cpu(len(index), index.near, queries, k, extra)
            rows, _ = await read(list(found))
            return found, rows

    async def neighbours(self, person: str, k: int, floor: float) -> list[tuple[UUID, UUID, float]]:
        """Close pairs among the person's memories. A person not in use gets a throwaway
        index, so a background pass over everyone does not evict the people connected."""
        async with self.lock(person):
            if person in self._persons:
                index = await self._current(person)
            else:
                index = await self._build(person)
            return await _offloaded(index.neighbours, k, floor)

    async def applied(
        self,
        person: str,
        generation: int,
        *,
        added: tuple[UUID, np.ndarray] | None = None,
        removed: list[UUID] | None = None,
    ) -> None:
        """A write through this process produced `generation`: follow it if it is the next
        one, else forget the index (someone else wrote too; the next look-up rebuilds)."""
        async with self.lock(person):
            index = self._persons.get(person)
            if index is None:
                return
            if generation != index.generation + 1:
                self._persons.pop(person, None)
                return
            # Off the loop for a large index: a removal compacts a flat one, and the add
            # that takes one past `PARTITION_ABOVE` trains its partitions.
            if removed:
                await self._cpu(len(index), index.remove, removed)
            if added is not None:
                await self._cpu(len(index), index.add, [added[0]], added[1].reshape(1, -1))
            index.generation = generation

    async def _current(self, person: str) -> PersonIndex:
        """The person's index at the database's generation (caller holds the lock)."""
        index = self._persons.get(person)
        if index is not None and index.generation == await self.store.generation(person):
            self._persons.move_to_end(person)
            return index
        index = await self._build(person)
        self._persons[person] = index
        self._persons.move_to_end(person)
        while len(self._persons) > self.max_persons:
            evicted, _ = self._persons.popitem(last=False)
            log.info(
                "fingerprint index of %s evicted (over %d persons)", evicted[:8], self.max_persons
            )
        return index

    async def _build(self, person: str) -> PersonIndex:
        snapshot = await self.store.fingerprints(person, self.model)
        index = PersonIndex(self.dim, snapshot.generation)
        ids: list[UUID] = []
        rows: list[np.ndarray] = []
        unreadable: list[UUID] = []
        for memory, value in zip(snapshot.ids, snapshot.values, strict=True):
            try:
                rows.append(decode(value, self.dim))
                ids.append(memory)
            except FingerprintError as error:
                log.error(
                    "fingerprint of memory %s is unreadable (%s): left out of the index and "
                    "queued for the back-fill",
                    memory,
                    error,
                )
                unreadable.append(memory)
        if rows:
            matrix = np.vstack(rows)
            await self._cpu(len(ids), index.add, ids, matrix)
        self.builds += 1
        log.info(
            "fingerprint index of %s built from the database: %d memories, generation %d",
            person[:8],
            len(index),
            index.generation,
        )
        if unreadable:
            await self.store.clear_fingerprints(person, unreadable)
            # That write bumped the generation: the index reflects it already (those rows
            # are left out), so it need not be built again.
            index.generation = await self.store.generation(person)
        return index

    async def _cpu(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """Run `fn` on the loop when it is small work, else in a worker thread."""
        if size > self.offload_above:
            return await _offloaded(fn, *args)
        return fn(*args)


async def _offloaded(fn: Callable[..., T], *args: object) -> T:
    """Run `fn` in a worker thread with the OpenMP threads of the thread that asks.

    OpenMP keeps that number per thread, and `threadpoolctl` set it only in the loop's: a
    worker would use every core, and keep a team of OpenMP threads for as long as it lives,
    one team for each of the executor's threads that ever ran faiss."""
    return await asyncio.to_thread(_sized, faiss.omp_get_max_threads(), fn, *args)


def _sized(threads: int, fn: Callable[..., T], *args: object) -> T:
    faiss.omp_set_num_threads(threads)
    return fn(*args)
