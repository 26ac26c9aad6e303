"""Live benchmark: memory per live conversation, and resume latency against new-device latency.

Starts a real `stillhere serve` (embedded PostgreSQL in a temporary data dir, rehearsal
model), opens N phones over WebSocket that each say hello and `--turns` says (one by
default) and stay connected, then drops and resumes a sample of them. Run:

    .venv/bin/python -m bench.live --conversations 1000 --json bench/out/live.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil

from bench import results
from bench.procs import Server, log_problems, log_tail, wait_ready
from bench.procs import start as start_server
from bench.procs import stop as stop_server

CONNECT_TIMEOUT_S = 15.0
FRAME_TIMEOUT_S = 30.0
PHONE_TIMEOUT_S = 120.0
CLOSE_TIMEOUT_S = 5.0
MAX_FRAMES_PER_WAIT = 10_000
Report = dict[str, Any]
DESCRIPTION = "memory per live conversation, and resume latency against new devices"


class BenchError(Exception):
    """A phone saw something other than what the protocol promises."""


# -- the server process ---------------------------------------------------------------------


# -- phones ---------------------------------------------------------------------------------


@dataclass
class Link:
    """One WebSocket; a reader task answers pings and queues (arrival time, frame)."""

    ws: aiohttp.ClientWebSocketResponse
    frames: asyncio.Queue[tuple[float, dict[str, Any]]]
    reader: asyncio.Task[None]


@dataclass
class Phone:
    device: str
    link: Link
    conversation: str
    last_seq: int


def new_device() -> str:
    return "bench-" + secrets.token_urlsafe(24)  # 38 characters


async def _read(ws: aiohttp.ClientWebSocketResponse, frames: asyncio.Queue[Any]) -> None:
    async for message in ws:
        if message.type is aiohttp.WSMsgType.TEXT:
            frames.put_nowait((time.perf_counter(), json.loads(message.data)))
    frames.put_nowait((time.perf_counter(), {"type": "_closed"}))


async def open_link(http: aiohttp.ClientSession, url: str) -> Link:
    ws = await asyncio.wait_for(http.ws_connect(url), CONNECT_TIMEOUT_S)
    frames: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
    return Link(ws, frames, asyncio.create_task(_read(ws, frames)))


async def _stop_reader(link: Link) -> None:
    link.reader.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(link.reader, CLOSE_TIMEOUT_S)


def abort(link: Link) -> None:
    """Drop the link as a tunnel would: no close handshake, the transport just goes."""
    connection = getattr(link.ws, "_conn", None)
    transport = connection.transport if connection is not None else None
    if transport is not None:
        transport.abort()


async def close(link: Link) -> None:
    await _stop_reader(link)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(link.ws.close(), CLOSE_TIMEOUT_S)


async def expect(link: Link, kind: str) -> tuple[float, dict[str, Any], int]:
    """(arrival time, frame) of the next frame of this type, and the highest seq seen."""
    deadline = time.perf_counter() + FRAME_TIMEOUT_S
    top = -1
    for _ in range(MAX_FRAMES_PER_WAIT):
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        try:
            at, frame = await asyncio.wait_for(link.frames.get(), left)
        except TimeoutError:
            break
        top = max(top, seq_of(frame))
        if frame["type"] in ("error", "bye", "_closed"):
            raise BenchError(f"{frame['type']} while waiting for {kind}: {frame}")
        if frame["type"] == kind:
            return at, frame, top
    raise BenchError(f"no {kind} within {FRAME_TIMEOUT_S:.0f} s")


def seq_of(frame: dict[str, Any]) -> int:
    seq = frame.get("seq")
    return seq if isinstance(seq, int) else -1


def drain(link: Link) -> int:
    """Highest seq among frames already queued (nothing is expected after reply.end)."""
    top = -1
    for _ in range(MAX_FRAMES_PER_WAIT):
        if link.frames.empty():
            break
        top = max(top, seq_of(link.frames.get_nowait()[1]))
    return top


async def hello(link: Link, device: str, **resume: Any) -> tuple[float, dict[str, Any]]:
    """Milliseconds from sending hello to the arrival of welcome, and the welcome."""
    frame = {"type": "hello", "v": 1, "device": device, **resume}
    sent = time.perf_counter()
    await link.ws.send_str(json.dumps(frame))
    arrived, welcome, _ = await expect(link, "welcome")
    return (arrived - sent) * 1000.0, welcome


@dataclass(frozen=True, slots=True)
class Talk:
    """What each phone does before it idles: `turns` says, each reply confirmed with an
    `ack` frame (as the reference client does) when `ack` is set."""

    turns: int = 1
    ack: bool = True


async def say(phone: Phone, text: str = "hello", *, ack: bool = False) -> None:
    await phone.link.ws.send_str(json.dumps({"type": "say", "id": uuid.uuid4().hex, "text": text}))
    _, end, top = await expect(phone.link, "reply.end")
    phone.last_seq = max(phone.last_seq, top, int(end["seq"]))
    if ack:
        await phone.link.ws.send_str(json.dumps({"type": "ack", "seq": phone.last_seq}))


async def _live_phone(http: aiohttp.ClientSession, url: str, talk: Talk) -> Phone:
    device = new_device()
    link = await open_link(http, url)
    try:
        _, welcome = await hello(link, device)
        phone = Phone(device, link, welcome["conversation"], int(welcome.get("seq") or 0))
        for n in range(talk.turns):
            await say(phone, "hello" if n == 0 else f"and number {n}, please", ack=talk.ack)
        return phone
    except BaseException:
        abort(link)
        await _stop_reader(link)
        raise


async def live_phone(
    http: aiohttp.ClientSession, url: str, gate: asyncio.Semaphore, talk: Talk
) -> Phone:
    async with gate:
        return await asyncio.wait_for(_live_phone(http, url, talk), PHONE_TIMEOUT_S * talk.turns)


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


async def ramp(
    http: aiohttp.ClientSession, url: str, n: int, concurrency: int, talk: Talk
) -> tuple[list[Phone], Counter[str]]:
    """N phones, at most `concurrency` connecting at once; the live ones and the failures."""
    gate = asyncio.Semaphore(concurrency)
    outcomes = await asyncio.gather(
        *(live_phone(http, url, gate, talk) for _ in range(n)), return_exceptions=True
    )
    phones = [p for p in outcomes if isinstance(p, Phone)]
    errors = Counter(describe(e) for e in outcomes if isinstance(e, BaseException))
    return phones, errors


# -- resume against new ---------------------------------------------------------------------


async def resume(http: aiohttp.ClientSession, url: str, phone: Phone) -> tuple[float, bool]:
    """Drop the phone's link, reconnect, hello with its conversation and last seq."""
    phone.last_seq = max(phone.last_seq, drain(phone.link))
    abort(phone.link)
    await _stop_reader(phone.link)
    phone.link = await open_link(http, url)
    ms, welcome = await hello(
        phone.link, phone.device, conversation=phone.conversation, last_seq=phone.last_seq
    )
    ok = welcome.get("resumed") is True and welcome.get("conversation") == phone.conversation
    return ms, ok


