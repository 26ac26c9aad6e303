"""Live view benchmark: the admin page's load and update time in Chromium, at N live actors
against a baseline of B in the same run.

Starts a real `stillhere serve` with its admin listener (embedded PostgreSQL in a temporary
data dir, rehearsal model), opens B phones over WebSocket that say hello and stay connected,
measures, then opens more phones up to N and measures again on the same server and page:

- **load**: from `reload()` of the signed-in page to its table showing rows;
- **update**: from a new phone's welcome to the page's count of live actors including it;
  each phone comes at a random moment of the page's 2 s tick, so this is mostly that wait
  (1 s on average): the figure to watch is its ratio to the baseline's;
- **list fetch**: the browser's own timing (Resource Timing) of the table's page of
  `/admin/actors`, the part that grows with the number of actors.

Chromium is Debian's (`/usr/bin/chromium`, or `--chromium`), driven by Playwright. Run:

    .venv/bin/python -m bench.live_view --actors 5000 --json bench/out/live_view.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from playwright.async_api import Page, async_playwright

from bench import results
from bench.live import (
    Phone,
    Talk,
    close_all,
    hello,
    new_device,
    open_link,
    percentiles,
    ramp,
    report_main,
    served,
)
from bench.procs import Server, free_port, wait_ready

DESCRIPTION = "the live view's load and update time in Chromium, at N actors against B"
WAIT_MS = 60_000
LIST_TICK_S = 2.0  # the page reads the list again every 2 s (actors.js, live.js)
ROW = "#actors-body tr[data-person]"
LIST_TIMINGS = """() => performance.getEntriesByType("resource")
    .filter((e) => e.name.includes("/admin/actors?"))
    .map((e) => e.duration)"""
SAID_HELLO = Talk(turns=1)  # each phone of the crowd says "hello" and has its reply
TALLY_REACHES = """(n) => {
    const text = document.getElementById("tally").textContent;
    return parseInt(text, 10) >= n;
}"""


class Viewer:
    """The live view signed in, in one Chromium page."""

    def __init__(self, page: Page, admin: str) -> None:
        self.page = page
        self.admin = admin

    async def sign_in(self, token: str) -> None:
        await self.page.goto(self.admin + "/")
        await self.page.get_by_label("Admin token").fill(token)
        await self.page.get_by_role("button", name="Open the live view").click()
        await self.page.wait_for_selector(ROW, timeout=WAIT_MS)

    async def load_ms(self) -> float:
        """Milliseconds from a reload to the table showing rows (the token is kept)."""
        started = time.perf_counter()
        await self.page.reload()
        await self.page.wait_for_selector(ROW, timeout=WAIT_MS)
        return (time.perf_counter() - started) * 1000.0

    async def list_fetches_ms(self) -> list[float]:
        """The list's fetches since the last call, as the browser timed them."""
        timings: list[float] = await self.page.evaluate(LIST_TIMINGS)
        await self.page.evaluate("performance.clearResourceTimings()")
        return timings

    async def shows(self, live: int) -> None:
        await self.page.wait_for_function(TALLY_REACHES, arg=live, timeout=WAIT_MS)


async def measure_size(
    viewer: Viewer, http: aiohttp.ClientSession, url: str, live: int, runs: int
) -> tuple[dict[str, Any], list[Phone]]:
    phase = random.Random(live)
    """`runs` loads, then `runs` updates (a new phone each), at `live` actors."""
    loads, updates, fetches, added = [], [], [], []
    await viewer.list_fetches_ms()
    for _ in range(runs):
        loads.append(await viewer.load_ms())
    for _ in range(runs):
        await asyncio.sleep(phase.uniform(0.0, LIST_TICK_S))  # any moment of the page's tick
        link = await open_link(http, url)
        _, welcome = await hello(link, new_device())
        welcomed = time.perf_counter()
        added.append(Phone("", link, welcome["conversation"], 0))
        await viewer.shows(live + len(added))
        updates.append((time.perf_counter() - welcomed) * 1000.0)
    fetches = await viewer.list_fetches_ms()
    figures = {
        "actors": live,
        "runs": runs,
        "load_ms": percentiles(loads),
        "update_ms": percentiles(updates),
        "list_fetch_ms": percentiles(fetches),
        "list_fetches": len(fetches),
    }
    return figures, added


