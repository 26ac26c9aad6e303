"""Memory look-up benchmark: how long one person's fingerprint look-up takes as memories pile up.

Every memory the model states is first looked up among the person's memories (the faiss
index, then the tiers of `actors.memory.recognition`). The target is a p99 under 2 ms at
10,000 memories for one person. Run:

    .venv/bin/python -m bench.memory_lookup --json bench/out/memory_lookup.json
    .venv/bin/python -m bench.memory_lookup --sizes 1000,10000 --queries 200   # quick check

What it does, in one process, against one embedded PostgreSQL in a tmp folder (removed at
the end, whatever happens):

1. Before numpy and faiss are imported, sets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and the
   other thread-pool variables to `--threads` (1), so faiss (OpenMP) and numpy (BLAS) each
   work on one core; the report records the setting and what faiss says it uses.
2. For each dimension of `--dims` (896: the local default, all-MiniLM-L6-v2 and USE
   multilingual side by side; 1536: the API's text-embedding-3-small; 384 would be MiniLM
   alone), one person. For each size of `--sizes`, ascending, the person's
   memories are topped up to that size with one COPY into `cards` (random unit
   fingerprints, memory-like texts of varied length), then `ANALYZE cards`.
3. **Build.** The person's index is dropped and the first look-up through the keeper's
   real `FingerprintIndex` (`storage/memory_index.py`) builds it from PostgreSQL: timed
   `--builds` (3) times; the RSS of the process before and after the first of them is
   the index's memory. `store.fingerprints` (the fetch alone) is timed as often.
4. **Look-ups**, `--queries` (1000) of them after `--warmup` (20), half a restatement of a
   stored memory (its text, its fingerprint plus noise: cosine about 0.95), half a new
   memory (a text not stored, a random fingerprint). For each query, in an order that
   rotates from one query to the next, so all subjects share the machine's conditions:
   - `faiss`: `PersonIndex.search` of the index just built (the project's class, k = the
     keeper's `candidates`, 8);
   - `numpy`: the baseline, a plain brute-force dot product over the same matrix, then
     `argpartition` for the k best, mapped to memory ids the same way;
   - `index`: `FingerprintIndex.search`, what the keeper calls: it reads the person's
     generation from PostgreSQL first, and above 2,048 memories searches in a worker thread.
   Then, at the sizes in `--keeper-sizes` (10000), a second pass over the same queries
   (these read thousands of rows: interleaved, their garbage and their PostgreSQL work
   would land in the figures above), in the same rotating order:
   - `keeper`: the whole recognition look-up of `MemoryKeeper.remember`, without the
     embedding of the text (`bench.fingerprint` measures that) and without the write that
     follows: under the keeper's per-person lock, `_candidates` (index search, the rows of
     the hits, and the active memories with the same letters and digits as the new
     one, for the verbatim tier) then `recognise`;
   - `verbatim`: that indexed query (`MemoryStore.candidates` with no ids) alone.
   What each recognition decided is counted: a restatement should be taken for the memory
   it restates, a new memory for none.
5. Prints a table, and with `--json PATH` writes the report (the folder is created).

Exit code 0 when the `faiss` p99 at 10,000 memories is under 2 ms for every dimension
measured (or 10,000 is not among the sizes), 1 when it is not, 2 when the run could not
finish. The other subjects are compared with the target in the report, never in the code.
"""

from __future__ import annotations

import os
import sys

from bench import results
from bench.threads import THREAD_VARIABLES as _THREAD_VARIABLES
from bench.threads import pin_threads

_THREADS = pin_threads(sys.argv[1:], running=__name__ == "__main__")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import gc  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Awaitable, Callable, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import UTC, datetime, timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402
from uuid import UUID  # noqa: E402

import asyncpg  # noqa: E402
import faiss  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402

from actors.clock import SystemClock  # noqa: E402
from actors.memory.keeper import MemoryKeeper  # noqa: E402
from actors.memory.recognition import Candidate, Verdict, recognise  # noqa: E402
from bench.procs import process_rss_mb  # noqa: E402
from providers.embedding import EmbeddingError  # noqa: E402
from storage.embedded import EmbeddedPostgres  # noqa: E402
from storage.fingerprints import encode  # noqa: E402
from storage.memories import MemoryStore  # noqa: E402
from storage.memory_index import FingerprintIndex, PersonIndex  # noqa: E402
from storage.records import MemoryDraft  # noqa: E402
from storage.store import Store  # noqa: E402

