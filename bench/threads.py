"""One core for a CPU benchmark: thread pools read their size once, when their library
loads, so a bench pins them before it imports numpy, faiss or the tokenizer.

This module imports nothing heavy, so a bench can import it first.
"""

from __future__ import annotations

import os

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "RAYON_NUM_THREADS",
)


def threads_from_argv(argv: list[str]) -> int:
    """`--threads N` read by hand, ahead of argparse (which checks it again later)."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--threads" and i + 1 < len(argv) else None
        if arg.startswith("--threads="):
            value = arg.split("=", 1)[1]
        if value is not None:
            return int(value) if value.isdigit() and int(value) > 0 else 1
    return 1


def pin_threads(argv: list[str], *, running: bool) -> int:
    """Size every pool from `--threads` (default 1). Only when the bench is `running`
    (`__name__ == "__main__"`): importing a bench must not change the importer's pools."""
    threads = threads_from_argv(argv)
    if running:
        for name in THREAD_VARIABLES:
            os.environ[name] = str(threads)
        os.environ["TOKENIZERS_PARALLELISM"] = "false" if threads == 1 else "true"
    return threads
