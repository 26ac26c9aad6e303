"""Server processes for `bench.flap`: stillhere and the two baselines, started and stopped.

Every server runs as its own process on 127.0.0.1 with a free port and a tmp data dir, is
sampled with psutil (RSS, threads), and is stopped with SIGINT, then SIGKILL; an embedded
PostgreSQL left behind in its data dir is stopped too. stillhere started with a
certificate speaks HTTPS and WSS, and is reached verified against the run's own authority.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench import results
from bench.certificates import Pair
from client.links import verifying

HOST = "127.0.0.1"
LOG_TAIL_LINES = 40
PROBLEM_MARKERS = ("ERROR", "Traceback", "Exception", "CRITICAL")
READY_TIMEOUT_S = 180.0  # a first start runs initdb
STOP_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 15.0
PROJECT = Path(__file__).resolve().parent.parent

__all__ = [
    "HOST",
    "RssSampler",
    "Server",
    "ServerError",
    "clean_env",
    "finish",
    "free_ports",
    "log_problems",
    "log_tail",
    "main_thread_sched_s",
    "process_rss_mb",
    "start",
]


class ServerError(Exception):
    """A server did not start or died."""


@dataclass
class Server:
    name: str  # stillhere | link-bound | stateless
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path | None
    log_path: Path
    ca_file: Path | None = None  # it speaks TLS, with a certificate of this authority

    @property
    def base_url(self) -> str:
        return f"{'http' if self.ca_file is None else 'https'}://{HOST}:{self.port}"

    def session(self) -> aiohttp.ClientSession:
        """A client session that reaches it (verifying its certificate, over TLS)."""
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=verifying(self.ca_file)))

    @property
    def pgdata(self) -> Path | None:
        return self.data_dir / "pgdata" if self.data_dir is not None else None

    def ps(self) -> psutil.Process:
        return psutil.Process(self.proc.pid)

    def rss_mb(self) -> float:
        return process_rss_mb(self.ps())

    def threads(self) -> int:
        return int(self.ps().num_threads())


def command_line(process: psutil.Process) -> list[str]:
    """A process's arguments, or none for one that has exited (a child is a zombie until its
    parent reaps it, and psutil refuses to read it)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def node_process(cluster: Server, name: str) -> psutil.Process:
    """The live process of node `name` of `stillhere cluster` (its --node-id)."""
    for child in cluster.ps().children():
        if f"--node-id {name} " in " ".join(command_line(child)) + " ":
            return child
    raise ServerError(f"{name} is not running")


def process_rss_mb(process: psutil.Process) -> float:
    """A process's resident memory, in MB."""
    return float(process.memory_info().rss) / (1024 * 1024)


def main_thread_sched_s(process: psutil.Process) -> dict[str, float]:
    """Seconds the process's main thread (a server's event loop) has spent on a core and
    waiting in the run queue for one, from Linux's schedstat; empty where there is none."""
    path = Path(f"/proc/{process.pid}/task/{process.pid}/schedstat")
    with contextlib.suppress(OSError, ValueError):
        on_core, waiting, _ = path.read_text().split()
        return {"loop_on_core": int(on_core) / 1e9, "loop_waiting_for_core": int(waiting) / 1e9}
    return {}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 (a cluster's: HAProxy's,
    then its nodes', then their admin APIs')."""
    for _ in range(200):
        first = free_port()
        if first + count > 65536:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                held.append(socket.socket())
                held[-1].bind((HOST, port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise ServerError(f"no {count} consecutive free ports")


def stillhere_command() -> str:
    beside = Path(sys.executable).parent / "stillhere"
    found = str(beside) if beside.exists() else shutil.which("stillhere")
    if found is None:
        raise SystemExit("no `stillhere` command: install the project (pip install -e .)")
    return found


def stop_leftover_postgres(pgdata: Path) -> bool:
    """Stop the postmaster the server started in our tmp dir, if it outlived the server."""
    pidfile = pgdata / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError, IndexError, psutil.Error):
        pid = int(pidfile.read_text().splitlines()[0])
        postmaster = psutil.Process(pid)
        if str(pgdata) not in " ".join(postmaster.cmdline()):
            return False
        postmaster.terminate()
        try:
            postmaster.wait(10.0)
        except psutil.TimeoutExpired:
            postmaster.kill()
        return True
    return False


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace").splitlines()[-lines:]
    return []


def log_problems(path: Path) -> list[str]:
    with contextlib.suppress(OSError):
        text = path.read_text(errors="replace").splitlines()
        return [line for line in text if any(m in line for m in PROBLEM_MARKERS)]
    return []


def clean_env() -> dict[str, str]:
    # Only the command line configures a server: no STILLHERE_* from the environment.
    return {k: v for k, v in os.environ.items() if not k.startswith("STILLHERE_")}


def process_cpu_s(process: psutil.Process) -> float:
    """CPU seconds (user + system) the process has used so far."""
    t = process.cpu_times()
    return float(t.user + t.system)


def start(
    name: str,
    root: Path,
    *,
    latency: float,
    rate: float,
    event_loop: str = "uvloop",
    extra: list[str] | None = None,
    port: int | None = None,
    tls: tuple[Pair, Path] | None = None,
    home: Path | None = None,
    executable: str | None = None,
) -> Server:
    """Start one server in `home` (default `root/<name>`) on `port` (default a free one) of
    127.0.0.1, on `event_loop` (every server of a run on the same one, so the comparison is
    of designs); stillhere over TLS with `tls`, its certificate and the authority's file;
    stillhere from `executable`, another checkout's (default this one's).
    Started again in the same folder, it takes up the same data, and its log goes on."""
    home = home or root / name
    home.mkdir(parents=True, exist_ok=True)
    port, log_path = port or free_port(), home / "server.log"
    data_dir: Path | None = home / "data"
    timing = ["--rehearsal-latency", f"{latency}", "--rehearsal-rate", f"{rate}"]
    if name == "stillhere":
        command = [executable or stillhere_command(), "serve", "--host", HOST, "--port", str(port)]
        command += ["--data-dir", str(data_dir), "--sweep-interval", "1h"]
        command += ["--resume-window", "30m"]
        command += [timing[0], f"{latency}s", timing[2], timing[3]]
        if tls is not None:
            command += ["--tls-cert", str(tls[0].cert), "--tls-key", str(tls[0].key)]
    elif name == "link-bound":
        data_dir = None
        command = [sys.executable, "-m", "bench.baselines.link_bound", "--port", str(port)]
        command += timing
    elif name == "stateless":
        command = [sys.executable, "-m", "bench.baselines.stateless", "--port", str(port)]
        command += ["--data-dir", str(data_dir), *timing]
    else:
        raise ValueError(f"unknown server {name!r}")
    command += ["--event-loop", event_loop, *(extra or [])]
    proc = spawn(command, log_path)
    return Server(name, proc, port, data_dir, log_path, None if tls is None else tls[1])


def spawn(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """`command` run from the project, its output appended to `log_path`, in a session of
    its own: a Ctrl-C on the bench reaches it through the bench's `finally` only."""
    _sigterm_as_ctrl_c()
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command,
            cwd=PROJECT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            start_new_session=True,
        )


