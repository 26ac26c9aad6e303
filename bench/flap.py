"""`stillhere-bench flap`: phones on flapping mobile links against a real server.

Starts a real `stillhere serve` (embedded PostgreSQL in a tmp data dir, rehearsal model),
brings up N reference phones (`client.Phone`) that hold conversations while their links
misbehave on a seeded schedule (tunnels, handovers, NAT idle closes, drops mid-reply and
mid-hello, real leaves), and checks every say and reply end to end. With baselines (the
default) it also runs, on the same machine in the same run, a link-bound and a stateless
server (bench/baselines/) under the same load, and reports stillhere's figures as ratios.

    .venv/bin/python -m bench.flap --clients 200 --duration 60 --json bench/out/flap.json

See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench import flap_cluster, flap_throughput, flap_tls, procs, results
from bench.certificates import Pair
from bench.flap_db import Stored, stateless_stored, stillhere_stored
from bench.flap_metrics import Buckets, server_buckets, server_count, server_figures
from bench.flap_phones import KINDS, TAPPED, ClientLogRing, Fleet, FleetOptions
from bench.flap_throughput import Throughput
from bench.flap_throughput import in_turn as throughput_in_turn
from bench.phones_gc import MODES as PHONES_GC_MODES
from bench.phones_gc import PhonesCollector
from client import Backoff
from providers.collector import tune_collector
from providers.event_loop import LOOPS
from providers.event_loop import run as run_on_loop
from providers.loop_lag import loop_lag_probe

DESCRIPTION = "phones on flapping mobile links: resume, loss, latency, memory, baselines"
SETTLE_S = 2.0  # before reading an RSS figure
BASELINE_SETTLE_TIMEOUT_S = 30.0
PHONES_GC_THRESHOLDS = (50_000, 50, 100)  # this process's collector: see `run`

TARGETS = {
    "resume_p99_ms": 50.0,
    "rss_per_conversation_kb": 64.0,
    "storm_s": 10.0,
    "turns_ratio": 0.70,
}
CORRECTNESS_KEYS = (
    "new_conversations_unexpected",
    "lost_says",
    "duplicated_says",
    "lost_replies",
    "duplicated_replies",
    "duplicated_events",
    "lost_events",
    "out_of_order_events",
    "broken_replies",
    "not_stored",
    "acked_not_stored",
    "stored_twice",
    "stored_wrong_person",
    "answered_in_db_twice",
)


class BenchFailed(Exception):
    """The bench could not finish (a server did not start, a phase timed out)."""


# -- options --------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    from actors.clock import parse_duration

    return parse_duration(text)


def add_rehearsal_options(parser: argparse.ArgumentParser) -> None:
    """The rehearsal model's pace, the same in every bench that paces it."""
    parser.add_argument(
        "--rehearsal-latency",
        type=_seconds,
        default=0.3,
        help="rehearsal model: pause before its first word (default 300ms)",
    )
    parser.add_argument(
        "--rehearsal-rate", type=float, default=20.0, help="rehearsal words per second (20)"
    )


def add_parser(subparsers: Any) -> None:
    """Add `flap` to a subparsers object (`stillhere-bench flap`); the command's `run`
    checks the options first."""
    parser = subparsers.add_parser("flap", help=DESCRIPTION, description=DESCRIPTION)
    add_options(parser)

    async def checked_run(args: argparse.Namespace) -> int:
        check_args(parser, args)
        return await run(args)

    parser.set_defaults(run=checked_run)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=200, help="phones (N), default 200")
    parser.add_argument(
        "--duration", type=_seconds, default=60.0, help="flapping time (default 60s)"
    )
    parser.add_argument("--transport", choices=["ws", "sse", "mixed"], default="mixed")
    parser.add_argument("--seed", type=int, default=1, help="seeds every phone's schedule")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "flap")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG here")
    parser.add_argument(
        "--storm", action="store_true", help="after the flapping, drop every phone at once"
    )
    add_rehearsal_options(parser)
    parser.add_argument(
        "--event-loop", choices=LOOPS, default="uvloop", help="every server's loop (uvloop)"
    )
    parser.add_argument(
        "--baselines",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the link-bound and stateless baselines (default on)",
    )
    parser.add_argument(
        "--think", type=_seconds, default=15.0, help="mean pause between a reply and the next say"
    )
    parser.add_argument(
        "--flap-every", type=_seconds, default=30.0, help="mean time between a phone's link events"
    )
    parser.add_argument(
        "--baseline-duration",
        type=_seconds,
        default=None,
        help="flapping time for each baseline (default: --duration)",
    )
    parser.add_argument(
        "--cluster",
        type=int,
        default=0,
        help="instead of the flapping run: the throughput phase through `stillhere cluster` "
        "with N nodes against 1 node, side by side (bench/flap_cluster.py; needs haproxy)",
    )
    flap_throughput.add_options(parser, phones=50, says=150, rounds=5, warmup=5)
    parser.add_argument("--ramp-concurrency", type=int, default=100, help="phones starting at once")
    parser.add_argument("--backoff-first", type=_seconds, default=0.2, help="first reconnect wait")
    parser.add_argument("--backoff-jitter", type=float, default=0.5, help="reconnect jitter 0..1")
    parser.add_argument(
        "--rss-settle", type=_seconds, default=SETTLE_S, help="pause before reading RSS (2s)"
    )
    parser.add_argument(
        "--settle-timeout", type=_seconds, default=120.0, help="bound on the final settling"
    )
    parser.add_argument(
        "--storm-timeout", type=_seconds, default=120.0, help="bound on waiting for the storm"
    )
    parser.add_argument(
        "--timeout", type=_seconds, default=3 * 3600.0, help="bound on the whole run (3h)"
    )
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bar"
    )
    parser.add_argument(
        "--client-debug",
        action="store_true",
        help="keep the last client debug lines per phone, shown for unsettled phones",
    )
    parser.add_argument(
        "--server-logs", type=Path, default=None, help="keep the servers' logs in this folder"
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="after the plain run, flap stillhere again over TLS (a certificate of an "
        "authority made with openssl, verified by the phones): resume and CPU side by side",
    )
    parser.add_argument(
        "--actor-threads",
        type=_thread_counts,
        default=None,
        help="stillhere's --actor-threads (default: the server's); more values, e.g. 4,0, "
        "each add a stillhere to the throughput phase on that value, timed with the others",
    )
    parser.add_argument(
        "--phones-gc",
        choices=PHONES_GC_MODES,
        default="off",
        help="the phones' own collector: off while they flap (default), freeze what "
        "survives a collection, or plain (bench/phones_gc.py)",
    )