DESCRIPTION = "memory fingerprint look-up for one person: faiss index against numpy, on one core"
TARGET_MS = 2.0
TARGET_SIZE = 10_000
MODELS = {
    384: "all-MiniLM-L6-v2",
    896: "all-MiniLM-L6-v2+use-multilingual-v3",
    1536: "text-embedding-3-small",
}
RESTATEMENT_NOISE = 0.33  # stored + 0.33 * random unit: cosine about 1 / sqrt(1 + 0.33^2)
COPY_COLUMNS = (
    "id",
    "person",
    "kind",
    "text",
    "created_at",
    "first_mentioned",
    "last_mentioned",
    "people",
    "themes",
    "fingerprint",
    "fingerprint_model",
)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

PEOPLE = ["Owen", "Hannah", "Maya", "Lucas", "Priya", "Tomás", "Aunt Rose", "Dr Patel"]
PLACES = ["Bristol", "Lisbon", "Porto", "the lab", "the allotment", "Leeds", "the station"]
DAYS = ["Monday", "Tuesday", "Friday", "Saturday", "next week", "the 14th", "tomorrow"]
# `{n}` is a serial, so no two texts are the same: a new memory is never a verbatim copy.
FACTS = [
    "Locker {n} at the gym is mine",
    "{p} lives at number {n} in {l}",
    "The door code at {l} is {n}",
    "Flight {n} to {l} leaves on {d}",
    "Remind me to call {p} about invoice {n} on {d}",
    "{p}'s birthday present, order {n}, arrives {d}",
    "Dentist appointment with {p} on {d}, booking {n}",
    "I lent {p} {n} pounds for the trip to {l}",
    "Pick up parcel {n} from the shop near {l} before {d}",
    "{p} is allergic to peanuts, noted on form {n}",
    "We are painting room {n} green on {d}, {p} is bringing brushes",
    "The bus to {l} is the {n}, it leaves from the stop by the bakery",
]
TAILS = [
    "It matters because last time we forgot and had to rebook everything at twice the price.",
    "{p} said the easiest way there is the early train, then a short walk from the station.",
    "I need to bring the documents, the spare keys and the charger, and tell {p} beforehand.",
]


def memory_text(rng: random.Random, serial: int) -> tuple[str, str]:
    """A memory-like text holding `serial`, and the person it names. Four in five are one
    short sentence, the rest carry one more sentence, as people dictate them."""
    person = rng.choice(PEOPLE)
    fill = {"p": person, "l": rng.choice(PLACES), "d": rng.choice(DAYS), "n": serial}
    text = rng.choice(FACTS).format(**fill) + "."
    if rng.random() < 0.2:
        text += " " + rng.choice(TAILS).format(**fill)
    return text, person


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    rows = rng.standard_normal((n, dim), dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


def numpy_search(
    matrix: np.ndarray, ids: Sequence[UUID], vector: np.ndarray, k: int
) -> list[tuple[UUID, float]]:
    """The baseline: every inner product with one matrix-vector product, the k best by
    `argpartition`, best first, mapped to memory ids like `PersonIndex.search` does."""
    scores = matrix @ vector
    k = min(k, len(scores))
    top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    top = top[np.argsort(-scores[top])]
    return [(ids[i], float(scores[i])) for i in top.tolist()]


class LookupOnlyEmbedder:
    """Names the model and its dimension, and refuses to embed: no embedding is timed."""

    def __init__(self, name: str, dim: int) -> None:
        self.name = name
        self.dim = dim

    async def embed(self, texts: list[str]) -> np.ndarray:
        raise EmbeddingError("bench", "the look-up bench never embeds")

    async def close(self) -> None:
        return None


@dataclass
class Person:
    """What the bench stored for one person: ids, texts and fingerprints, in order."""

    key: str
    model: str
    dim: int
    matrix: np.ndarray
    ids: list[UUID] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    people: list[str] = field(default_factory=list)


@dataclass
class Query:
    kind: str  # "restated" or "new"
    draft: MemoryDraft
    vector: np.ndarray
    source: UUID | None = None  # the stored memory a restatement restates


def rss_mb() -> float:
    return process_rss_mb(psutil.Process())


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "n": 0}
    p50, p95, p99 = np.percentile(np.asarray(values), [50, 95, 99])
    return {
        "p50": round(float(p50), 4),
        "p95": round(float(p95), 4),
        "p99": round(float(p99), 4),
        "mean": round(float(np.mean(values)), 4),
        "n": len(values),
    }


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    return {
        k: round(a[k] / b[k], 2) if a.get(k) is not None and b.get(k) else None
        for k in ("p50", "p95", "p99")
    }


