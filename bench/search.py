"""Search latency benchmark: how long "what do you know about Owen?" takes, on one core, as
one person's memories pile up. Target: p99 under 20 ms at 10,000 memories. Run:

    .venv/bin/python -m bench.search --json bench/out/search.json
    .venv/bin/python -m bench.search --sizes 1000 --queries 100     # quick check

What it does, in one process, against an embedded PostgreSQL in a tmp folder (removed at
the end) or `--db`:

1. Sets the numeric thread pools to `--threads` (1) before numpy loads.
2. Stores the labelled corpus of `evals/search_corpus.py` for one person, fingerprinted by
   the local pair (MiniLM and USE multilingual; `--embed-url` for an API), then tops it up
   with the corpus's seeded filler to each size of `--sizes` (1000,10000), ascending.
   Storing uses both cores; measuring does not: once stored, every thread of the process
   is pinned to one CPU (`--cpu`, 0), the worker threads the models and faiss use included.
3. For each size, `--queries` (500) searches after `--warmup` (20), cycling through the
   105 labelled queries, limit 5, each timed three ways in a rotating order:
   - `search`: `MemoryKeeper.search`, what the tool and the HTTP API call: the query's
     fingerprint, the name look-up, the index, the rows, the links;
   - `given_fingerprint`: `MemoryKeeper.search_by`, the same with the fingerprint made
     beforehand: what the database and the index cost;
   - `embed`: the query's fingerprint alone.
   Each is timed by the wall clock (`*_ms`) and by the CPU the process spent on it
   (`*_cpu_ms`, `time.process_time`: every thread of this process, not PostgreSQL's),
   which other work on a shared machine barely changes. The first search after storing,
   which builds the person's index, is reported apart (`first_ms`).
4. Prints a table, and with `--json PATH` writes the report.

Exit 0 when `search` p99 at 10,000 memories is under 20 ms (or 10,000 is not measured),
1 when not, 2 when the run could not finish.
"""

from __future__ import annotations

import sys

from bench import results
from bench.threads import pin_threads

_THREADS = pin_threads(sys.argv[1:], running=__name__ == "__main__")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from actors.clock import SystemClock  # noqa: E402
from actors.memory.keeper import MemoryKeeper  # noqa: E402
from actors.memory.setup import close_keeper, make_embedder, open_keeper  # noqa: E402
from bench.fingerprint import percentiles  # noqa: E402
from evals.search_corpus import (  # noqa: E402
    QUERIES,
    SMALLEST,
    filler,
    store_corpus,
    store_drafts,
)
from storage.embedded import migrated_database  # noqa: E402

TARGET_MS = 20.0
TARGET_SIZE = 10_000
PERSON = "bench-search"
LIMIT = 5
SUBJECTS = ("search", "given_fingerprint", "embed")


