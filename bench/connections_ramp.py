"""`stillhere-bench connections --steps 10000,20000,...`: one node, phones added in steps.

At each step the phones connected so far (each has said hello and one thing, so its
conversation has a window) are held `--hold` seconds, a share of them (`--talking`)
saying something every `--say-every` and the rest pinging every `--ping-every`; then:
- the server's RSS per connected phone (over its RSS before the first phone), its threads,
  the actors running and its links (`/metrics`);
- its CPU per second over the hold, and over `--idle-window` seconds of pings alone (the
  talkers silent too): what the idle links cost;
- the first `reply.delta` of a say from a sample of quiet phones (their conversations
  deactivated) against one from talking phones (active), one say at a time, and meanwhile
  how late the server's loop ran and how long its collections stopped it (`/metrics`'
  histograms: the bucket bounds of p50 to p100, so a slow say can be told from a stall);
- resume: a sample of quiet phones drop their link as a tunnel would and reconnect with
  their conversation and last seq, one at a time (hello to welcome).

Past `PER_ADDRESS` phones the links come from several loopback source addresses
(127.0.0.2 and up), as one address has only its ephemeral ports (`ip_local_port_range`,
about 28,000); `--sources` sets how many. The bench raises its own descriptor limit to the
hard one, and the server raises its own as it starts (transport/listener.py). A step
that cannot connect all its phones ends the ramp; the report says what stopped it.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench import flap_metrics, procs
from bench.connections_hold import hold_links, scrape, server_options, stopped_badly, timed_says
from bench.live import (
    Phone,
    Talk,
    close_all,
    describe,
    keep_log,
    percentiles,
    ramp,
    resume,
)
from bench.phones_gc import phones_collected
from transport.listener import raise_descriptor_limit

PER_ADDRESS = 25_000  # links from one source address: its ~28,000 ephemeral ports, with room
RESUME_PAUSE_S = 0.05  # between two timed resumes


@dataclass
class Fleet:
    """The phones connected, by the client session (source address) they connect from."""

    sessions: list[aiohttp.ClientSession]
    phones: list[list[Phone]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.phones = [[] for _ in self.sessions]

    def __len__(self) -> int:
        return sum(map(len, self.phones))

    def all(self) -> list[Phone]:
        return [phone for share in self.phones for phone in share]

    def session_of(self) -> dict[int, aiohttp.ClientSession]:
        return {
            id(p): s for s, share in zip(self.sessions, self.phones, strict=True) for p in share
        }

    async def grow(self, url: str, to: int, concurrency: int) -> tuple[list[Phone], Counter[str]]:
        """Connect phones, spread evenly over the sessions, until `to` are connected (or
        tried); the new ones and what went wrong."""
        wanted = to - len(self)
        k = len(self.sessions)
        shares = [wanted // k + (1 if i < wanted % k else 0) for i in range(k)]
        gate = max(1, concurrency // k)
        outcomes = await asyncio.gather(
            *(
                ramp(http, url, n, gate, Talk(1, True))
                for http, n in zip(self.sessions, shares, strict=True)
                if n > 0
            )
        )
        new: list[Phone] = []
        errors: Counter[str] = Counter()
        held = [share for share, n in zip(self.phones, shares, strict=True) if n > 0]
        for share, (phones, failed) in zip(held, outcomes, strict=True):
            share.extend(phones)
            new += phones
            errors += failed
        return new, errors


def source_addresses(phones: int, forced: int | None) -> list[str]:
    """The loopback addresses the phones connect from: one per `PER_ADDRESS` phones (or
    `forced`), 127.0.0.2 and up; none below `PER_ADDRESS` without `forced` (the kernel
    picks, 127.0.0.1)."""
    count = forced if forced is not None else math.ceil(phones / PER_ADDRESS)
    if forced is None and count <= 1:
        return []
    return [f"127.0.0.{2 + i}" for i in range(count)]


def _session(address: str | None, limit: int) -> aiohttp.ClientSession:
    local = None if address is None else (address, 0)
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, local_addr=local)
    return aiohttp.ClientSession(connector=connector)


def _sources(port: int) -> dict[str, int]:
    """This process's established connections to `port`, by local address: where the
    phones' links come from."""
    links = psutil.Process().net_connections(kind="tcp")
    return dict(
        Counter(
            c.laddr.ip
            for c in links
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
        )
    )


async def _resumes(
    url: str, sample: Sequence[Phone], sessions: dict[int, aiohttp.ClientSession]
) -> tuple[list[float], int, Counter[str]]:
    """Each phone of `sample` drops and resumes, one at a time: (ms each, resumed, errors)."""
    times: list[float] = []
    resumed, errors = 0, Counter[str]()
    for phone in sample:
        await asyncio.sleep(RESUME_PAUSE_S)
        try:
            ms, ok = await asyncio.wait_for(resume(sessions[id(phone)], url, phone), 60.0)
        except Exception as error:
            errors[describe(error)] += 1
            continue
        times.append(ms)
        resumed += int(ok)
    return times, resumed, errors


