"""Fingerprint benchmark: what one memory's fingerprint costs with the local model, on one core.

Every new memory is fingerprinted before it can be recognised, so the local default (the
pair all-MiniLM-L6-v2 on ONNX Runtime + USE multilingual v3 in numpy) must be cheap enough to run on
the server's own CPU: the target is under 20 ms per memory on one core. Run:

    .venv/bin/python -m bench.fingerprint --json bench/out/fingerprint.json
    .venv/bin/python -m bench.fingerprint --singles 100 --batches 10      # quick check

What it does, in one process:

1. Before numpy is imported, limits every thread pool to `--threads` (1): OpenBLAS, OpenMP,
   MKL, and the tokenizer's Rust pool; and pins the process to one CPU (`--no-pin` to
   skip), so "one core" holds even for a library that ignores the variables.
2. Makes a fixed set of memory-like sentences (seeded by `--seed`): mostly one short
   sentence, some a few sentences long, as people dictate them.
3. Loads the model (timed: `load_s`) and warms every subject up.
4. Times five subjects on the same texts, interleaved call by call so that they share the
   machine's conditions: `paired` (the local default: both models, one after the other, as
   `Paired.embed` runs them), `minilm` (`MiniLM.embed_sync`, what `MiniLM.embed` runs in
   its worker thread), `use` (USE multilingual alone), `tokenizer` (MiniLM's tokenizer
   alone: the floor of any BERT-style model) and `hashing` (a feature-hashing embedder:
   what a fingerprint costs with no model at all).
   Each call runs in a worker thread through `asyncio.to_thread`, like the server's, and is
   timed twice: `cpu`, the CPU time of the worker thread (the cost on one core, which a
   busy machine barely changes), and `wall`, from the await to the answer (what a caller
   waits on an otherwise idle core, thread hop included).
5. Does so for single texts (`--singles` calls, one text each: a memory made during a turn)
   and for batches of `--batch` (32) texts (`--batches` calls: the back-fill pass). Each
   call's time is divided by its number of texts: milliseconds per memory.
6. Prints a table, and with `--json PATH` writes the report.

The report says, for each mode, whether p50, p95 and p99 of the `paired` CPU time per memory
are under the target, and breaks its single-text cost down by length in MiniLM tokens: the
cost grows with the text, so a p99 over the target is read there (which lengths cross it).
Exit code 0 when a typical memory (p50) is under the target in both modes, 1 when it is not.
"""

from __future__ import annotations

import os
import sys

from bench import results
from bench.threads import pin_threads

_THREADS = pin_threads(sys.argv[1:], running=__name__ == "__main__")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import hashlib  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from providers.embedding import normalise_rows  # noqa: E402
from providers.minilm import DIM, MiniLM  # noqa: E402
from providers.multilingual import UseMultilingual  # noqa: E402

TARGET_MS = 20.0
TOKEN_BUCKETS = ((1, 16), (17, 24), (25, 40), (41, 256))
DESCRIPTION = "fingerprint cost per memory with the local model, on one core"

PEOPLE = ["Owen", "Hannah", "Maya", "Lucas", "Priya", "Tomás", "Aunt Rose", "Dr Patel"]
PLACES = ["Bristol", "Lisbon", "Porto", "the lab", "the allotment", "Leeds", "the station"]
DAYS = ["Monday", "Tuesday", "Friday", "Saturday", "next week", "the 14th", "tomorrow"]
FACTS = [
    "My brother {p} lives in {l}",
    "{p} works at {l} now",
    "I'm going to see {p} in {l} on {d}",
    "Remind me to call {p} on {d}",
    "{p}'s birthday is on {d}, she wants a book about gardening",
    "The trip to {l} is booked for {d}, flights leave at 7:40",
    "{p} is allergic to peanuts and shellfish",
    "Pick up the prescription from the pharmacy near {l} before {d}",
    "Dentist appointment with {p} on {d} at 3 pm",
    "I prefer oat milk in my coffee",
    "Owen, that's my brother, he works in a lab in {l}",
    "We are painting the kitchen green on {d}, {p} is bringing brushes",
]
TAILS = [
    "It matters because last time we forgot and had to rebook everything at twice the price.",
    "{p} said the easiest way there is the early train, then a short walk from the station.",
    "I need to bring the documents, the spare keys and the charger, and tell {p} beforehand.",
    "If it rains we will move it indoors, and {p} will let everyone know the night before.",
]