def _thread_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError("thread counts of at least 0, e.g. 4 or 4,0")
    return counts


def actor_options(counts: list[int] | None) -> list[str]:
    """stillhere's options for the first of `--actor-threads`, none without it."""
    return [] if not counts else ["--actor-threads", str(counts[0])]


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.clients < 1 or args.duration <= 0:
        parser.error("--clients must be at least 1 and --duration positive")
    if args.throughput_warmup < 0:
        parser.error("--throughput-warmup must be >= 0")
    counts = (args.throughput_phones, args.throughput_says, args.throughput_rounds)
    if min(*counts, args.ramp_concurrency) < 1:
        parser.error(
            "--throughput-phones, --throughput-says, --throughput-rounds, --ramp-concurrency "
            "must be >= 1"
        )
    if not 0 <= args.backoff_jitter <= 1:
        parser.error("--backoff-jitter is between 0 and 1")
    if args.cluster and args.cluster < 2:
        parser.error("--cluster compares N nodes with one: N is at least 2")


# -- figures --------------------------------------------------------------------------------


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "n": 0}
    p50, p95, p99 = np.percentile(np.asarray(values), [50, 95, 99])
    return {
        "p50": round(float(p50), 2),
        "p95": round(float(p95), 2),
        "p99": round(float(p99), 2),
        "n": len(values),
    }


def lag_ms(lags: Sequence[float]) -> dict[str, float | None]:
    """`percentiles` of loop lags given in seconds, in ms, with the worst."""
    ms = [lag * 1000.0 for lag in lags]
    return {**percentiles(ms), "max": round(max(ms), 2) if ms else None}


# A second in which the hypervisor took this much of a core or more counts as stolen.
STOLEN_CORES = 0.1


def resume_by_steal(
    points: Sequence[tuple[float, float]], series: dict[str, list[float]]
) -> dict[str, Any]:
    """`percentiles` of the resumes (s, ms) made in seconds the hypervisor left alone, and of
    those made in seconds it took `STOLEN_CORES` or more (`series`' steal, tick by tick): on
    a shared machine, which of the slow ones were the machine's."""
    ticks, steal = series.get("t") or [], series.get("cores_steal") or []
    quiet: list[float] = []
    stolen: list[float] = []
    for at, ms in points if steal else ():
        # The tick that ends the second `at` falls in; after the last one, the last.
        taken = steal[min(bisect.bisect_left(ticks, at), len(steal) - 1)]
        (stolen if taken >= STOLEN_CORES else quiet).append(ms)
    seconds = sum(1 for taken in steal if taken >= STOLEN_CORES)
    return {
        "stolen_cores_at_least": STOLEN_CORES,
        "quiet": percentiles(quiet),
        "stolen": {**percentiles(stolen), "seconds": seconds},
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


class Progress:
    """A tqdm bar over the seconds of a phase (or nothing with --no-progress)."""

    def __init__(self, enabled: bool, total: float, desc: str, unit: str = "s") -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=round(total), desc=desc, unit=unit, file=sys.stderr, leave=True)
        self.done = 0

    def to(self, seconds: float, **postfix: Any) -> None:
        if self.bar is None:
            return
        step = min(round(seconds), int(self.bar.total)) - self.done
        if step > 0:
            self.bar.update(step)
            self.done += step
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# -- one server under flapping ---------------------------------------------------------------


async def _sample_loop(
    server: procs.Server,
    fleet: Fleet,
    series: dict[str, list[float]],
    t0: float,
    progress: Progress,
) -> None:
    cores = _CoresUsed(server)
    while True:
        # Each tick ends the second it describes: a tick at once would divide a clock tick of
        # CPU time by microseconds (the bench's first reading came out at 15 cores).
        await asyncio.sleep(1.0)
        t = time.perf_counter() - t0
        with contextlib.suppress(psutil.Error):  # a tick is kept whole or not at all
            row = {
                "t": round(t, 2),
                "live": fleet.up,
                "rss_mb": round(server.rss_mb(), 1),
                "threads": server.threads(),
                **{f"cores_{key}": used for key, used in cores.since_last().items()},
            }
            for key, value in row.items():
                series[key].append(value)
        reconnects = sum(1 for w in fleet.ledger.welcomes if w.reconnect)
        progress.to(t, up=fleet.up, reconnects=reconnects, says=len(fleet.ledger.says))


SERIES_CORES = ("cores_server", "cores_bench", "cores_other", "cores_steal")


