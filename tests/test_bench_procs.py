"""A bench's server processes: a bench stopped with SIGTERM stops them as at Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil

from bench.procs import PROJECT

# A bench in miniature: one server started, stopped in the `finally` that ends its run.
BENCH = """
import asyncio, sys
from pathlib import Path
from bench import procs

async def main():
    server = procs.start("link-bound", Path(sys.argv[1]), latency=0, rate=0)
    try:
        await procs.wait_ready(server)
        print(server.proc.pid, flush=True)
        await asyncio.sleep(120)
    finally:
        await procs.stopped(server)

asyncio.run(main())
"""


def test_a_bench_sent_sigterm_stops_its_servers_before_it_exits(tmp_path: Path) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH, str(tmp_path)],
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert bench.stdout is not None
        server = psutil.Process(int(bench.stdout.readline()))
        assert server.is_running()
        bench.send_signal(signal.SIGTERM)
        bench.wait(60)
        # The bench waited for its server to stop: it is gone, not left to run on.
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    finally:
        bench.kill()
        bench.wait()