def memories(count: int, seed: int) -> list[str]:
    """Memory-like texts: four in five one sentence, the rest two or three sentences."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        fill = {"p": rng.choice(PEOPLE), "l": rng.choice(PLACES), "d": rng.choice(DAYS)}
        text = rng.choice(FACTS).format(**fill) + "."
        if rng.random() < 0.2:
            for _ in range(rng.randint(1, 2)):
                text += " " + rng.choice(TAILS).format(**fill)
        out.append(text)
    return out


def hashing_embed(texts: list[str]) -> np.ndarray:
    """A fingerprint with no model: signed feature hashing of lower-cased words."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in text.lower().split():
            digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % DIM
            out[row, bucket] += 1.0 if digest[4] & 1 else -1.0
        if not out[row].any():
            out[row, 0] = 1.0
    return normalise_rows(out)


def percentiles(values: Sequence[float]) -> dict[str, float]:
    p50, p95, p99 = np.percentile(np.asarray(values), [50, 95, 99])
    return {
        "p50": round(float(p50), 3),
        "p95": round(float(p95), 3),
        "p99": round(float(p99), 3),
        "mean": round(float(np.mean(values)), 3),
    }


def ratios(a: dict[str, float], b: dict[str, float]) -> dict[str, float | None]:
    return {k: round(a[k] / b[k], 1) if b[k] else None for k in ("p50", "p99")}


def by_tokens(tokens: list[int], ms: list[float]) -> list[dict[str, Any]]:
    """Single-text cost per length bucket (tokens include [CLS] and [SEP])."""
    out = []
    for low, high in TOKEN_BUCKETS:
        chosen = [t for n, t in zip(tokens, ms, strict=True) if low <= n <= high]
        if chosen:
            out.append({"tokens": f"{low}-{high}", "memories": len(chosen), **percentiles(chosen)})
    return out


Subject = Callable[[list[str]], Any]


def _cpu_timed(run: Subject, texts: list[str]) -> float:
    """Run in the worker thread: the CPU seconds that thread spent on the call."""
    start = time.thread_time()
    run(texts)
    return time.thread_time() - start


async def time_subjects(
    subjects: dict[str, Subject], calls: list[list[str]]
) -> dict[str, dict[str, list[float]]]:
    """Milliseconds per text of each call, wall and CPU, for each subject, interleaved call
    by call. Each call runs in a worker thread, as `MiniLM.embed` does in the server."""
    times: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in subjects}
    for texts in calls:
        for name, run in subjects.items():
            start = time.perf_counter()
            cpu = await asyncio.to_thread(_cpu_timed, run, texts)
            wall = time.perf_counter() - start
            times[name]["wall"].append(wall * 1000 / len(texts))
            times[name]["cpu"].append(cpu * 1000 / len(texts))
    return times