async def measure(server: Server, admin: str, token: str, args: argparse.Namespace) -> Any:
    connector = aiohttp.TCPConnector(limit=args.actors + 2 * args.runs + 100, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector) as http, async_playwright() as pw:
        ready_s = await wait_ready(server)
        url = server.base_url + "/v1/ws"
        browser = await pw.chromium.launch(executable_path=args.chromium)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            viewer = Viewer(page, admin)
            phones, ramp_errors = await ramp(http, url, args.baseline, args.concurrency, SAID_HELLO)
            await viewer.sign_in(token)
            sizes: list[dict[str, Any]] = []
            for target in (args.baseline, args.actors):
                more, failed = await ramp(
                    http, url, target - len(phones), args.concurrency, SAID_HELLO
                )
                phones += more
                ramp_errors += failed
                figures, added = await measure_size(viewer, http, url, len(phones), args.runs)
                phones += added
                sizes.append(figures)
            rss_mb = server.rss_mb()
        finally:
            await browser.close()
        await close_all(phones, args.concurrency)
    return {
        "ready_s": round(ready_s, 2),
        "sizes": sizes,
        "ramp_errors": dict(ramp_errors),
        "page_errors": errors,
        "server_rss_mb": round(rss_mb, 1),
    }


def ratios(sizes: Sequence[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each figure at N over the same at the baseline, for p50 and p99."""
    base, top = sizes[0], sizes[-1]
    out: dict[str, dict[str, float | None]] = {}
    for figure in ("load_ms", "update_ms", "list_fetch_ms"):
        out[figure] = {
            p: round(top[figure][p] / base[figure][p], 2) if base[figure][p] else None
            for p in ("p50", "p99")
        }
    return out


def table(report: dict[str, Any]) -> str:
    lines = [
        f"stillhere live view bench: {report['actors']} actors against {report['baseline']}, "
        f"{report['runs']} runs each, {report['machine']['cpu_count']} CPUs",
        f"  {'ms':<22}{'actors':>8}{'p50':>10}{'p95':>10}{'p99':>10}",
    ]
    for size in report["sizes"]:
        for figure in ("load_ms", "update_ms", "list_fetch_ms"):
            p = size[figure]
            cells = "".join(f"{p[k]:10.1f}" if p[k] is not None else f"{'-':>10}" for k in p)
            lines.append(f"  {figure:<22}{size['actors']:>8}{cells}")
    for figure, r in report["ratios"].items():
        lines.append(f"  {figure + ' ratio':<22}{'':>8}{r['p50']!s:>10}{'':>10}{r['p99']!s:>10}")
    return "\n".join(lines)


def problems(report: dict[str, Any]) -> list[str]:
    found = [f"ramp: {k} (x{v})" for k, v in report["ramp_errors"].items()]
    found += [f"page error: {e}" for e in report["page_errors"]]
    stop = report["server_stop"]
    if stop.get("killed") or stop.get("exit_code") not in (0, None):
        found.append(f"server stop: {stop}")
    if report["server_log_problems"]:
        found.append(f"{report['server_log_problems']} problem lines in the server log")
    return found


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.live_view", description=DESCRIPTION)
    parser.add_argument("--actors", type=int, default=5000, help="live actors measured (N)")
    parser.add_argument("--baseline", type=int, default=50, help="live actors of the baseline")
    parser.add_argument("--runs", type=int, default=10, help="loads and updates at each size")
    parser.add_argument("--concurrency", type=int, default=50, help="phones connecting at once")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the browser to drive")
    parser.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole run (s)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "live_view")
    args = parser.parse_args(argv)
    if not 1 <= args.baseline < args.actors or args.runs < 1 or args.concurrency < 1:
        parser.error("need 1 <= --baseline < --actors, and --runs, --concurrency at least 1")
    if shutil.which(args.chromium) is None:
        parser.error(f"no browser at {args.chromium} (apt-get install chromium)")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure on a server of its own, its admin listener on, started and stopped around
    the run."""
    token, admin_port = secrets.token_hex(16), free_port()
    extra = ["--admin-token", token, "--admin-port", str(admin_port)]
    admin = f"http://127.0.0.1:{admin_port}"
    measured = served(lambda server: measure(server, admin, token, args), args.timeout, extra)
    return {
        "actors": args.actors,
        "baseline": args.baseline,
        "runs": args.runs,
        **measured,
        "ratios": ratios(measured["sizes"]),
        "machine": {
            "cpu_count": os.cpu_count(),
            "memory_mb": round(psutil.virtual_memory().total / (1024 * 1024)),
            "python": sys.version.split()[0],
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    return report_main(parse_args(argv), run, table, problems)


if __name__ == "__main__":
    sys.exit(main())
