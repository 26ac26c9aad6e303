"""How many threads the numeric libraries may use: OpenBLAS under numpy and faiss, OpenMP
under faiss.

Each sizes its pool to the machine's cores, and after each call its idle workers spin for
a while before they sleep. On a server, fingerprints are made and searched a few at a time,
so a second thread barely speeds them up, while the spinning takes a core from the event
loop and PostgreSQL: in a 2,000-phone `bench flap` run on 2 cores, one such native thread
used a fifth of a core. One thread each is therefore the server's default.

OpenMP keeps its size per thread, so the limit holds in the thread that sets it (the
loop's); faiss work sent to a worker thread takes the loop's size along
(`storage.memory_index`).
"""

from __future__ import annotations

import logging

from threadpoolctl import threadpool_info, threadpool_limits

log = logging.getLogger("stillhere.server")


def limit_compute_threads(threads: int) -> dict[str, int]:
    """Size every loaded BLAS and OpenMP pool to `threads`; return each library's size.

    Only libraries already loaded are reached, so call it once numpy and faiss are
    imported (the server's modules import both)."""
    if threads < 1:
        raise ValueError(f"compute threads must be at least 1, not {threads}")
    threadpool_limits(limits=threads)
    sizes = {
        str(pool["filepath"]).rsplit("/", 1)[-1]: pool["num_threads"] for pool in threadpool_info()
    }
    log.info(
        "numeric libraries limited to %d thread(s): %s",
        threads,
        ", ".join(sorted(sizes)) or "none loaded",
    )
    return sizes