async def _step(
    server: procs.Server,
    http: aiohttp.ClientSession,
    fleet: Fleet,
    talking: list[Phone],
    args: argparse.Namespace,
    before_mb: float,
) -> dict[str, Any]:
    """Hold the fleet, then measure it (see the module's docstring): the says are timed
    right after the hold, while the talkers' conversations are still active, and the idle
    links' CPU last."""
    chosen = random.Random(args.seed + len(fleet))
    phones = fleet.all()
    talkers = {id(p) for p in talking}
    quiet = [p for p in phones if id(p) not in talkers]
    ps = server.ps()
    cpu_before, started = procs.process_cpu_s(ps), time.perf_counter()
    errors = await hold_links(quiet, talking, args)
    cpu_held = (procs.process_cpu_s(ps) - cpu_before) / (time.perf_counter() - started)
    rss_mb, threads = server.rss_mb(), server.threads()
    gauges = await scrape(http, server)
    sample = chosen.sample(quiet, min(args.sample, len(quiet)))
    resumed_sample = chosen.sample(quiet, min(args.resume_sample, len(quiet)))
    with phones_collected(args.phones_gc) as phones_gc:
        buckets = await flap_metrics.server_buckets(server.base_url, http)
        says = await timed_says(sample, talking, errors)
        stalls = flap_metrics.server_figures(
            buckets, await flap_metrics.server_buckets(server.base_url, http)
        )
        resume_ms, resumed, resume_errors = await _resumes(
            server.base_url + "/v1/ws", resumed_sample, fleet.session_of()
        )
    cpu_before, started = procs.process_cpu_s(ps), time.perf_counter()
    errors += await hold_links(phones, [], args, hold=args.idle_window)
    cpu_idle = (procs.process_cpu_s(ps) - cpu_before) / (time.perf_counter() - started)
    delta = {kind: percentiles(ms) for kind, ms in says.items()}
    n = len(phones)
    return {
        "phones_connected": n,
        "rss_mb": round(rss_mb, 1),
        "rss_per_phone_kb": round((rss_mb - before_mb) * 1024 / n, 1),
        "threads": threads,
        **gauges,
        "cpu_per_s_held": round(cpu_held, 3),
        "cpu_per_s_idle_links": round(cpu_idle, 3),
        "first_delta_ms": delta,
        "first_delta_p99_over_active_ms": _minus(delta["quiet"]["p99"], delta["talking"]["p99"]),
        # While the says were timed: how late the loop ran, and its collections (bounds, ms).
        "server_while_timed": stalls,
        # The phones' own collector over the timed says and resumes (bench/phones_gc.py).
        "phones_gc": phones_gc,
        "resume_ms": percentiles(resume_ms),
        "resumed": resumed,
        "resume_sample": len(resumed_sample),
        "errors": dict(errors + resume_errors),
    }


def _minus(a: float | None, b: float | None) -> float | None:
    return round(a - b, 2) if a is not None and b is not None else None


async def _steps(server: procs.Server, args: argparse.Namespace) -> dict[str, Any]:
    """Every step in turn, until one cannot connect all its phones."""
    addresses = source_addresses(max(args.steps), args.sources)
    limit = max(args.steps) + 2 * args.resume_sample + 100
    sessions = [_session(a, limit) for a in addresses] or [_session(None, limit)]
    fleet = Fleet(sessions)
    url = server.base_url + "/v1/ws"
    measured: list[dict[str, Any]] = []
    stopped: str | None = None
    talking: list[Phone] = []
    chosen = random.Random(args.seed)
    try:
        # No keep-alive for /metrics: every connection left to the port is a phone's.
        metrics = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=metrics) as http:
            await asyncio.sleep(1.0)
            before_mb, before_threads = server.rss_mb(), server.threads()
            for step in args.steps:
                started = time.perf_counter()
                new, failed = await fleet.grow(url, step, args.concurrency)
                ramp_s = time.perf_counter() - started
                more = max(1, round(args.talking * step)) - len(talking)
                talking += chosen.sample(new, max(0, min(len(new), more)))
                sources = _sources(server.port)
                figures = await _step(server, http, fleet, talking, args, before_mb)
                figures = {"step": step, "ramp_s": round(ramp_s, 1), **figures, "from": sources}
                figures["errors"] = dict(Counter(figures["errors"]) + failed)
                measured.append(figures)
                if len(fleet) < step:
                    stopped = f"{len(fleet)} of {step} phones connected: {dict(failed)}"
                    break
            await close_all(fleet.all(), args.concurrency)
    finally:
        for session in sessions:
            await session.close()
    return {
        "source_addresses": addresses or ["127.0.0.1"],
        "rss_mb_before": round(before_mb, 1),
        "threads_before": before_threads,
        "steps": measured,
        "reached": max((s["phones_connected"] for s in measured), default=0),
        "stopped": stopped,
    }