class _CoresUsed:
    """Cores busy since the last reading: the server, this bench, the rest of the machine
    (mostly the server's PostgreSQL), and the cores the hypervisor took (`steal`): a slow
    stretch with none of ours busier is the machine's. Cheap enough for every tick: three
    reads of /proc, where `cpu_seconds` walks the process table for PostgreSQL."""

    def __init__(self, server: procs.Server) -> None:
        self._server = server.ps()
        self._bench = psutil.Process()
        self._last = self._read()

    def _read(self) -> tuple[float, float, float, float, float]:
        return (
            time.perf_counter(),
            procs.process_cpu_s(self._server),
            procs.process_cpu_s(self._bench),
            *_machine(),
        )

    def since_last(self) -> dict[str, float]:
        now = self._read()
        wall, server, bench, busy, steal = (b - a for a, b in zip(self._last, now, strict=True))
        self._last = now
        wall = max(wall, 1e-9)
        return {
            "server": round(server / wall, 2),
            "bench": round(bench / wall, 2),
            "other": round(max(0.0, busy - server - bench) / wall, 2),
            "steal": round(steal / wall, 2),
        }


async def flap_one(
    name: str,
    root: Path,
    args: argparse.Namespace,
    *,
    duration: float,
    storm: bool,
    tls: tuple[Pair, Path] | None = None,
) -> dict[str, Any]:
    """Start `name`, ramp the phones, flap them for `duration`, settle, check, stop; over
    TLS with `tls` (the certificate, and the authority's file the phones verify it with)."""
    transport = args.transport if name == "stillhere" else "ws"  # baselines: WebSocket only
    server = procs.start(
        name,
        root,
        latency=args.rehearsal_latency,
        rate=args.rehearsal_rate,
        event_loop=args.event_loop,
        tls=tls,
        home=None if tls is None else root / f"{name}-tls",
        extra=actor_options(args.actor_threads) if name == "stillhere" else None,
    )
    out: dict[str, Any] = {"server": name, "transport": transport, "url": server.base_url}
    fleet: Fleet | None = None
    sampler_task: asyncio.Task[None] | None = None
    progress = Progress(False, 1, "")
    collector = PhonesCollector(args.phones_gc)
    try:
        out["ready_s"] = round(await procs.wait_ready(server), 2)
        with procs.RssSampler(server) as rss:
            await asyncio.sleep(args.rss_settle)
            idle_mb = server.rss_mb()
            options = FleetOptions(
                base_url=server.base_url,
                transport=transport,
                think_s=args.think,
                flap_every_s=args.flap_every,
                kinds=dict(KINDS),
                backoff=Backoff(first=args.backoff_first, jitter=args.backoff_jitter),
                seed=args.seed,
                ca_file=server.ca_file,
            )
            fleet = Fleet(options, args.clients)
            collector.start()
            if args.client_debug:
                fleet.client_log = ClientLogRing()
                fleet.client_log.install()
            ramp_bar = Progress(args.progress, args.clients, f"{name}: ramp", " phones")
            ramped = [0]

            def one_more() -> None:
                ramped[0] += 1
                ramp_bar.to(ramped[0])

            started = time.perf_counter()
            try:
                ramp_failed = await fleet.ramp(args.ramp_concurrency, one_more)
            finally:
                ramp_bar.close()
            out["ramp_s"] = round(time.perf_counter() - started, 2)
            out["ramp_failed"] = ramp_failed
            out["unsettled_after_ramp"] = await fleet.wait_settled(args.settle_timeout)
            await asyncio.sleep(args.rss_settle)
            live_mb = server.rss_mb()
            live = fleet.up
            out["server_rss_mb_idle"] = round(idle_mb, 1)
            out["server_rss_mb_live"] = round(live_mb, 1)
            out["live_conversations"] = live
            out["rss_per_conversation_kb"] = (
                round((live_mb - idle_mb) * 1024 / live, 1) if live else None
            )
            out["server_threads_live"] = server.threads()

            series: dict[str, list[float]] = {
                key: [] for key in ("t", "live", "rss_mb", "threads", *SERIES_CORES)
            }
            cpu0 = cpu_seconds(server)
            server0 = await _buckets(server) if name == "stillhere" else None
            t0 = time.perf_counter()
            progress = Progress(args.progress, duration, f"{name}: flapping")
            sampler_task = asyncio.get_running_loop().create_task(
                _sample_loop(server, fleet, series, t0, progress)
            )
            bench_lags: list[float] = []  # this process's loop, where the phones run
            async with loop_lag_probe(bench_lags.append):
                fleet.start_scripts(t0 + duration)
                await asyncio.sleep(duration)
                await fleet.stop_scripts()
            out["cpu_s_during_flapping"] = cpu_used(server, cpu0, t0)
            out["bench_loop_lag_ms"] = lag_ms(bench_lags)
            if server0 is not None:
                out.update(server_figures(server0, await _buckets(server)))
            progress.to(duration)
            progress.close()
            settle_timeout = (
                args.settle_timeout
                if name == "stillhere"
                else min(args.settle_timeout, BASELINE_SETTLE_TIMEOUT_S)
            )
            out["unsettled"] = await fleet.wait_settled(settle_timeout)
            if name == "stillhere":  # resends that waited on their say's write, settling too
                out["server_resends_joined"] = await _resends_joined(server)
            out["unsettled_phones"] = fleet.unsettled()
            out["client_wedged_phones"] = fleet.wedged()
            if storm:
                # From a steady state: every link has held long enough for its phone's
                # backoff to start over, so each retries on the first step, as phones
                # that were all fine until the cell went down would.
                await asyncio.sleep(options.backoff.hold)
                cpu0, t0_storm = cpu_seconds(server), time.perf_counter()
                out["storm"] = await fleet.storm(args.storm_timeout)
                out["storm"]["cpu_s"] = cpu_used(server, cpu0, t0_storm)
                out["unsettled_after_storm"] = await fleet.wait_settled(settle_timeout)
            sampler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler_task
            sampler_task = None
            out["series"] = series
            out["t0"] = t0
        out["server_rss_mb_peak"] = round(rss.peak_mb, 1)
        out["server_threads_peak"] = rss.peak_threads
        await fleet.close()
        stored = await _stored(name, server, fleet)
        out.update(_verdict(fleet, stored))
        out["resume_points"] = [(at - t0, ms) for at, ms in fleet.resume_series]
        return out
    finally:
        out["bench_gc"] = collector.stop()
        progress.close()
        if sampler_task is not None:
            sampler_task.cancel()
        if fleet is not None:
            if fleet.client_log is not None:
                fleet.client_log.remove()
            with contextlib.suppress(Exception):
                await fleet.stop_scripts()
            with contextlib.suppress(Exception):
                await fleet.close()
        out["server_stop"] = await asyncio.get_running_loop().run_in_executor(
            None, procs.stop, server
        )
        out["server_log_tail"] = procs.log_tail(server.log_path, 20)
        if args.server_logs is not None:
            args.server_logs.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copyfile(server.log_path, args.server_logs / f"{name}.log")