# -- data -----------------------------------------------------------------------------------


async def top_up(
    conn: asyncpg.Connection, person: Person, size: int, rng: random.Random
) -> dict[str, Any]:
    """Bring the person to `size` active memories with one COPY; seconds it took."""
    first = len(person.ids)
    count = size - first
    if count <= 0:
        return {"inserted": 0, "insert_s": 0.0}
    vectors = unit_rows(np.random.default_rng(rng.getrandbits(64)), count, person.dim)
    person.matrix[first:size] = vectors
    records = []
    for offset in range(count):
        serial = first + offset + 1
        text, named = memory_text(rng, serial)
        memory = uuid.UUID(int=rng.getrandbits(128), version=4)
        at = EPOCH + timedelta(seconds=serial)
        person.ids.append(memory)
        person.texts.append(text)
        person.people.append(named)
        fingerprint = encode(vectors[offset])
        records.append(
            (memory, person.key, "fact", text, at, at, at, [named], [], fingerprint, person.model)
        )
    started = time.perf_counter()
    await conn.copy_records_to_table("cards", records=records, columns=COPY_COLUMNS)
    insert_s = time.perf_counter() - started
    await conn.execute("ANALYZE cards")
    return {"inserted": count, "insert_s": round(insert_s, 3)}


def make_queries(person: Person, count: int, rng: random.Random, size: int) -> list[Query]:
    """Alternately a restatement of a stored memory and a new memory."""
    np_rng = np.random.default_rng(rng.getrandbits(64))
    queries = []
    for i in range(count):
        if i % 2 == 0:
            row = rng.randrange(size)
            noise = unit_rows(np_rng, 1, person.dim)[0]
            vector = person.matrix[row] + RESTATEMENT_NOISE * noise
            vector = (vector / np.linalg.norm(vector)).astype(np.float32)
            draft = MemoryDraft(person.texts[row], "fact", (person.people[row],))
            queries.append(Query("restated", draft, vector, person.ids[row]))
        else:
            text, named = memory_text(rng, 10_000_000 + i)
            queries.append(
                Query(
                    "new", MemoryDraft(text, "fact", (named,)), unit_rows(np_rng, 1, person.dim)[0]
                )
            )
    return queries


# -- measuring ------------------------------------------------------------------------------


async def measure_build(
    keeper: MemoryKeeper, person: Person, probe: np.ndarray, builds: int
) -> dict[str, Any]:
    """The first look-up after the index was dropped builds it from PostgreSQL."""
    index = keeper.index
    first_ms: list[float] = []
    fetch_ms: list[float] = []
    rss_before = rss_after = 0.0
    builds_before = index.builds
    for b in range(builds):
        index.drop(person.key)
        gc.collect()
        if b == 0:
            rss_before = rss_mb()
        started = time.perf_counter()
        await index.search(person.key, probe, keeper.candidates)
        first_ms.append((time.perf_counter() - started) * 1000)
        if b == 0:
            gc.collect()
            rss_after = rss_mb()
    for _ in range(builds):
        started = time.perf_counter()
        snapshot = await keeper.store.fingerprints(person.key, person.model)
        fetch_ms.append((time.perf_counter() - started) * 1000)
        del snapshot
    size = len(person.ids)
    return {
        "first_lookup_ms": round(statistics.median(first_ms), 1),
        "first_lookup_ms_all": [round(x, 1) for x in first_ms],
        "fetch_ms": round(statistics.median(fetch_ms), 1),
        "builds_counted": index.builds - builds_before,
        "rss_delta_mb": round(rss_after - rss_before, 1),
        "vectors_mb": round(size * person.dim * 4 / (1024 * 1024), 1),
    }