def pin(cpus: set[int]) -> None:
    """Every thread of this process on `cpus`: `sched_setaffinity(0)` moves only the
    calling thread, and threads made later inherit their maker's."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task), cpus)


async def grow(keeper: MemoryKeeper, size: int, stored: int) -> int:
    """Top the person's memories up to `size` with the corpus's filler; how many now."""
    if stored == 0:
        await store_corpus(keeper, PERSON, size, seed=0)
        return size
    drafts = filler(size - SMALLEST, seed=0)[stored - SMALLEST :]
    await store_drafts(keeper, PERSON, drafts)
    return size


async def time_size(keeper: MemoryKeeper, args: argparse.Namespace) -> dict[str, Any]:
    texts = [QUERIES[i % len(QUERIES)].text for i in range(args.warmup + args.queries)]
    started = time.perf_counter()
    await keeper.search(PERSON, texts[0], LIMIT)
    first_ms = (time.perf_counter() - started) * 1000
    vectors = [await keeper.meaning.embed(text) for text in texts]
    subjects: dict[str, Callable[[int], Awaitable[Any]]] = {
        "search": lambda i: keeper.search(PERSON, texts[i], LIMIT),
        "given_fingerprint": lambda i: keeper.search_by(PERSON, texts[i], vectors[i], LIMIT),
        "embed": lambda i: keeper.meaning.embed(texts[i]),
    }
    wall: dict[str, list[float]] = {name: [] for name in SUBJECTS}
    cpu: dict[str, list[float]] = {name: [] for name in SUBJECTS}
    for i in range(len(texts)):
        for turn in range(len(SUBJECTS)):  # rotated, so every subject meets the same load
            name = SUBJECTS[(i + turn) % len(SUBJECTS)]
            started, cpu_started = time.perf_counter(), time.process_time()
            await subjects[name](i)
            if i >= args.warmup:
                wall[name].append((time.perf_counter() - started) * 1000)
                cpu[name].append((time.process_time() - cpu_started) * 1000)
    index = keeper.index.cached(PERSON)
    return {
        "first_ms": round(first_ms, 3),
        "partitioned": bool(index and index.partitioned),
        **{f"{name}_ms": percentiles(values) for name, values in wall.items()},
        **{f"{name}_cpu_ms": percentiles(values) for name, values in cpu.items()},
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    embedder = make_embedder(args.embed_url, args.embed_model, args.embed_key)
    allowed = os.sched_getaffinity(0)
    rows = []
    async with migrated_database(args.db, None) as dsn:
        keeper = await open_keeper(dsn, embedder, SystemClock())
        try:
            await keeper.store.forget_persons(PERSON)
            stored = 0
            for size in sorted(args.sizes):
                pin(allowed)
                stored = await grow(keeper, size, stored)
                keeper.drop(PERSON)
                pin({args.cpu})
                rows.append({"size": size, **await time_size(keeper, args)})
            await keeper.store.forget_persons(PERSON)
        finally:
            pin(allowed)
            await close_keeper(keeper)
    return {
        "embedder": keeper.model,
        "threads": _THREADS,
        "cpu": args.cpu,
        "queries": args.queries,
        "limit": LIMIT,
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version()},
        "sizes": rows,
        "targets": [_target(row) for row in rows if row["size"] == TARGET_SIZE],
    }


def _target(row: dict[str, Any]) -> dict[str, Any]:
    p99 = row["search_ms"]["p99"]
    met = p99 < TARGET_MS
    return {
        "size": TARGET_SIZE,
        "subject": "search",
        "p99_ms": p99,
        "target_ms": TARGET_MS,
        "met": met,
    }


def table(report: dict[str, Any]) -> str:
    head = f"{'size':>7}  {'subject':<24}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'mean ms':>9}"
    lines = [f"search latency, {report['embedder']}, limit {report['limit']}, one core", head]
    for row in report["sizes"]:
        for name in SUBJECTS:
            for kind, label in (("", name), ("_cpu", f"{name} (CPU)")):
                p = row[f"{name}{kind}_ms"]
                lines.append(
                    f"{row['size']:>7}  {label:<24}{p['p50']:>9.2f}{p['p95']:>9.2f}"
                    f"{p['p99']:>9.2f}{p['mean']:>9.2f}"
                )
        lines.append(f"{row['size']:>7}  first search (builds the index): {row['first_ms']:.1f} ms")
    for t in report["targets"]:
        verdict = "met" if t["met"] else "NOT met"
        lines.append(
            f"target p99 < {t['target_ms']:g} ms at {t['size']}: {t['p99_ms']:.2f}, {verdict}"
        )
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers, not {text!r}") from None
    if not values or min(values) < SMALLEST:
        raise argparse.ArgumentTypeError(f"sizes of at least {SMALLEST} (the labelled corpus)")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.search",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", type=_sizes, default=[1000, TARGET_SIZE], help="1000,10000")
    parser.add_argument("--queries", type=int, default=500, help="timed searches per size")
    parser.add_argument("--warmup", type=int, default=20, help="untimed searches first (20)")
    parser.add_argument("--threads", type=int, default=1, help="numeric thread pools (1)")
    parser.add_argument("--cpu", type=int, default=0, help="the CPU to measure on (0)")
    parser.add_argument("--db", default=None, help="a PostgreSQL DSN instead of a tmp one")
    parser.add_argument("--embed-url", default=None, help="embeddings API (default: local)")
    parser.add_argument("--embed-model", default=None)
    parser.add_argument("--embed-key", default=None)
    parser.add_argument("--timeout", type=float, default=3600.0, help="bound on the run (s)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "search")
    args = parser.parse_args(argv)
    if args.queries < 2 or args.warmup < 0 or args.cpu not in os.sched_getaffinity(0):
        parser.error("--queries >= 2, --warmup >= 0, --cpu one this process may run on")
    return args


async def _bounded(args: argparse.Namespace) -> dict[str, Any]:
    async with asyncio.timeout(args.timeout):
        return await measure(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = asyncio.run(_bounded(args))
    except TimeoutError:
        print(f"bench failed: not done within {args.timeout:g} s", file=sys.stderr)
        return 2
    print(table(report))
    results.save(args, report)
    return 0 if all(t["met"] for t in report["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