async def brand_new(http: aiohttp.ClientSession, url: str) -> float:
    link = await open_link(http, url)
    try:
        ms, welcome = await hello(link, new_device())
        if welcome.get("resumed") is not False:
            raise BenchError(f"a brand-new device was resumed: {welcome}")
        return ms
    finally:
        await close(link)


@dataclass
class Latencies:
    resume_ms: list[float]
    new_ms: list[float]
    resumed_ok: int
    errors: Counter[str]


async def _timed(job: Any, latencies: Latencies) -> Any:
    try:
        return await asyncio.wait_for(job, PHONE_TIMEOUT_S)
    except Exception as error:
        latencies.errors[describe(error)] += 1
        return None


async def _one_resume(http: aiohttp.ClientSession, url: str, phone: Phone, out: Latencies) -> None:
    result = await _timed(resume(http, url, phone), out)
    if result is not None:
        out.resume_ms.append(result[0])
        out.resumed_ok += int(result[1])


async def _one_new(http: aiohttp.ClientSession, url: str, out: Latencies) -> None:
    result = await _timed(brand_new(http, url), out)
    if result is not None:
        out.new_ms.append(result)


async def measure_latencies(
    http: aiohttp.ClientSession, url: str, sample: Sequence[Phone]
) -> Latencies:
    """One at a time, alternating which goes first, so both see the same server."""
    out = Latencies([], [], 0, Counter())
    for i, phone in enumerate(sample):
        if i % 2 == 0:
            await _one_resume(http, url, phone, out)
            await _one_new(http, url, out)
        else:
            await _one_new(http, url, out)
            await _one_resume(http, url, phone, out)
    return out