async def recognition_lookup(
    keeper: MemoryKeeper, person: str, draft: MemoryDraft, vector: np.ndarray
) -> tuple[list[Candidate], Verdict]:
    """What `MemoryKeeper.remember` does between the embedding and the write."""
    async with keeper._lock(person):
        candidates = await keeper._candidates(person, draft, vector)
        return candidates, recognise(draft, candidates)


async def verbatim_rows(keeper: MemoryKeeper, person: str, draft: MemoryDraft) -> int:
    """The verbatim tier's query alone: the active memories with the draft's letters."""
    found, _, _ = await keeper.store.candidates(person, (), draft.text)
    return len(found)


def keeper_outcomes(
    queries: list[Query],
    looked_up: list[tuple[list[Candidate], Verdict]],
    verbatim: list[int],
    size: int,
) -> dict[str, Any]:
    """What the recognition look-ups decided: a restatement should be taken for the memory
    it restates, a new memory for none."""
    verdicts: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for query, (_, verdict) in zip(queries, looked_up, strict=True):
        match = verdict.match
        verdicts[f"{query.kind}:{match.tier if match is not None else 'none'}"] += 1
        if query.kind == "new":
            outcomes["new_taken_for_an_existing_memory" if match else "new_kept_new"] += 1
        elif match is None:
            outcomes["restated_not_recognised"] += 1
        elif match.existing.id == query.source:
            outcomes["restated_taken_for_its_memory"] += 1
        else:
            outcomes["restated_taken_for_another_memory"] += 1
    counts = [len(found) for found, _ in looked_up]
    return {
        "candidates": {
            "p50": float(np.percentile(counts, 50)),
            "max": max(counts),
            "mean": round(float(np.mean(counts)), 1),
        },
        "verbatim_rows": {
            "p50": float(np.percentile(verbatim, 50)),
            "max": max(verbatim),
            "share_of_memories": round(float(np.mean(verbatim)) / size, 5),
        },
        "verdicts": dict(sorted(verdicts.items())),
        "outcomes": dict(sorted(outcomes.items())),
    }


def text_lengths(texts: Sequence[str]) -> dict[str, int]:
    lengths = np.asarray([len(t) for t in texts])
    p10, p50, p90 = np.percentile(lengths, [10, 50, 90])
    return {
        "min": int(lengths.min()),
        "p10": int(p10),
        "p50": int(p50),
        "p90": int(p90),
        "max": int(lengths.max()),
    }


Timed = Callable[[Query], Awaitable[Any]]


@dataclass
class Timings:
    wall: dict[str, list[float]]  # ms from call to return
    cpu: dict[str, list[float]]  # ms of CPU this thread spent in the call
    results: dict[str, list[Any]]


async def time_subjects(subjects: dict[str, Timed], queries: list[Query], warmup: int) -> Timings:
    """Milliseconds per look-up of each subject (wall clock, and this thread's CPU time),
    the order rotating query by query, and what each returned. A wall time well above
    its CPU time was spent waiting: for the database, a worker thread, or a CPU that
    something else was using."""
    names = list(subjects)
    for query in queries[:warmup]:
        for name in names:
            await subjects[name](query)
    gc.collect()
    out = Timings({n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names})
    for i, query in enumerate(queries):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            cpu = time.thread_time_ns()
            started = time.perf_counter_ns()
            result = await subjects[name](query)
            out.wall[name].append((time.perf_counter_ns() - started) / 1e6)
            out.cpu[name].append((time.thread_time_ns() - cpu) / 1e6)
            out.results[name].append(result)
    return out


def _sync(fn: Callable[[Query], Any]) -> Timed:
    async def run(query: Query) -> Any:
        return fn(query)

    return run


