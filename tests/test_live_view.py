"""The live view (`GET /` on the admin listener) in a real Chromium, against a real server.

Playwright drives Debian's `chromium` (never a downloaded browser) against `stillhere serve`
in a subprocess, with the rehearsal model and the session's PostgreSQL; the phones are real
WebSockets opened from the test. Every page is watched for console errors and uncaught
exceptions. The screenshots in docs/ are taken here.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright, expect

from tests.test_restart import ROOT, ServerProcess, free_port, hello

CHROMIUM = "/usr/bin/chromium"
TOKEN = "live-view-token-" + uuid.uuid4().hex
WAIT_MS = 15_000  # for the page to show a change: the view reads again every 1 to 2 s

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason="the chromium package is not installed"
)


@dataclass
class Watched:
    """A page and every console error and uncaught exception it had."""

    page: Page
    errors: list[str] = field(default_factory=list)

    def console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield browser
        finally:
            await browser.close()


async def watched_page(browser: Browser, width: int = 1280) -> Watched:
    page = await browser.new_page(viewport={"width": width, "height": 900})
    watched = Watched(page)
    page.on("console", watched.console)
    page.on("pageerror", lambda error: watched.errors.append(f"pageerror: {error}"))
    page.set_default_timeout(WAIT_MS)
    return watched


class AdminServer(ServerProcess):
    """`stillhere serve` with its admin listener (and so the live view) on."""

    def __init__(self, dsn: str, tmp_path: Path) -> None:
        super().__init__(dsn, tmp_path / "data", tmp_path / "server.log")
        self.admin_port = free_port()

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    async def start(self, http: aiohttp.ClientSession, extra: Any = ()) -> None:
        await super().start(
            http, ["--admin-token", TOKEN, "--admin-port", str(self.admin_port), *extra]
        )

    async def api(self, http: aiohttp.ClientSession, path: str) -> Any:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with http.get(self.admin + path, headers=headers) as response:
            assert response.status == 200, await response.text()
            return await response.json()


@pytest.fixture
async def server(dsn: str, tmp_path: Path) -> AsyncIterator[tuple[AdminServer, Any]]:
    async with aiohttp.ClientSession() as http:
        process = AdminServer(dsn, tmp_path)
        try:
            await process.start(http)
            yield process, http
        finally:
            await process.kill()
        assert TOKEN not in process.log()


async def sign_in(page: Page, token: str) -> None:
    await page.get_by_label("Admin token").fill(token)
    await page.get_by_role("button", name="Open the live view").click()


@pytest.mark.timeout(180)
async def test_the_live_view_shows_an_actor_and_follows_it(
    server: tuple[AdminServer, aiohttp.ClientSession], browser: Browser
) -> None:
    process, http = server
    phone, _ = await hello(http, process, device="device-" + uuid.uuid4().hex)
    _, first = await phone.say("Hello there, how are you today?")
    (row,) = (await process.api(http, "/admin/actors"))["actors"]
    person = row["person"]
    watched = await watched_page(browser)
    page = watched.page

    await page.goto(process.admin + "/")
    await sign_in(page, TOKEN)
    table = page.get_by_role("table", name="Live actors, one row each")
    actor_row = table.get_by_role("row").filter(
        has=page.get_by_role("button", name=person[:12], exact=True)
    )
    await expect(actor_row).to_have_count(1)
    cells = actor_row.get_by_role("cell")
    await expect(cells.nth(1)).to_have_text(row["conversation"][:8])
    await expect(cells.nth(2)).to_have_text("idle")
    await expect(cells.nth(5)).to_have_text("1")  # one link
    await expect(cells.nth(7)).to_have_text("2")  # the say and its reply
    await expect(page.get_by_text("1 live actor: 1 idle")).to_be_visible()
    await expect(page.get_by_role("figure", name="Live actors: 1")).to_be_visible()

    await actor_row.get_by_role("button", name=person[:12]).click()
    detail = page.get_by_role("region", name=f"Actor {person[:12]}")
    await expect(detail).to_contain_text("Hello there, how are you today?")
    (trace,) = (await process.api(http, f"/admin/actors/{person}/turns"))["turns"]
    assert trace["reply"] == first["reply"]
    traces = detail.get_by_role("list", name="Last turns' context")
    await expect(traces).to_contain_text(f"reply {first['reply'][:8]}")
    await expect(traces).to_contain_text(f"context {trace['context_chars']} chars")
    stream = (await process.api(http, f"/admin/actors/{person}"))["stream"]
    await expect(detail).to_contain_text(f"seq {stream['last_seq']}, ")

    # Live: another say shows in the detail, its trace first, without touching the page.
    _, second = await phone.say("Tell me something about Thursdays.")
    await expect(detail).to_contain_text("Tell me something about Thursdays.")
    await expect(traces.get_by_role("listitem").first).to_contain_text(
        f"reply {second['reply'][:8]}"
    )
    await expect(cells.nth(7)).to_have_text("4")
    await expect(page.get_by_role("figure", name="Turns per second")).to_be_visible()

    await page.screenshot(path=ROOT / "docs" / "live-view-1280.png", full_page=True)
    await page.set_viewport_size({"width": 360, "height": 800})
    await page.screenshot(path=ROOT / "docs" / "live-view-360.png", full_page=True)
    await page.set_viewport_size({"width": 1280, "height": 900})

    # Filter: the person's key matches, another does not.
    await page.get_by_label("Filter by person or conversation").fill(person[3:14])
    await expect(actor_row).to_have_count(1)
    await page.get_by_label("Filter by person or conversation").fill("no-such-actor")
    await expect(table).to_contain_text("No actor matches the filter")
    await page.get_by_label("Filter by person or conversation").fill("")
    await page.get_by_label("State").select_option("replying")
    await expect(table).to_contain_text("No actor matches the filter")
    await page.get_by_label("State").select_option("")
    await expect(actor_row).to_have_count(1)

    await expect(page.get_by_role("region", name="Supervisor sweeps")).to_contain_text(
        "failed actors replaced since start"
    )

    # The token is kept for the tab: a reload goes straight back to the view.
    await page.reload()
    await expect(actor_row).to_have_count(1)
    await expect(page.get_by_label("Admin token")).to_be_hidden()
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_label("Admin token")).to_be_visible()
    assert await page.evaluate("sessionStorage.length") == 0
    await phone.ws.close()
    assert watched.errors == []


async def test_a_wrong_token_is_told_and_not_kept(
    server: tuple[AdminServer, aiohttp.ClientSession], browser: Browser
) -> None:
    process, _ = server
    watched = await watched_page(browser, width=360)
    page = watched.page
    await page.goto(process.admin + "/")
    await expect(page.get_by_role("status")).to_have_text("Not signed in")
    await sign_in(page, "not-the-token")
    await expect(page.get_by_role("alert").first).to_have_text(
        "The admin API refused this token: check the --admin-token the server was started with."
    )
    await expect(page.get_by_role("table", name="Live actors, one row each")).to_be_hidden()
    assert await page.evaluate("sessionStorage.length") == 0
    # The one error is the browser's own note of the refused request, nothing else.
    (refused,) = watched.errors
    assert "401" in refused, refused