# -- the run --------------------------------------------------------------------------------


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(np.asarray(values), [50, 95, 99])
    return {"p50": round(float(p50), 2), "p95": round(float(p95), 2), "p99": round(float(p99), 2)}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


async def close_all(phones: Sequence[Phone], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(phone: Phone) -> None:
        async with gate:
            await close(phone.link)

    await asyncio.gather(*(one(p) for p in phones))


def connector_limit(args: argparse.Namespace) -> int:
    return args.conversations + 2 * args.sample + 100


async def measure(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=connector_limit(args), limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        ready_s = await wait_ready(server)
        url = server.base_url + "/v1/ws"
        await asyncio.sleep(args.settle)
        idle_mb, idle_threads = server.rss_mb(), server.threads()
        started = time.perf_counter()
        talk = Talk(args.turns, args.ack)
        phones, ramp_errors = await ramp(http, url, args.conversations, args.concurrency, talk)
        ramp_s = time.perf_counter() - started
        await asyncio.sleep(args.settle)
        live_mb, live_threads = server.rss_mb(), server.threads()
        sample = random.Random(args.seed).sample(phones, min(args.sample, len(phones)))
        latencies = await measure_latencies(http, url, sample)
        await close_all(phones, args.concurrency)
    live = len(phones)
    return {
        "ready_s": round(ready_s, 2),
        "ramp_s": round(ramp_s, 2),
        "conversations_live": live,
        "rss_mb_idle": round(idle_mb, 1),
        "rss_mb_live": round(live_mb, 1),
        "rss_per_conversation_kb": round((live_mb - idle_mb) * 1024 / live, 1) if live else None,
        "server_threads_idle": idle_threads,
        "server_threads": live_threads,
        "sample": len(sample),
        "latencies": latencies,
        "ramp_errors": dict(ramp_errors),
    }


def report_from(args: argparse.Namespace, measured: dict[str, Any]) -> dict[str, Any]:
    lat: Latencies = measured.pop("latencies")
    resume_ms, new_ms = percentiles(lat.resume_ms), percentiles(lat.new_ms)
    return {
        "conversations": args.conversations,
        "turns": args.turns,
        "ack": args.ack,
        **measured,
        "resume_ms": resume_ms,
        "new_ms": new_ms,
        "resume_over_new": {
            "p50": ratio(resume_ms["p50"], new_ms["p50"]),
            "p99": ratio(resume_ms["p99"], new_ms["p99"]),
        },
        "resumed_ok": lat.resumed_ok,
        "latency_errors": dict(lat.errors),
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpu_count_physical": psutil.cpu_count(logical=False),
            "memory_mb": round(psutil.virtual_memory().total / (1024 * 1024)),
            "python": sys.version.split()[0],
        },
    }


def _cell(value: float | None) -> str:
    return f"{value:9.2f}" if value is not None else f"{'-':>9}"


def table(report: dict[str, Any]) -> str:
    r, n, o = report["resume_ms"], report["new_ms"], report["resume_over_new"]
    lines = [
        f"stillhere live bench: {report['conversations']} conversations "
        f"({report['conversations_live']} live, {report['turns']} turns each, acks "
        f"{'on' if report['ack'] else 'off'}), {report['machine']['cpu_count']} CPUs",
        f"  rss idle           {report['rss_mb_idle']:9.1f} MB",
        f"  rss live           {report['rss_mb_live']:9.1f} MB",
        f"  per conversation   {_cell(report['rss_per_conversation_kb'])} KB",
        f"  server threads     {report['server_threads_idle']:9d} idle, "
        f"{report['server_threads']} live",
        f"  ramp               {report['ramp_s']:9.2f} s",
        f"  {'hello->welcome':<17}{'p50':>9}{'p95':>9}{'p99':>9}   (ms, n={report['sample']})",
        f"  {'resume':<17}{_cell(r['p50'])}{_cell(r['p95'])}{_cell(r['p99'])}",
        f"  {'new device':<17}{_cell(n['p50'])}{_cell(n['p95'])}{_cell(n['p99'])}",
        f"  {'resume / new':<17}{_cell(o['p50'])}{'':>9}{_cell(o['p99'])}",
        f"  resumed ok         {report['resumed_ok']:9d} / {report['sample']}",
    ]
    return "\n".join(lines)


def problems(report: dict[str, Any]) -> list[str]:
    found = [f"ramp: {k} (x{v})" for k, v in report["ramp_errors"].items()]
    found += [f"latency: {k} (x{v})" for k, v in report["latency_errors"].items()]
    if report["resumed_ok"] != report["sample"]:
        found.append(f"only {report['resumed_ok']} of {report['sample']} resumes resumed")
    stop = report.get("server_stop", {})
    if stop.get("killed") or stop.get("exit_code") not in (0, None):
        found.append(f"server stop: {stop}")
    if report.get("server_log_problems"):
        found.append(f"{report['server_log_problems']} problem lines in the server log")
    return found


def keep_log(log_path: Path, target: Path | None) -> None:
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log_path, target)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.live", description=DESCRIPTION)
    parser.add_argument("--conversations", type=int, default=1000, help="live phones (N)")
    parser.add_argument("--sample", type=int, default=200, help="phones resumed, new devices (M)")
    parser.add_argument("--turns", type=int, default=1, help="says of each phone before it idles")
    parser.add_argument(
        "--ack",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="confirm each reply with an ack frame, as the reference client does (default on)",
    )
    parser.add_argument("--concurrency", type=int, default=50, help="phones connecting at once")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before reading RSS")
    parser.add_argument("--seed", type=int, default=1, help="seed of the resume sample")
    parser.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole run (s)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "live")
    parser.add_argument("--server-log", type=Path, default=None, help="keep the server log here")
    args = parser.parse_args(argv)
    if args.conversations < 1 or args.sample < 1 or args.concurrency < 1:
        parser.error("--conversations, --sample and --concurrency must be at least 1")
    return args


