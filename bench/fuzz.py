"""`stillhere-bench fuzz`: property-based fuzzing of a real server's frames, bodies, streams.

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
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import procs, results
from bench.flap_db import dsn_of
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


def add_parser(subparsers: Any) -> None:
    """`stillhere-bench fuzz`."""
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
    results.add_option(parser, "fuzz")
    parser.add_argument("--timeout", type=float, default=3 * 3600.0, help="bound on the run, s")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start a server, run both properties for `--examples` each, stop it; the report."""
    # Hypothesis comes with the test extras: imported when a run starts, not with the CLI.
    from hypothesis import seed, settings

    from bench.fuzz_probe import Probe
    from bench.fuzz_properties import CI, PROPERTIES, each_failure, run_property

    root = Path(tempfile.mkdtemp(prefix="stillhere-fuzz-"))
    server = procs.start("stillhere", root, latency=0.0, rate=0.0, extra=SERVER_OPTIONS)
    report: dict[str, Any] = {"examples_asked": args.examples, "seed": args.seed}
    loop = asyncio.get_running_loop()
    try:
        await procs.wait_ready(server)
        assert server.pgdata is not None
        probe = Probe(server.base_url, dsn_of(server.pgdata), loop, MAX_FRAME_BYTES)
        await probe.open()
        profile = settings(settings.get_profile(CI), max_examples=args.examples, derandomize=False)
        started = time.perf_counter()
        failures: list[str] = []
        try:
            async with asyncio.timeout(args.timeout):
                for prop in PROPERTIES:
                    test = seed(args.seed)(prop(probe, profile))
                    try:
                        await asyncio.to_thread(run_property, test)
                    except Exception as failed:  # the shrunk example's, or a group of them
                        failures += [
                            f"{prop.__name__}: {one}"[:2000] for one in each_failure(failed)
                        ]
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
        report["server_log_problems"] = procs.log_problems(server.log_path)[:20]
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
        f"server log errors  {len(report['server_log_problems'])} (lines with ERROR, Traceback)",
        f"failures           {len(report['failures'])}",
    ]
    lines += [f"  {failure}" for failure in report["failures"]]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    """0 when every property held and the server logged no error, 1 if not, 2 when the run
    could not finish."""
    try:
        return await procs.finish("fuzz", measure(args), args, table, _exit_code)
    except ModuleNotFoundError as missing:
        print(f"bench fuzz needs {missing.name}: pip install -e '.[test]'", file=sys.stderr)
        return 2


def _exit_code(report: dict[str, Any]) -> int:
    broken = report["failures"] or report["server_log_problems"] or not report["server_alive"]
    return 1 if broken else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=DESCRIPTION)
    add_options(parser)
    return run_on_loop(run(parser.parse_args(argv)), "asyncio")


if __name__ == "__main__":
    sys.exit(main())