def pin_to_one_cpu() -> int | None:
    """Pin the process to the first CPU it may use; None where that is not possible."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def rss_mb() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return round(psutil.Process().memory_info().rss / (1024 * 1024), 1)


def blas_info() -> list[dict[str, Any]] | None:
    """The BLAS threads actually in use, when threadpoolctl is there to tell."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    return [
        {k: pool.get(k) for k in ("internal_api", "num_threads", "architecture", "version")}
        for pool in threadpool_info()
    ]


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15 minute load: anything else running skews the figures."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    load_before = load_average()
    pinned = None if args.no_pin else pin_to_one_cpu()
    rss_before = rss_mb()
    start = time.perf_counter()
    model, use = MiniLM(args.embed_path), UseMultilingual()
    await model.warm()
    await use.warm()
    load_s = time.perf_counter() - start
    rss_loaded = rss_mb()
    tokenizer = model.tokenizer  # the model's own, configured the same way

    # `MiniLM.embed` is `asyncio.to_thread(embed_sync)`: the harness makes that hop itself
    # so it can read the worker thread's CPU time.
    subjects: dict[str, Subject] = {
        "paired": lambda texts: (model.embed_sync(texts), use.embed_sync(texts)),
        "minilm": model.embed_sync,
        "use": use.embed_sync,
        "tokenizer": tokenizer.encode_batch,
        "hashing": hashing_embed,
    }
    singles = memories(args.singles, args.seed)
    batched = memories(args.batches * args.batch, args.seed + 1)
    singles_tokens = [len(e.ids) for e in tokenizer.encode_batch(singles)]
    tokens = singles_tokens + [len(e.ids) for e in tokenizer.encode_batch(batched)]
    # Warm-up: first calls pay for lazy allocations and thread start.
    await time_subjects(subjects, [[t] for t in singles[:10]] + [batched[: args.batch]] * 2)

    report: dict[str, Any] = {
        "bench": "fingerprint",
        "model": f"{model.name}+{use.name}",
        "dim": model.dim + use.dim,
        "weights": str(model.folder),
        "threads": _THREADS,
        "pinned_cpu": pinned,
        "target_ms_per_memory": TARGET_MS,
        "texts": {
            "singles": len(singles),
            "batches": args.batches,
            "batch_size": args.batch,
            "tokens": {
                "mean": round(float(np.mean(tokens)), 1),
                "p50": int(np.percentile(tokens, 50)),
                "max": int(max(tokens)),
            },
        },
        "load_s": round(load_s, 3),
        "rss_mb": {"before_load": rss_before, "loaded": rss_loaded},
    }
    modes = {
        "single": [[t] for t in singles],
        f"batch{args.batch}": [
            batched[i : i + args.batch] for i in range(0, len(batched), args.batch)
        ],
    }
    times_by_mode: dict[str, dict[str, dict[str, list[float]]]] = {}
    for mode, calls in modes.items():
        times = times_by_mode[mode] = await time_subjects(subjects, calls)
        entry: dict[str, Any] = {"calls": len(calls)}
        for clock in ("cpu", "wall"):
            stats = {name: percentiles(t[clock]) for name, t in times.items()}
            entry[f"{clock}_ms_per_memory"] = stats
            entry[f"{clock}_minilm_over_tokenizer"] = ratios(stats["minilm"], stats["tokenizer"])
            entry[f"{clock}_minilm_over_hashing"] = ratios(stats["minilm"], stats["hashing"])
        cpu = entry["cpu_ms_per_memory"]["paired"]
        entry["under_target"] = {k: cpu[k] < TARGET_MS for k in ("p50", "p95", "p99")}
        report[mode] = entry
    report["single_by_tokens"] = by_tokens(singles_tokens, times_by_mode["single"]["paired"]["cpu"])
    report["machine"] = {
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas_info(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }
    await model.close()
    await use.close()
    return report


def print_table(report: dict[str, Any], modes: list[str]) -> None:
    machine = report["machine"]
    print(
        f"{DESCRIPTION}: {report['model']} from {report['weights']}\n"
        f"threads {report['threads']}, pinned to CPU {report['pinned_cpu']}, "
        f"load {report['load_s']} s, tokens per text mean {report['texts']['tokens']['mean']} "
        f"(max {report['texts']['tokens']['max']}), machine load before/after "
        f"{machine['load_average_before']} / {machine['load_average_after']}"
    )
    header = (
        f"{'mode':<9} {'subject':<10} {'cpu p50':>8} {'cpu p95':>8} {'cpu p99':>8} "
        f"{'wall p50':>9} {'wall p99':>9}   (ms per memory)"
    )
    print(header)
    print("-" * len(header))
    for mode in modes:
        entry = report[mode]
        for name, cpu in entry["cpu_ms_per_memory"].items():
            wall = entry["wall_ms_per_memory"][name]
            print(
                f"{mode:<9} {name:<10} {cpu['p50']:>8.3f} {cpu['p95']:>8.3f} {cpu['p99']:>8.3f} "
                f"{wall['p50']:>9.3f} {wall['p99']:>9.3f}"
            )
        over_tok = entry["cpu_minilm_over_tokenizer"]
        over_hash = entry["cpu_minilm_over_hashing"]
        verdict = ", ".join(
            f"{k} {'under' if ok else 'OVER'}" for k, ok in entry["under_target"].items()
        )
        print(
            f"{mode:<9} cpu minilm/tokenizer p50 {over_tok['p50']}x p99 {over_tok['p99']}x; "
            f"minilm/hashing p50 {over_hash['p50']}x p99 {over_hash['p99']}x"
        )
        print(f"{mode:<9} cpu of the pair against the {TARGET_MS:g} ms target: {verdict}")
    print("single texts by length (paired, cpu ms per memory):")
    for row in report["single_by_tokens"]:
        print(
            f"  {row['tokens']:>7} tokens  {row['memories']:>4} memories  p50 {row['p50']:>7.3f}"
            f"  p95 {row['p95']:>7.3f}  p99 {row['p99']:>7.3f}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fingerprint", description=DESCRIPTION)
    parser.add_argument("--singles", type=int, default=400, help="single-text calls (400)")
    parser.add_argument("--batches", type=int, default=40, help="batched calls (40)")
    parser.add_argument("--batch", type=int, default=32, help="texts per batched call (32)")
    parser.add_argument(
        "--threads", type=int, default=1, help="thread pool size, set before numpy loads (1)"
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    parser.add_argument("--seed", type=int, default=7, help="seed of the texts (7)")
    parser.add_argument("--embed-path", default=None, help="folder of the weights")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "fingerprint")
    args = parser.parse_args(argv)
    if min(args.singles, args.batches, args.batch) <= 0:
        parser.error("--singles, --batches and --batch must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(measure(args))
    modes = ["single", f"batch{args.batch}"]
    print_table(report, modes)
    results.save(args, report)
    return 0 if all(report[mode]["under_target"]["p50"] for mode in modes) else 1


if __name__ == "__main__":
    sys.exit(main())