async def _buckets(server: procs.Server) -> dict[str, Buckets]:
    async with server.session() as http:
        return await server_buckets(server.base_url, http)


async def _resends_joined(server: procs.Server) -> int | None:
    async with server.session() as http:
        joined = await server_count(server.base_url, "stillhere_resends_joined_total", http)
    return None if joined is None else int(joined)


def _machine() -> tuple[float, float]:
    """CPU seconds so far of the whole machine, all cores: busy, and stolen (the hypervisor
    ran something else while our cores were ready to run: a virtual machine's neighbours,
    which no process here shows; 0 where the kernel does not count it)."""
    times = psutil.cpu_times()
    busy = times.user + times.system + getattr(times, "nice", 0.0)
    return float(busy), float(getattr(times, "steal", 0.0))


def cpu_seconds(server: procs.Server) -> dict[str, float]:
    """CPU seconds (user + system) so far of the server, its PostgreSQL, and this bench;
    `machine` and `steal` as `_machine` has them."""
    out = {"server": 0.0, "postgres": 0.0, "bench": procs.process_cpu_s(psutil.Process())}
    out["machine"], out["steal"] = _machine()
    with contextlib.suppress(psutil.Error):
        server_ps = server.ps()
        out["server"] = procs.process_cpu_s(server_ps)
        for child in server_ps.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                out["postgres"] += procs.process_cpu_s(child)
        if server.pgdata is not None and not out["postgres"]:  # stillhere: pg is a grandchild
            for proc in psutil.process_iter(["cmdline"]):
                with contextlib.suppress(psutil.Error):
                    if str(server.pgdata) in " ".join(proc.info["cmdline"] or []):
                        out["postgres"] += procs.process_cpu_s(proc)
                        out["postgres"] += sum(
                            procs.process_cpu_s(c) for c in proc.children(recursive=True)
                        )
    return out


def cpu_used(server: procs.Server, before: dict[str, float], since: float) -> dict[str, float]:
    """CPU seconds each side used since `before` was read, with the wall time: what bounds
    a phase (the server's loop, PostgreSQL, or the bench's own phones)."""
    used = {k: round(max(0.0, v - before[k]), 1) for k, v in cpu_seconds(server).items()}
    used["wall"] = round(time.perf_counter() - since, 1)
    used["other_processes"] = round(  # includes PostgreSQL backends that exited
        used["machine"] - used["server"] - used["postgres"] - used["bench"], 1
    )
    return used


async def _stored(name: str, server: procs.Server, fleet: Fleet) -> Stored | None:
    said = fleet.said_by()
    if name == "stillhere" and server.pgdata is not None and server.data_dir is not None:
        return await stillhere_stored(server.pgdata, server.data_dir, said)
    if name == "stateless" and server.pgdata is not None:
        return await stateless_stored(server.pgdata, said)
    return None


def _verdict(fleet: Fleet, stored: Stored | None) -> dict[str, Any]:
    ledger = fleet.ledger
    verdict = ledger.verdict(
        stored.rows if stored is not None else None,
        stored.answered if stored is not None else None,
    )
    verdict["stored_wrong_person"] = stored.wrong_person if stored is not None else None
    verdict["resume_ms"] = percentiles([ms for _, ms in fleet.resume_series])
    verdict["turn_ms"] = percentiles(ledger.turn_ms(clean_only=True))
    verdict["turn_ms_all"] = percentiles(ledger.turn_ms(clean_only=False))
    verdict["link_events"] = dict(fleet.kinds)
    verdict["cuts"] = dict(fleet.cuts)
    verdict["phone_failures"] = dict(fleet.failures)
    verdict["resume_fraction"] = (
        round(verdict["resumed"] / verdict["reconnects"], 4) if verdict["reconnects"] else None
    )
    verdict["frames_tapped_before_dedup"] = TAPPED
    return verdict


# -- throughput -----------------------------------------------------------------------------