async def measure_size(
    keeper: MemoryKeeper,
    person: Person,
    queries: list[Query],
    args: argparse.Namespace,
    with_keeper: bool,
) -> dict[str, Any]:
    index: FingerprintIndex = keeper.index
    size, k = len(person.ids), keeper.candidates
    built: PersonIndex | None = index.cached(person.key)
    if built is None or len(built) != size:
        raise RuntimeError(f"the index of {person.key} holds {built and len(built)}, not {size}")
    matrix, ids = person.matrix[:size], person.ids[:size]
    subjects: dict[str, Timed] = {
        "faiss": _sync(lambda q: built.search(q.vector, k)),
        "numpy": _sync(lambda q: numpy_search(matrix, ids, q.vector, k)),
        "index": lambda q: index.search(person.key, q.vector, k),
    }
    builds_before = index.builds
    timed = await time_subjects(subjects, queries, args.warmup)
    if with_keeper:
        # A second pass: each of these reads thousands of rows, and interleaved with the
        # first pass its garbage and its PostgreSQL work would land in their figures.
        heavy: dict[str, Timed] = {
            "keeper": lambda q: recognition_lookup(keeper, person.key, q.draft, q.vector),
            "verbatim": lambda q: verbatim_rows(keeper, person.key, q.draft),
        }
        more = await time_subjects(heavy, queries, args.warmup)
        timed.wall.update(more.wall)
        timed.results.update(more.results)
    if index.builds != builds_before:
        raise RuntimeError("the index was rebuilt during the look-ups: the data moved")
    stats = {name: percentiles(values) for name, values in timed.wall.items()}
    # CPU time only where all the work is on this thread (`index` hands it to a worker).
    cpu = {name: percentiles(timed.cpu[name]) for name in ("faiss", "numpy")}
    results = timed.results
    agree = sum(
        {i for i, _ in f} == {i for i, _ in n}
        for f, n in zip(results["faiss"], results["numpy"], strict=True)
    )
    out: dict[str, Any] = {
        "lookup_ms": stats,
        "cpu_ms": cpu,
        "faiss_over_numpy": ratios(stats["faiss"], stats["numpy"]),
        "faiss_over_numpy_cpu": ratios(cpu["faiss"], cpu["numpy"]),
        "topk_agreement": round(agree / len(queries), 4),
        "index_offloaded": size > index.offload_above,
        "keeper": None,
    }
    if with_keeper:
        out["keeper"] = keeper_outcomes(queries, results["keeper"], results["verbatim"], size)
        out["keeper"]["keeper_over_faiss"] = ratios(stats["keeper"], stats["faiss"])
    return out


async def measure_dim(
    dsn: str, dim: int, args: argparse.Namespace, rng: random.Random
) -> list[dict[str, Any]]:
    """Every size for one dimension, one person, one keeper (its own pool, as the server's)."""
    model = MODELS.get(dim, f"bench-{dim}")
    matrix = np.empty((max(args.sizes), dim), dtype=np.float32)
    person = Person(f"bench-lookup-{dim}", model, dim, matrix)
    store = await MemoryStore.open(dsn)
    keeper = MemoryKeeper(store, LookupOnlyEmbedder(model, dim), SystemClock())
    conn = await asyncpg.connect(dsn)
    rows = []
    try:
        for size in sorted(args.sizes):
            inserted = await top_up(conn, person, size, rng)
            queries = make_queries(person, args.queries, rng, size)
            build = await measure_build(keeper, person, queries[0].vector, args.builds)
            with_keeper = size in args.keeper_sizes
            measured = await measure_size(keeper, person, queries, args, with_keeper)
            rows.append({"dim": dim, "model": model, "size": size, "k": keeper.candidates})
            rows[-1].update(inserted, build=build)
            rows[-1].update(measured, text_length=text_lengths(person.texts))
            print(f"measured: {dim} dims, {size} memories", file=sys.stderr, flush=True)
            # The next size starts from a dropped index (its build is measured cold).
            keeper.index.drop(person.key)
        return rows
    finally:
        await conn.close()
        await keeper.close()
        await store.close()