def _sigterm_as_ctrl_c() -> None:
    """From now on a SIGTERM to the bench (`timeout`, a CI's cancel) raises
    KeyboardInterrupt, as a Ctrl-C does, so the bench unwinds through the `finally` that
    stops its servers. By default it would end at once, and leave them, and their
    PostgreSQL, running in their own sessions. Raised directly, not sent on as a SIGINT: a
    process started in the background by a shell ignores SIGINT. Only the main thread may
    set a handler; a bench spawning from another leaves SIGTERM as it was."""
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)


async def wait_ready(server: Server) -> float:
    """Seconds until `/v1/ws` accepts a WebSocket (bounded)."""
    started = time.perf_counter()
    deadline = started + READY_TIMEOUT_S
    async with server.session() as http:
        while time.perf_counter() < deadline:
            if server.proc.poll() is not None:
                tail = "\n  ".join(log_tail(server.log_path, 20))
                raise ServerError(
                    f"{server.name} exited with {server.proc.returncode} before it was ready:"
                    f"\n  {tail}"
                )
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                ws = await asyncio.wait_for(
                    http.ws_connect(server.base_url + "/v1/ws"), CONNECT_TIMEOUT_S
                )
                await asyncio.wait_for(ws.close(), CONNECT_TIMEOUT_S)
                return time.perf_counter() - started
            await asyncio.sleep(0.25)
    raise ServerError(f"{server.name} not accepting after {READY_TIMEOUT_S:.0f} s")


async def stopped(server: Server) -> dict[str, Any]:
    """`stop`, from the loop: its waits in a worker thread, the loop free meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, stop, server)


def stop(server: Server) -> dict[str, Any]:
    """SIGINT, then SIGKILL after STOP_TIMEOUT_S; then any PostgreSQL it left running."""
    started, killed = time.perf_counter(), False
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGINT)
        try:
            server.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            killed = True
            server.proc.kill()
            server.proc.wait(10.0)
    seconds = time.perf_counter() - started
    leftover = stop_leftover_postgres(server.pgdata) if server.pgdata is not None else False
    return {
        "seconds": round(seconds, 2),
        "exit_code": server.proc.returncode,
        "killed": killed,
        "postgres_left_running": leftover,
        "log_problems": len(log_problems(server.log_path)),
    }


Report = dict[str, Any]


async def finish(
    name: str,
    measuring: Awaitable[Report],
    args: argparse.Namespace,
    table: Callable[[Report], str],
    exit_code: Callable[[Report], int],
) -> int:
    """How a bench run against its own servers ends: the table printed, the report written
    to `--json` and its figures to `--results` when given, and `exit_code` of it; 2 when
    the run could not finish (a server did not start or died, a bound on the run's time
    passed)."""
    try:
        report = await measuring
    except (ServerError, TimeoutError) as failed:
        print(f"{name} bench failed: {type(failed).__name__}: {failed}", file=sys.stderr)
        return 2
    print(table(report))
    results.save(args, report)
    return exit_code(report)


def exit_code(found: list[str]) -> int:
    """A bench run's exit code from the problems it found: 0 without any; else 1, after
    printing them."""
    if found:
        print("problems:\n  " + "\n  ".join(found))
    return 1 if found else 0


@dataclass
class RssSampler:
    """Samples a server's RSS and thread count every `interval` seconds, in a task."""

    server: Server
    interval: float = 1.0
    t0: float = field(default_factory=time.perf_counter)
    series: list[tuple[float, float, int]] = field(default_factory=list)  # (s, MB, threads)
    _task: asyncio.Task[None] | None = None

    def sample(self) -> tuple[float, int]:
        with contextlib.suppress(psutil.Error):
            mb, threads = self.server.rss_mb(), self.server.threads()
            self.series.append((time.perf_counter() - self.t0, mb, threads))
            return mb, threads
        return 0.0, 0

    async def _run(self) -> None:
        while self.server.proc.poll() is None:
            self.sample()
            await asyncio.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        self.sample()

    @property
    def peak_mb(self) -> float:
        return max((mb for _, mb, _ in self.series), default=0.0)

    @property
    def peak_threads(self) -> int:
        return max((n for _, _, n in self.series), default=0)
