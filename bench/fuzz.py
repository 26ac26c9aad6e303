"""`stillhere bench fuzz`: property-based fuzzing of a real server's frames, bodies, streams.

Starts a real `stillhere serve` (embedded PostgreSQL in a tmp data dir, rehearsal model)
and lets Hypothesis draw link scripts (`bench.fuzz_frames`), POST bodies and event-stream
requests, each checked by `bench.fuzz_probe` against what docs/protocol.md promises. The
same properties run in CI (tests/test_fuzz.py, the `stillhere-ci` profile, a few dozen
examples); this command runs as many as asked and reports the frames and requests tried.

    .venv/bin/python -m bench.fuzz --examples 2000 --seed 1 --json /tmp/fuzz.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisWarning

from bench import procs
from bench.flap_db import dsn_of
from bench.fuzz_frames import http_requests, scripts, stream_requests
from bench.fuzz_probe import PERSONS, Probe
from providers.event_loop import run as run_on_loop

DESCRIPTION = "property-based fuzzing of frames, POST bodies and event streams, on a real server"
# The limits the fuzzed server runs with: frames over 16 KB are refused, so a say's text
# over its 4000 characters fits in one; the rate limit is lifted, so that what is fuzzed is
# the frames, not the bucket (tests/test_protocol.py covers the bucket).
MAX_FRAME_BYTES = 16384
SERVER_OPTIONS = [
    *("--max-frame-bytes", str(MAX_FRAME_BYTES)),
    *("--frames-per-s", "100000", "--frame-burst", "100000"),
]
settings.register_profile(
    "stillhere-ci",
    max_examples=50,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every CI run; the bench draws fresh ones
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
persons = st.integers(min_value=0, max_value=PERSONS - 1)


def frame_property(probe: Probe, profile: settings) -> Callable[[], None]:
    """The link scripts' property, as a Hypothesis test bound to `probe` (call it in a
    thread other than the probe's loop)."""

    @profile
    @given(scripts, persons)
    def fuzz_frames(script: tuple[list[Any], int | None], person: int) -> None:
        wires, hello_at = script
        probe.script(wires, hello_at, person)

    return fuzz_frames


def body_property(probe: Probe, profile: settings) -> Callable[[], None]:
    """The POST bodies' property, bound to `probe` like `frame_property`."""

    @profile
    @given(http_requests, persons)
    def fuzz_bodies(request: tuple[str, Any, str], person: int) -> None:
        path, wire, content_type = request
        probe.request(path, wire, content_type, person)

    return fuzz_bodies


def stream_property(probe: Probe, profile: settings) -> Callable[[], None]:
    """Event streams' property: `GET /v1/events` with drawn queries and `Last-Event-ID`."""

    @profile
    @given(stream_requests, persons)
    def fuzz_streams(request: tuple[dict[str, Any], str | None], person: int) -> None:
        query, last_event_id = request
        probe.stream(query, last_event_id, person)

    return fuzz_streams


def _each(failed: Exception) -> list[Exception]:
    """The failures Hypothesis found: one, or a group of distinct ones."""
    if isinstance(failed, ExceptionGroup):
        return [one for inner in failed.exceptions for one in _each(inner)]
    return [failed]


def run_property(test: Callable[[], None]) -> None:
    """Run a property (in a thread of its own). Hypothesis, started outside the main thread,
    warns that it cannot manage that thread's PRNG (nothing here draws from it), and that a
    frame over the size limit makes a long repr (it is meant to)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "It looks like `register_random`", HypothesisWarning)
        warnings.filterwarnings("ignore", "Generating overly large repr", HypothesisWarning)
        test()


def add_parser(subparsers: Any) -> None:
    """`stillhere bench fuzz`."""
    parser = subparsers.add_parser("fuzz", help=DESCRIPTION, description=DESCRIPTION)
    add_options(parser)
    parser.set_defaults(run=run)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--examples",
        type=int,
        default=500,
        help="examples per property (500): link scripts and POSTs",
    )
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis's seed (0)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--timeout", type=float, default=3 * 3600.0, help="bound on the run, s")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start a server, run both properties for `--examples` each, stop it; the report."""
    root = Path(tempfile.mkdtemp(prefix="stillhere-fuzz-"))
    server = procs.start("stillhere", root, latency=0.0, rate=0.0, extra=SERVER_OPTIONS)
    report: dict[str, Any] = {"examples_asked": args.examples, "seed": args.seed}
    loop = asyncio.get_running_loop()
    try:
        await procs.wait_ready(server)
        assert server.pgdata is not None
        probe = Probe(server.base_url, dsn_of(server.pgdata), loop, MAX_FRAME_BYTES)
        await probe.open()
        profile = settings(
            settings.get_profile("stillhere-ci"), max_examples=args.examples, derandomize=False
        )
        started = time.perf_counter()
        failures: list[str] = []
        try:
            async with asyncio.timeout(args.timeout):
                for prop in (frame_property, body_property, stream_property):
                    test = seed(args.seed)(prop(probe, profile))
                    try:
                        await asyncio.to_thread(run_property, test)
                    except Exception as failed:  # the shrunk example's, or a group of them
                        failures += [f"{prop.__name__}: {one}"[:2000] for one in _each(failed)]
        finally:
            probe.stop()  # a timeout or Ctrl-C: the property's thread ends too
            await probe.close()
        report.update(
            seconds=round(time.perf_counter() - started, 1),
            examples=probe.counts.examples,
            frames=probe.counts.frames,
            requests=probe.counts.requests,
            errors=dict(sorted(probe.counts.errors.items())),
            answers=dict(sorted(probe.counts.answers.items())),
            statuses={str(k): n for k, n in sorted(probe.counts.statuses.items())},
            failures=failures,
            server_alive=server.proc.poll() is None,
        )
        return report
    finally:
        report["server_stop"] = await loop.run_in_executor(None, procs.stop, server)
        shutil.rmtree(root, ignore_errors=True)


def table(report: dict[str, Any]) -> str:
    lines = [
        f"link scripts       {report['examples']} (asked {report['examples_asked']} per property)",
        f"frames tried       {report['frames']}",
        f"requests tried     {report['requests']} POSTs and streams ("
        + ", ".join(f"HTTP {k} {n}" for k, n in report["statuses"].items())
        + ")",
        f"seconds            {report['seconds']}",
        "error codes        " + ", ".join(f"{code} {n}" for code, n in report["errors"].items()),
        "server frames      " + ", ".join(f"{k} {n}" for k, n in report["answers"].items()),
        f"server alive       {report['server_alive']}",
        f"failures           {len(report['failures'])}",
    ]
    lines += [f"  {failure}" for failure in report["failures"]]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    """0 when every property held, 1 when one did not, 2 when the run could not finish."""
    try:
        report = await measure(args)
    except (procs.ServerError, TimeoutError) as failed:
        print(f"fuzz bench failed: {type(failed).__name__}: {failed}", file=sys.stderr)
        return 2
    print(table(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["failures"] or not report["server_alive"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=DESCRIPTION)
    add_options(parser)
    return run_on_loop(run(parser.parse_args(argv)), "asyncio")


if __name__ == "__main__":
    sys.exit(main())