# The servers timed with a zero-latency model: (server, its extra options). stillhere's
# per-link frame rate limit (20/s) is raised so that it measures the server's cost per turn,
# not the limiter; the baselines have no limiter at all. "stillhere-per-piece" sends a delta
# per model piece, as the baselines do, so its ratio compares like with like on frames; plain
# "stillhere" runs with its default delta window (pieces within 100 ms share one delta).
UNLIMITED = ["--frames-per-s", "100000", "--frame-burst", "100000"]
THROUGHPUT_SERVERS: dict[str, tuple[str, list[str]]] = {
    "stillhere": ("stillhere", UNLIMITED),
    "stillhere-per-piece": ("stillhere", [*UNLIMITED, "--delta-window", "0"]),
    "link-bound": ("link-bound", []),
    "stateless": ("stateless", []),
}


def throughput_servers(counts: list[int] | None) -> dict[str, tuple[str, list[str]]]:
    """THROUGHPUT_SERVERS, stillhere's on the first of `--actor-threads`, and one stillhere
    more on each further value."""
    chosen = actor_options(counts)
    servers = {
        label: (name, [*extra, *chosen] if name == "stillhere" else extra)
        for label, (name, extra) in THROUGHPUT_SERVERS.items()
    }
    for count in (counts or [])[1:]:
        servers[f"stillhere-actor-threads-{count}"] = (
            "stillhere",
            [*UNLIMITED, "--actor-threads", str(count)],
        )
    return servers