async def measure_ramp(args: argparse.Namespace) -> dict[str, Any]:
    """The ramp against one server (`--actor-idle`), its descriptor limits beside it."""
    bench_limit = raise_descriptor_limit()
    root = Path(tempfile.mkdtemp(prefix="stillhere-connections-"))
    extra = server_options(args, args.actor_idle)
    try:
        async with asyncio.timeout(args.timeout):
            server = procs.start("stillhere", root, latency=0.0, rate=0.0, extra=extra)
            try:
                await procs.wait_ready(server)
                server_limit = server.ps().rlimit(psutil.RLIMIT_NOFILE)
                ramped = await _steps(server, args)
            finally:
                stopped = await procs.stopped(server)
                keep_log(server.log_path, args.server_log)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "mode": "ramp",
        "talking": args.talking,
        "say_every_s": args.say_every,
        "ping_every_s": args.ping_every,
        "hold_s": args.hold,
        "idle_window_s": args.idle_window,
        "actor_idle_s": args.actor_idle,
        "actor_threads": args.actor_threads,
        "descriptor_limits": {"bench": list(bench_limit), "server": list(server_limit)},
        **ramped,
        "server_stop": stopped,
    }


def ramp_table(report: dict[str, Any]) -> str:
    rows = [
        ("phones connected", lambda s: s["phones_connected"]),
        ("RSS per phone, KB", lambda s: s["rss_per_phone_kb"]),
        ("threads", lambda s: s["threads"]),
        ("actors running", lambda s: s.get("actors_running")),
        ("CPU s per s, held", lambda s: s["cpu_per_s_held"]),
        ("CPU s per s, idle links", lambda s: s["cpu_per_s_idle_links"]),
        ("resume p99, ms", lambda s: s["resume_ms"]["p99"]),
        ("first delta p99 quiet, ms", lambda s: s["first_delta_ms"]["quiet"]["p99"]),
        ("first delta p99 active, ms", lambda s: s["first_delta_ms"]["talking"]["p99"]),
        ("quiet over active p99, ms", lambda s: s["first_delta_p99_over_active_ms"]),
        ("phones' longest GC pause, ms", lambda s: s["phones_gc"]["pause_ms_max"]),
    ]
    steps = report["steps"]
    lines = [
        f"stillhere connections ramp: {report['talking']:.0%} talking every "
        f"{report['say_every_s']:.0f} s, held {report['hold_s']:.0f} s a step, actor-idle "
        f"{report['actor_idle_s']:.0f} s, from {', '.join(report['source_addresses'])}",
        "  " + f"{'step':<30}" + "".join(f"{s['step']:>12}" for s in steps),
    ]
    lines += [
        "  " + f"{label:<30}" + "".join(f"{get(s)!s:>12}" for s in steps) for label, get in rows
    ]
    if report["stopped"]:
        lines.append(f"  stopped: {report['stopped']}")
    return "\n".join(lines)


def ramp_problems(report: dict[str, Any]) -> list[str]:
    found = [f"stopped: {report['stopped']}"] if report["stopped"] else []
    for step in report["steps"]:
        found += [f"{step['step']}: {error} (x{n})" for error, n in step["errors"].items()]
        if step["resumed"] != step["resume_sample"]:
            found.append(f"{step['step']}: {step['resumed']} of {step['resume_sample']} resumed")
    if stopped_badly(report["server_stop"]):
        found.append(f"server stop {report['server_stop']}")
    return found


def plot(path: Path, report: dict[str, Any]) -> None:
    """RSS per phone, threads, latencies and CPU against the phones connected (matplotlib
    imported only here: Agg backend, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = report["steps"]
    xs = [s["phones_connected"] for s in steps]
    fig, axes = plt.subplots(4, 1, figsize=(9, 12), sharex=True)
    axes[0].plot(xs, [s["rss_per_phone_kb"] for s in steps], marker="o")
    axes[0].axhline(16.0, color="tab:red", linestyle="--", linewidth=1, label="target 16 KB")
    axes[0].set_ylabel("server RSS per phone (KB)")
    axes[1].plot(xs, [s["threads"] for s in steps], marker="o", label="threads")
    axes[1].axhline(100, color="tab:red", linestyle="--", linewidth=1, label="target 100")
    axes[1].set_ylabel("server threads")
    for key, label in (("quiet", "first delta, deactivated"), ("talking", "first delta, active")):
        axes[2].plot(xs, [s["first_delta_ms"][key]["p99"] for s in steps], marker="o", label=label)
    axes[2].plot(xs, [s["resume_ms"]["p99"] for s in steps], marker="o", label="resume")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("p99 (ms)")
    axes[3].plot(xs, [s["cpu_per_s_held"] for s in steps], marker="o", label="held (5% talking)")
    axes[3].plot(xs, [s["cpu_per_s_idle_links"] for s in steps], marker="o", label="idle links")
    axes[3].set_ylabel("server CPU s per s")
    axes[3].set_xlabel("phones connected")
    for ax in axes:
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"stillhere connections ramp, {report['talking']:.0%} talking")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
