"""What the browser tests share: a real `stillhere serve` process (rehearsal model, a
PostgreSQL database of its own) and Debian's chromium driven by Playwright.

Playwright's sync API: the pages are driven from plain (non-async) tests, so one server
and one browser serve a whole module. No browser is ever downloaded: Playwright launches
the system's `/usr/bin/chromium` (`.ci/run` installs the `chromium` package when it is
missing); without it the browser tests are skipped with the reason.

A module imports the fixtures it uses (`browser`, `tabs`, `server` or its own made with
`serving(postgres, folder, options)`, e.g. with `--admin-token`), opens pages with
`open_tab`, and every page it opened must end with no console error and no uncaught
exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    FloatRect,
    Locator,
    Page,
    sync_playwright,
)

from tests.conftest import INSTANT_OPTIONS, _with_database
from tests.test_restart import ROOT, START_TIMEOUT, STILLHERE, free_port

CHROMIUM = Path("/usr/bin/chromium")
# The rehearsal model paced at this many words a second: a story (about 130 words) streams
# for some 4 s, long enough to go offline or reload in the middle of it.
WORDS_PER_S = 30
STORY = "tell me a story about the lighthouse"
SECRET = "browser-tests-secret-of-at-least-32-bytes"  # signs the tests' account tokens


@dataclass
class Served:
    """`stillhere serve` in a subprocess, its log in a file."""

    base: str
    process: subprocess.Popen[bytes]
    log_path: Path
    dsn: str  # its database, for what a test does beside it (another node's notice)
    tls: ssl.SSLContext | None = None  # a client's, trusting its certificate: base is https

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """A plain HTTP request (as a phone would make it, no Origin): status and JSON."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers=headers or {}
        )
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.tls) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read() or b"null")


def serve(
    dsn: str,
    data_dir: Path,
    log_path: Path,
    options: list[str],
    tls: ssl.SSLContext | None = None,
) -> Served:
    """`stillhere serve`, ready; with `tls` (a client's context), over HTTPS."""
    port = free_port()
    argv = [str(STILLHERE), "serve", "--db", dsn, "--data-dir", str(data_dir), "--secret", SECRET]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*argv, "--port", str(port), *INSTANT_OPTIONS, *options],  # options win
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=ROOT,
        )
    scheme = "http" if tls is None else "https"
    served = Served(f"{scheme}://127.0.0.1:{port}", process, log_path, dsn, tls)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited early:\n{served.log()}")
        try:
            with urllib.request.urlopen(served.base + "/", timeout=1, context=tls):
                return served
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the server did not start in {START_TIMEOUT} s:\n{served.log()}")


def run_sql(dsn: str, statement: str) -> None:
    """One statement on a database, on a thread of its own: Playwright's sync API keeps an
    event loop running on the test's thread."""

    async def run() -> None:
        admin = await asyncpg.connect(dsn)
        try:
            await admin.execute(statement)
        finally:
            await admin.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, run()).result()


@contextlib.contextmanager
def serving(
    postgres: str, folder: Path, options: list[str], tls: ssl.SSLContext | None = None
) -> Iterator[Served]:
    """`stillhere serve OPTIONS` on a database of its own, for as long as the block lasts
    (a module's tests share it: each test is another person); `tls` as for `serve`."""
    name = "b_" + uuid.uuid4().hex[:12]
    run_sql(postgres, f"CREATE DATABASE {name}")
    try:
        served = serve(
            _with_database(postgres, name), folder / "data", folder / "serve.log", options, tls
        )
        try:
            yield served
        finally:
            served.process.terminate()
            try:
                served.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                served.process.kill()
                served.process.wait()
    finally:
        run_sql(postgres, f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def server(postgres: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The app's server: the rehearsal model paced, MiniLM alone (the pair's second model
    would only slow the start and each memory the tests make)."""
    options = ["--rehearsal-rate", str(WORDS_PER_S), "--embed-local", "minilm"]
    with serving(postgres, tmp_path_factory.mktemp("served"), options) as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM}: install Debian's chromium package (.ci/run does)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


class _Elsewhere(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><title>elsewhere</title><p>another site</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[str]:
    """Another web site: a page served from another port, which is another origin."""
    site = ThreadingHTTPServer(("127.0.0.1", 0), _Elsewhere)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{site.server_address[1]}/"
    site.shutdown()
    site.server_close()


@dataclass
class Tab:
    """A browser context (its own localStorage: one person) and its page, with every console
    error and uncaught exception the page produced."""

    context: BrowserContext
    page: Page
    errors: list[str] = field(default_factory=list)
    cut: re.Pattern[str] | None = None  # URLs the test itself cuts: their failures are expected

    def watch(self, page: Page) -> None:
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))

    def _console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        where = message.location.get("url", "")
        failed = message.text.startswith("Failed to load resource: net::ERR_FAILED")
        if failed and self.cut is not None and self.cut.search(where):
            return  # the browser reporting a request the test aborted on purpose
        self.errors.append(f"console: {message.text} at {where}")


@pytest.fixture
def tabs(browser: Browser) -> Iterator[list[Tab]]:
    """Pages the test opens (`open_tab`); at the end, none may have logged an error."""
    opened: list[Tab] = []
    yield opened
    errors = [error for tab in opened for error in tab.errors]
    for tab in opened:
        tab.context.close()
    assert errors == [], errors


def box(locator: Locator) -> FloatRect:
    """Where the element is on the page, in CSS pixels; it must be shown."""
    found = locator.bounding_box()
    assert found is not None, f"{locator} is not shown"
    return found


def open_tab(
    browser: Browser, tabs: list[Tab], url: str, width: int = 1280, height: int = 800
) -> Tab:
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    tab = Tab(context, page)
    tab.watch(page)
    tabs.append(tab)
    if url:
        page.goto(url)
    return tab