async def throughput(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every server of `throughput_servers`, all started at once and timed in turn, round
    after round, so that each round finds the machine as the others did; per server, the
    median round's turns/s."""
    servers = {
        label: procs.start(
            name,
            root / "throughput" / label,
            latency=0.0,
            rate=0.0,
            event_loop=args.event_loop,
            extra=extra,
        )
        for label, (name, extra) in throughput_servers(args.actor_threads).items()
    }
    try:
        for server in servers.values():
            await procs.wait_ready(server)
        with contextlib.ExitStack() as stack:
            rss = {
                label: stack.enter_context(procs.RssSampler(server, interval=0.5))
                for label, server in servers.items()
            }
            targets = {
                label: (server.base_url, partial(throughput_readings, server))
                for label, server in servers.items()
            }
            rounds = await throughput_in_turn(targets, args)
        return {label: throughput_figures(rounds[label], rss[label]) for label in servers}
    finally:
        for label, server in servers.items():
            stop = await procs.stopped(server)
            if stop["log_problems"]:
                print(f"{label}: {stop['log_problems']} problem lines in its log", file=sys.stderr)


def throughput_readings(server: procs.Server) -> dict[str, float]:
    """Taken around a round's timed turns: the CPU seconds of the server, its PostgreSQL and
    the bench, and the time the server's loop spent on a core and waiting for one. A loop
    neither on a core nor waiting for one is idle: its turns wait on something else."""
    readings = cpu_seconds(server)
    with contextlib.suppress(psutil.Error):
        readings |= procs.main_thread_sched_s(server.ps())
    return readings


def _round_cpu_ms(r: Throughput) -> float | None:
    cpu = r.readings_s.get("server")
    return round(cpu / r.turns * 1000.0, 3) if cpu is not None and r.turns else None


def _per_turn_ms(rounds: list[Throughput], key: str) -> float | None:
    return median_or_none(
        [r.readings_s[key] / r.turns * 1000.0 for r in rounds if r.turns and key in r.readings_s]
    )


def _share_of_wall(rounds: list[Throughput], key: str) -> float | None:
    return median_or_none(
        [r.readings_s[key] / r.seconds for r in rounds if r.seconds and key in r.readings_s],
        digits=2,
    )


def throughput_figures(
    rounds: list[Throughput], rss: procs.RssSampler | None = None
) -> dict[str, Any]:
    """One server's figures over its rounds; each round's turns/s and server CPU a turn
    too, a round with no turn staying in place (None), so two servers' rounds pair up
    (`paired_ratios`)."""
    per_round = [r.turns_per_s for r in rounds]
    rates = [rate for rate in per_round if rate]
    turns = sum(r.turns for r in rounds)
    errors: Counter[str] = Counter()
    for r in rounds:
        errors.update(r.errors)
    return {
        "turns": turns,
        "seconds": round(sum(r.seconds for r in rounds), 3),
        "turns_per_s": median_or_none(rates, digits=1),
        "rounds_turns_per_s": [None if rate is None else round(rate, 1) for rate in per_round],
        "rounds_server_cpu_ms_per_turn": [_round_cpu_ms(r) for r in rounds],
        "deltas_per_reply": round(sum(r.deltas for r in rounds) / turns, 2) if turns else None,
        "turn_ms": percentiles([ms for r in rounds for ms in r.turn_ms]),
        "server_rss_mb_peak": None if rss is None else round(rss.peak_mb, 1),
        "cpu_ms_per_turn": {
            side: _per_turn_ms(rounds, side) for side in ("server", "postgres", "bench")
        },
        "loop_on_core": _share_of_wall(rounds, "loop_on_core"),
        "loop_waiting_for_core": _share_of_wall(rounds, "loop_waiting_for_core"),
        "steal_cores": _share_of_wall(rounds, "steal"),
        "errors": dict(errors),
    }


# -- the run --------------------------------------------------------------------------------


async def _run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    report: dict[str, Any] = {
        "clients": args.clients,
        "duration_s": args.duration,
        "transport": args.transport,
        "seed": args.seed,
        "storm_requested": args.storm,
        "rehearsal": {"latency_s": args.rehearsal_latency, "rate_words_per_s": args.rehearsal_rate},
        "event_loop": args.event_loop,
        "load": {
            "think_s": args.think,
            "flap_every_s": args.flap_every,
            "kinds": KINDS,
            "backoff": {"first": args.backoff_first, "jitter": args.backoff_jitter},
        },
    }
    baselines: dict[str, Any] = {}
    if args.baselines:
        baselines["throughput"] = await throughput(root, args)
    main = await flap_one("stillhere", root, args, duration=args.duration, storm=args.storm)
    if args.tls:
        again = partial(flap_one, "stillhere", root, args, duration=args.duration, storm=False)
        report["tls"] = await flap_tls.measure(lambda tls: again(tls=tls), root, main)
    report.update(_main_figures(main))
    if args.baselines:
        flaps = {}
        duration = args.baseline_duration or args.duration
        for name in ("link-bound", "stateless"):
            flapped = await flap_one(name, root, args, duration=duration, storm=False)
            flapped.pop("series", None)
            flapped.pop("resume_points", None)
            flapped.pop("t0", None)
            flaps[name] = {k: flapped.get(k) for k in _BASELINE_KEYS}
        baselines["flap"] = flaps
        baselines["flap_duration_s"] = duration
        baselines.update(_ratios(report, baselines))
    report["baselines"] = baselines if args.baselines else None
    report["targets"] = targets(report)
    report["machine"] = {
        "cpu_count": os.cpu_count(),
        "memory_mb": round(psutil.virtual_memory().total / (1024 * 1024)),
        "python": sys.version.split()[0],
    }
    report["_resume_points"] = main.get("resume_points", [])
    return report


_BASELINE_KEYS = (
    "transport",
    "reconnects",
    "resumed",
    "resume_fraction",
    "new_conversations_unexpected",
    "says",
    "lost_says",
    "duplicated_says",
    "lost_replies",
    "duplicated_replies",
    "duplicated_events",
    "lost_events",
    "not_stored",
    "acked_not_stored",
    "stored_twice",
    "resume_ms",
    "turn_ms",
    "server_rss_mb_idle",
    "server_rss_mb_live",
    "server_rss_mb_peak",
    "rss_per_conversation_kb",
    "server_threads_peak",
    "unsettled",
    "client_wedged_phones",
    "cpu_s_during_flapping",
    "bench_loop_lag_ms",
    "bench_gc",
    "server_stop",
)


def _main_figures(main: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in main.items() if k not in ("resume_points", "t0")}
    out["resume_ms_by_steal"] = resume_by_steal(
        main.get("resume_points", []), main.get("series") or {}
    )
    storm = main.get("storm")
    if storm is not None:
        out["storm_s"] = storm["storm_s"]
        out["storm_not_resumed"] = storm["not_resumed"]
        ms = storm.pop("reconnect_ms", [])
        storm["reconnect_ms"] = percentiles(ms)
    return out


def _ratios(report: dict[str, Any], baselines: dict[str, Any]) -> dict[str, Any]:
    tput = baselines.get("throughput", {})
    tps = {name: (tput.get(name) or {}).get("turns_per_s") for name in tput}
    over_link_bound = paired_ratios(tput, "stillhere", "link-bound")
    flap = baselines.get("flap", {})
    return {
        "turns_per_s": tps,
        "stillhere_turns_over_link_bound": median_or_none(over_link_bound),
        "stillhere_turns_over_link_bound_rounds": over_link_bound,
        "stillhere_per_piece_turns_over_link_bound": median_or_none(
            paired_ratios(tput, "stillhere-per-piece", "link-bound")
        ),
        "stillhere_turns_over_stateless": median_or_none(
            paired_ratios(tput, "stillhere", "stateless")
        ),
        "resume_fraction": {
            "stillhere": report.get("resume_fraction"),
            **{name: f.get("resume_fraction") for name, f in flap.items()},
        },
        "rss_peak_mb": {
            "stillhere": report.get("server_rss_mb_peak"),
            **{name: f.get("server_rss_mb_peak") for name, f in flap.items()},
        },
        "stillhere_rss_over_link_bound": ratio(
            report.get("server_rss_mb_peak"), flap.get("link-bound", {}).get("server_rss_mb_peak")
        ),
    }


def paired_ratios(
    tput: dict[str, Any], server: str, baseline: str, key: str = "rounds_turns_per_s"
) -> list[float]:
    """`server`'s turns/s (or another figure of each round, `key`) over `baseline`'s, round
    by round. The two are timed one after the other in each round, so a round's ratio
    compares them on the machine as it was then; whatever else slows the machine down for a
    while cancels out of it."""
    mine = (tput.get(server) or {}).get(key) or []
    theirs = (tput.get(baseline) or {}).get(key) or []
    pairs = (ratio(a, b) for a, b in zip(mine, theirs, strict=False))
    return [r for r in pairs if r is not None]


def median_or_none(values: Sequence[float], digits: int = 3) -> float | None:
    return round(statistics.median(values), digits) if values else None


def targets(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def target(name: str, measured: Any, goal: str, met: bool | None) -> None:
        out[name] = {"measured": measured, "target": goal, "met": met}

    reconnects, resumed = report.get("reconnects", 0), report.get("resumed", 0)
    target("all_resumed", f"{resumed}/{reconnects}", "100%", resumed == reconnects)
    lost_dup = {k: report.get(k) for k in CORRECTNESS_KEYS if report.get(k)}
    target("nothing_lost_or_duplicated", lost_dup or 0, "0", not lost_dup)
    p99 = (report.get("resume_ms") or {}).get("p99")
    target("resume_p99_ms", p99, "< 50", p99 is not None and p99 < TARGETS["resume_p99_ms"])
    kb = report.get("rss_per_conversation_kb")
    target("rss_per_conversation_kb", kb, "<= 64", kb is not None and kb <= 64.0)
    if report.get("storm_requested"):
        s, missing = report.get("storm_s"), report.get("storm_not_resumed")
        met = s is not None and s <= TARGETS["storm_s"] and missing == 0
        target("storm_s", {"storm_s": s, "not_resumed": missing}, "all within 10 s", met)
    baselines = report.get("baselines") or {}
    r = baselines.get("stillhere_turns_over_link_bound")
    if baselines:
        target("turns_over_link_bound", r, ">= 0.70", r is not None and r >= TARGETS["turns_ratio"])
    return out


# -- output ---------------------------------------------------------------------------------


def _total(figures: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    """The sum of these counts; None for a server that was not flapped (throughput only)."""
    return sum(figures.get(k) or 0 for k in keys) if figures else None


def _cell(value: Any, width: int = 9) -> str:
    if value is None:
        return f"{'-':>{width}}"
    if isinstance(value, float):
        return f"{value:{width}.2f}"
    return f"{value!s:>{width}}"


def baseline_rows(report: dict[str, Any]) -> list[str]:
    """The baselines table: each server's zero-latency turns/s and its ratio to link-bound,
    beside its flap figures (none for a server that was only timed)."""
    baselines = report.get("baselines")
    if not baselines:
        return []
    tput, flap = baselines.get("throughput", {}), baselines.get("flap", {})
    lines = [
        f"  {'baselines':<21}{'turns/s':>9}{'ratio':>9}{'resumed':>9}{'rss peak':>10}"
        f"{'lost':>7}{'dup':>7}{'loop on core':>14}{'cpu ms/turn srv pg bench':>26}"
        f"{'steal':>7}"
    ]
    for name in tput:
        tps = (tput.get(name) or {}).get("turns_per_s")
        over = median_or_none(paired_ratios(tput, name, "link-bound"))
        f = report if name == "stillhere" else flap.get(name, {})
        lost = _total(f, ("lost_says", "lost_replies", "lost_events"))
        dup = _total(f, ("duplicated_says", "duplicated_replies", "duplicated_events"))
        timed = tput.get(name) or {}
        per_turn = timed.get("cpu_ms_per_turn") or {}
        lines.append(
            f"  {name:<21}{_cell(tps)}{_cell(over)}"
            f"{_cell(f.get('resume_fraction'))}{_cell(f.get('server_rss_mb_peak'), 10)}"
            f"{_cell(lost, 7)}{_cell(dup, 7)}{_cell(timed.get('loop_on_core'), 14)}"
            f"{_cell(per_turn.get('server'), 10)}{_cell(per_turn.get('postgres'), 8)}"
            f"{_cell(per_turn.get('bench'), 8)}{_cell(timed.get('steal_cores'), 7)}"
        )
    return lines


def _server_collector_line(report: dict[str, Any]) -> str:
    """Each generation's collections while flapping, and the bucket bound of the longest."""
    cells = []
    for g in range(3):
        gen = report.get(f"server_gc{g}_ms") or {}
        cells.append(f"gen{g} {gen.get('n')} (longest ≤ {gen.get('p100_le')} ms)")
    return "  server collector   " + ", ".join(cells)


def _percentile_row(label: str, p: dict[str, Any], key: str = "p{}", tail: str = "") -> str:
    """A row of the (ms) block: p50, p95 and p99 (`key` names them: `p{}_le` for the server's
    bucket bounds), then the count, or `tail`."""
    cells = "".join(_cell(p.get(key.format(q))) for q in (50, 95, 99))
    return f"  {label:<17}{cells}   {tail or 'n=' + str(p.get('n'))}"


def _resume_by_steal_lines(report: dict[str, Any]) -> list[str]:
    split = report.get("resume_ms_by_steal")
    if not split:
        return []
    labels = (("quiet", "  no steal"), ("stolen", f"  steal ≥ {STOLEN_CORES:g}"))
    return [_percentile_row(label, split[key]) for key, label in labels]


def table(report: dict[str, Any]) -> str:
    r, t = report.get("resume_ms") or {}, report.get("turn_ms") or {}
    h = report.get("server_hello_ms") or {}
    sl, bl = report.get("server_loop_lag_ms") or {}, report.get("bench_loop_lag_ms") or {}
    gc_ = report.get("bench_gc") or {}
    lines = [
        f"stillhere flap bench: {report['clients']} phones, {report['transport']}, "
        f"{report['duration_s']:.0f} s, seed {report['seed']}, "
        f"rehearsal {report['rehearsal']['latency_s']:g} s + "
        f"{report['rehearsal']['rate_words_per_s']:g} w/s, "
        f"{report['machine']['cpu_count']} CPUs, {report.get('event_loop')} loop",
        f"  link events        {report.get('link_events')}",
        f"  reconnects         {_cell(report.get('reconnects'))}   resumed {report.get('resumed')}"
        f"   new conversations unexpected {report.get('new_conversations_unexpected')}",
        f"  says               {_cell(report.get('says'))}   lost {report.get('lost_says')}"
        f"   duplicated {report.get('duplicated_says')}   not stored {report.get('not_stored')}"
        f" (acked {report.get('acked_not_stored')})   stored twice {report.get('stored_twice')}",
        f"  store timeouts     {(report.get('error_frames') or {}).get('unavailable', 0)}"
        f" says answered unavailable, {report.get('server_resends_joined')} resends waited"
        " on their pending write",
        f"  replies            {_cell(report.get('replies'))}   lost {report.get('lost_replies')}"
        f"   duplicated {report.get('duplicated_replies')}   broken {report.get('broken_replies')}",
        f"  events             duplicated {report.get('duplicated_events')}"
        f"   lost {report.get('lost_events')}   out of order {report.get('out_of_order_events')}",
        f"  {'(ms)':<17}{'p50':>9}{'p95':>9}{'p99':>9}",
        _percentile_row("resume", r),
        *_resume_by_steal_lines(report),
        _percentile_row("server hello ≤", h, "p{}_le"),
        _percentile_row("server loop lag ≤", sl, "p{}_le"),
        _percentile_row("bench loop lag", bl, tail=f"max={bl.get('max')} n={bl.get('n')}"),
        f"  bench collector    {gc_.get('mode')}: collections {gc_.get('collections')}, "
        f"longest {gc_.get('pause_ms_max')} ms, {gc_.get('pause_s_total')} s in all; "
        f"grew {gc_.get('rss_mb_grown')} MB, {gc_.get('freed_after_run')} objects freed after",
        _server_collector_line(report),
        _percentile_row("turn", t),
        f"  server rss         idle {report.get('server_rss_mb_idle')} MB, "
        f"live {report.get('server_rss_mb_live')} MB ({report.get('live_conversations')} live), "
        f"peak {report.get('server_rss_mb_peak')} MB",
        f"  per conversation   {_cell(report.get('rss_per_conversation_kb'))} KB"
        f"   threads peak {report.get('server_threads_peak')}",
    ]
    if report.get("storm_requested"):
        storm = report.get("storm") or {}
        lines.append(
            f"  storm              {_cell(report.get('storm_s'))} s until all resumed, "
            f"not resumed {report.get('storm_not_resumed')}, "
            f"reconnect ms {storm.get('reconnect_ms')}"
        )
    lines += flap_tls.lines(report)
    lines += baseline_rows(report)
    lines.append("  targets:")
    for name, t in report.get("targets", {}).items():
        mark = "met" if t["met"] else "MISSED"
        lines.append(f"    {name:<28} {mark:<7} measured {t['measured']}  (target {t['target']})")
    return "\n".join(lines)


def problems(report: dict[str, Any]) -> list[str]:
    found = [f"{k}: {report[k]}" for k in CORRECTNESS_KEYS if report.get(k)]
    found += flap_tls.problems(report)
    if report.get("ramp_failed"):
        found.append(f"{report['ramp_failed']} phones failed to start")
    if report.get("phone_failures"):
        found.append(f"phone failures: {report['phone_failures']}")
    if report.get("unsettled"):
        found.append(
            f"{report['unsettled']} phones not settled at the end, "
            f"{report.get('client_wedged_phones')} of them with a wedged client "
            "(UP, link ended, no writer: see unsettled_phones)"
        )
    stop = report.get("server_stop") or {}
    if stop.get("killed") or stop.get("exit_code") not in (0, None) or stop.get("log_problems"):
        found.append(f"server stop: {stop}")
    return found


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run every phase in a tmp dir (removed after) and return the report. The key
    `_resume_points` holds (s, ms) of every resume, for the plot."""
    root = Path(tempfile.mkdtemp(prefix="stillhere-flap-"))
    try:
        async with asyncio.timeout(args.timeout):
            return await _run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _name_results(args: argparse.Namespace) -> None:
    """The storm's, the cluster comparison's and TLS's figures are files of their own,
    which `--results` given alone replaces."""
    if args.cluster or args.storm or args.tls:
        args.results_name = (
            "flap_cluster" if args.cluster else "flap_storm" if args.storm else "flap_tls"
        )
        if args.results == results.RESULTS / "flap.json":
            args.results = results.RESULTS / f"{args.results_name}.json"


async def run(args: argparse.Namespace) -> int:
    """Run the bench; 0 when nothing was lost, duplicated or failed, 1 if so, 2 if it could
    not finish. Timing and memory targets are reported, not part of the exit code."""
    # The phones' process holds a large long-lived heap too: at CPython's thresholds, its
    # full collections froze its loop for a second now and then, and every resume timed
    # across one looked a second slower (bench_loop_lag_ms max). These thresholds hold for
    # the whole run; while the phones flap, `--phones-gc off` (the default) holds their
    # collector off altogether (bench/phones_gc.py says why).
    tune_collector(PHONES_GC_THRESHOLDS)
    _name_results(args)
    if args.cluster:
        return await _cluster(args)
    try:
        report = await measure(args)
    except (procs.ServerError, BenchFailed, TimeoutError) as failed:
        print(f"flap bench failed: {type(failed).__name__}: {failed}", file=sys.stderr)
        return 2
    resume_points = report.pop("_resume_points")
    print(table(report))
    found = problems(report)
    if found:
        print("problems:\n  " + "\n  ".join(found))
        examples = report.get("examples") or {}
        for kind, seen in examples.items():
            print(f"  e.g. {kind}: " + "; ".join(seen[:3]))
    results.save(args, report, steal_s=report["cpu_s_during_flapping"]["steal"])
    if args.plot is not None:
        from bench.flap_plot import plot

        plot(args.plot, report, resume_points)
        print(f"plot written to {args.plot}")
    return 1 if found else 0


async def _cluster(args: argparse.Namespace) -> int:
    """`--cluster N`: bench/flap_cluster.py in a tmp dir (removed after); 2 if it could
    not finish."""
    root = Path(tempfile.mkdtemp(prefix="stillhere-flap-cluster-"))
    try:
        async with asyncio.timeout(args.timeout):
            return await flap_cluster.run(args, root)
    except (procs.ServerError, TimeoutError) as failed:
        print(f"flap bench failed: {type(failed).__name__}: {failed}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(root, ignore_errors=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.flap", description=DESCRIPTION)
    add_options(parser)
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_on_loop(run(args), args.event_loop)  # the phones on the servers' loop


if __name__ == "__main__":
    sys.exit(main())
