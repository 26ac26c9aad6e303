"""`stillhere bench fuzz`: property-based fuzzing of a real server's frames and POST bodies.

Starts a real `stillhere serve` (embedded PostgreSQL in a tmp data dir, rehearsal model)
and lets Hypothesis draw link scripts (`bench.fuzz_frames`) and POST bodies, each checked by
`bench.fuzz_probe` against what docs/protocol.md promises. The same properties run in CI
(tests/test_fuzz.py, the `stillhere-ci` profile, a few dozen examples); this command runs
as many as asked and reports how many frames and requests it tried.

    .venv/bin/python -m bench.fuzz --examples 2000 --seed 1 --json /tmp/fuzz.json
"""

from __future__ import annotations

import argparse
import asyncio
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
from bench.fuzz_frames import http_requests, scripts
from bench.fuzz_probe import PERSONS, Probe
from providers.event_loop import run as run_on_loop

DESCRIPTION = "property-based fuzzing of protocol frames and POST bodies against a real server"
# The limits the fuzzed server runs with: frames over 16 KB are refused, so a say's text
# over its 4000 characters fits in one; the rate limit is lifted, so that what is fuzzed is
# the frames, not the bucket (tests/test_protocol.py covers the bucket).
SERVER_OPTIONS = [
    "--max-frame-bytes",
    "16384",
    "--frames-per-s",
    "100000",
    "--frame-burst",
    "100000",
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


def run_property(test: Callable[[], None]) -> None:
    """Run a property (in a thread of its own). Hypothesis, started outside the main thread,
    warns that it cannot manage that thread's PRNG: nothing here draws from it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "It looks like `register_random`", HypothesisWarning)
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
        probe = Probe(server.base_url, dsn_of(server.pgdata), loop)
        await probe.open()
        profile = settings(
            settings.get_profile("stillhere-ci"), max_examples=args.examples, derandomize=False
        )
        started = time.perf_counter()
        failures: list[str] = []
        try:
            for prop in (frame_property, body_property):
                test = seed(args.seed)(prop(probe, profile))
                try:
                    await asyncio.wait_for(asyncio.to_thread(run_property, test), args.timeout)
                except AssertionError as failed:  # Hypothesis re-raises the shrunk example's
                    failures.append(f"{prop.__name__}: {failed}"[:2000])
        finally:
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
        f"POSTs tried        {report['requests']} ("
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
    return await procs.finish("fuzz", measure(args), args.json, table, _exit_code)


def _exit_code(report: dict[str, Any]) -> int:
    return 1 if report["failures"] or not report["server_alive"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=DESCRIPTION)
    add_options(parser)
    return run_on_loop(run(parser.parse_args(argv)), "asyncio")


if __name__ == "__main__":
    sys.exit(main())