# -- the run --------------------------------------------------------------------------------


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def blas_info() -> list[dict[str, Any]] | None:
    """The BLAS and OpenMP pools actually loaded, when threadpoolctl is there to tell."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    return [
        {k: pool.get(k) for k in ("internal_api", "num_threads", "version")}
        for pool in threadpool_info()
    ]


def thread_settings() -> dict[str, Any]:
    return {
        "requested": _THREADS,
        "environment": {name: os.environ.get(name) for name in _THREAD_VARIABLES},
        "faiss_omp_max_threads": faiss.omp_get_max_threads(),
        "pools": blas_info(),
    }


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        if row["size"] != TARGET_SIZE:
            continue
        for subject in ("faiss", "index", "keeper"):
            stats = row["lookup_ms"].get(subject)
            if stats is not None:
                p99 = stats["p99"]
                out.append(
                    {
                        "dim": row["dim"],
                        "size": row["size"],
                        "subject": subject,
                        "p99_ms": p99,
                        "target_ms": TARGET_MS,
                        "met": p99 < TARGET_MS,
                    }
                )
                if subject in row["cpu_ms"]:
                    out[-1]["cpu_p99_ms"] = row["cpu_ms"][subject]["p99"]
    return out


async def measure(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    load_before = load_average()
    store = await Store.open(dsn)  # runs the migrations
    await store.close()
    conn = await asyncpg.connect(dsn)
    try:
        version = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    for dim in args.dims:
        rows += await measure_dim(dsn, dim, args, rng)
    return {
        "bench": "memory_lookup",
        "description": DESCRIPTION,
        "threads": thread_settings(),
        "k": rows[0]["k"] if rows else None,
        "queries": args.queries,
        "warmup": args.warmup,
        "builds": args.builds,
        "sizes": sorted(args.sizes),
        "dims": args.dims,
        "keeper_sizes": sorted(args.keeper_sizes),
        "seed": args.seed,
        "target": {"p99_ms": TARGET_MS, "size": TARGET_SIZE, "subject": "faiss"},
        "results": rows,
        "targets": targets(rows),
        "postgres": {"version": version, "insert": "one COPY per top-up, then ANALYZE cards"},
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpu_count_physical": psutil.cpu_count(logical=False),
            "memory_mb": round(psutil.virtual_memory().total / (1024 * 1024)),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "faiss": faiss.__version__,
            "load_average_before": load_before,
            "load_average_after": load_average(),
        },
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def _ms(value: float | None) -> str:
    return f"{value:9.3f}" if value is not None else f"{'-':>9}"


def table(report: dict[str, Any]) -> str:
    threads = report["threads"]
    lines = [
        f"{DESCRIPTION}",
        f"k={report['k']}, {report['queries']} queries (+{report['warmup']} warm-up) per size, "
        f"threads {threads['requested']} (OMP/OPENBLAS_NUM_THREADS="
        f"{threads['environment']['OMP_NUM_THREADS']}/"
        f"{threads['environment']['OPENBLAS_NUM_THREADS']}, faiss uses "
        f"{threads['faiss_omp_max_threads']}), PostgreSQL {report['postgres']['version']}, "
        f"load {report['machine']['load_average_before']} -> "
        f"{report['machine']['load_average_after']}",
        f"{'dim':>5} {'memories':>9}  {'subject':<12}"
        f"{'p50':>9}{'p95':>9}{'p99':>9}{'mean':>9}  (ms)",
    ]
    for row in report["results"]:
        head = f"{row['dim']:>5} {row['size']:>9}"
        for name, s in row["lookup_ms"].items():
            lines.append(
                f"{head}  {name:<12}{_ms(s['p50'])}{_ms(s['p95'])}{_ms(s['p99'])}{_ms(s['mean'])}"
            )
            head = " " * 15
        for name, s in row["cpu_ms"].items():
            label = f"{name} cpu"
            lines.append(
                f"{head}  {label:<12}{_ms(s['p50'])}{_ms(s['p95'])}{_ms(s['p99'])}{_ms(s['mean'])}"
            )
        r = row["faiss_over_numpy"]
        lines.append(
            f"{head}  {'faiss/numpy':<12}{_ms(r['p50'])}{_ms(r['p95'])}{_ms(r['p99'])}"
            f"   top-k agree {row['topk_agreement']:.1%}"
        )
    lines.append("index built from PostgreSQL by the first look-up after a drop (median):")
    lines.append(
        f"{'dim':>5} {'memories':>9} {'insert s':>9} {'fetch ms':>9} {'first ms':>9} "
        f"{'rss +MB':>9} {'vectors MB':>11}"
    )
    for row in report["results"]:
        b = row["build"]
        lines.append(
            f"{row['dim']:>5} {row['size']:>9} {row['insert_s']:>9.2f} {b['fetch_ms']:>9.1f} "
            f"{b['first_lookup_ms']:>9.1f} {b['rss_delta_mb']:>9.1f} {b['vectors_mb']:>11.1f}"
        )
    for row in report["results"]:
        keeper = row["keeper"]
        if keeper is not None:
            c, w, t = keeper["candidates"], keeper["verbatim_rows"], row["text_length"]
            lines.append(
                f"keeper at {row['dim']} dims, {row['size']} memories: candidates per look-up "
                f"p50 {c['p50']:.0f} (max {c['max']}), verbatim rows p50 {w['p50']:.0f} "
                f"(max {w['max']}; texts {t['p10']}-{t['p90']} characters, p10-p90)"
            )
            lines.append(f"  outcomes {keeper['outcomes']}")
    for t in report["targets"]:
        verdict = "met" if t["met"] else "NOT met"
        lines.append(
            f"target p99 < {t['target_ms']:g} ms at {t['size']}: {t['dim']} dims, "
            f"{t['subject']:<6} p99 {t['p99_ms']:.3f} ms: {verdict}"
            + (f" (CPU time p99 {t['cpu_p99_ms']:.3f} ms)" if "cpu_p99_ms" in t else "")
        )
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    if text.strip().lower() == "none":
        return []
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of integers, not {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"positive integers, not {text!r}")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_lookup", description=DESCRIPTION)
    parser.add_argument(
        "--sizes", type=_int_list, default=[1000, 10_000, 100_000],
        help="memories of the one person (1000,10000,100000)",
    )  # fmt: skip
    parser.add_argument(
        "--dims", type=_int_list, default=[896, 1536], help="fingerprint dimensions (896,1536)"
    )
    parser.add_argument(
        "--keeper-sizes", type=_int_list, default=[TARGET_SIZE],
        help="sizes at which the keeper's recognition look-up is timed (10000; none: never)",
    )  # fmt: skip
    parser.add_argument("--queries", type=int, default=1000, help="timed look-ups per size (1000)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed look-ups first (20)")
    parser.add_argument("--builds", type=int, default=3, help="timed index builds per size (3)")
    parser.add_argument(
        "--threads", type=int, default=1, help="thread pool size, set before numpy loads (1)"
    )
    parser.add_argument("--seed", type=int, default=11, help="seed of the data and queries (11)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="bound on the run (s)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "memory_lookup")
    args = parser.parse_args(argv)
    if args.queries < 2 or args.warmup < 0 or args.builds < 1 or args.threads < 1:
        parser.error("--queries >= 2, --warmup >= 0, --builds >= 1, --threads >= 1")
    if not args.sizes or not args.dims:
        parser.error("--sizes and --dims need at least one value")
    if args.warmup > args.queries:
        parser.error("--warmup cannot exceed --queries")
    return args


async def _bounded(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    async with asyncio.timeout(args.timeout):
        return await measure(dsn, args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start an embedded PostgreSQL in a tmp folder, measure, stop it, remove the folder."""
    faiss.omp_set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="stillhere-lookup-"))
    try:
        postgres = EmbeddedPostgres(root)
        try:
            return asyncio.run(_bounded(postgres.dsn, args))
        finally:
            postgres.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except TimeoutError:
        print(f"bench failed: not done within {args.timeout:g} s", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, asyncpg.PostgresError) as failed:
        print(f"bench failed: {type(failed).__name__}: {failed}", file=sys.stderr)
        return 2
    print(table(report))
    results.save(args, report)
    return 0 if all(t["met"] for t in report["targets"] if t["subject"] == "faiss") else 1


if __name__ == "__main__":
    sys.exit(main())