async def _within(job: Coroutine[Any, Any, Report], timeout: float) -> Report:
    async with asyncio.timeout(timeout):
        return await job


def served(
    measure: Callable[[Server], Coroutine[Any, Any, Report]],
    timeout: float,
    extra: Sequence[str] = (),
    keep: Path | None = None,
) -> Report:
    """Start a server (the rehearsal model instant, `extra` options) in a temporary dir, run
    `measure` on it for at most `timeout` seconds, stop it and remove the dir whatever
    happens: what `measure` returned, with the server's stop and its log's problems and tail
    (the log kept at `keep` if given)."""
    root = Path(tempfile.mkdtemp(prefix="stillhere-bench-"))
    measured: Report | None = None
    try:
        server = start_server("stillhere", root, latency=0.0, rate=0.0, extra=list(extra))
        try:
            measured = asyncio.run(_within(measure(server), timeout))
        finally:
            stop = stop_server(server)
            found, tail = log_problems(server.log_path), log_tail(server.log_path)
            keep_log(server.log_path, keep)
            if measured is None:
                print("server log tail:\n  " + "\n  ".join(tail), file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        **measured,
        "server_stop": stop,
        "server_log_problems": len(found),
        "server_log_tail": tail,
    }


def run(args: argparse.Namespace) -> Report:
    """Measure on a server of its own, started and stopped around the run."""
    measured = served(lambda server: measure(server, args), args.timeout, keep=args.server_log)
    return report_from(args, measured)


def report_main(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], Report],
    table: Callable[[Report], str],
    problems: Callable[[Report], list[str]],
) -> int:
    """Run a bench, print its table and problems, write its JSON: exit 0 when no problem,
    1 with problems, 2 when it could not finish."""
    try:
        report = run(args)
    except (BenchError, TimeoutError) as failed:
        print(f"bench failed: {describe(failed) if str(failed) else 'timed out'}", file=sys.stderr)
        return 2
    print(table(report))
    found = problems(report)
    if found:
        print("problems:\n  " + "\n  ".join(found))
        if report.get("server_log_tail"):
            print("server log tail:\n  " + "\n  ".join(report["server_log_tail"]))
    results.save(args, report)
    return 1 if found else 0


def main(argv: Sequence[str] | None = None) -> int:
    return report_main(parse_args(argv), run, table, problems)


if __name__ == "__main__":
    sys.exit(main())
