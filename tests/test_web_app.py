"""The app in a real browser (Debian's chromium, Playwright): a person's conversation and
memories through `GET /`, against a real server process with the rehearsal model."""

from __future__ import annotations

from playwright.sync_api import Browser, expect

from tests.browser_support import Served, Tab, browser, open_tab, server, tabs

__all__ = ["browser", "server", "tabs"]


def test_smoke(browser: Browser, server: Served, tabs: list[Tab]) -> None:
    tab = open_tab(browser, tabs, server.base + "/")
    page = tab.page
    expect(page.get_by_role("status")).to_have_text("Connected")
    page.get_by_role("textbox", name="Message").fill("hello there")
    page.get_by_role("button", name="Send").click()
    log = page.get_by_role("log", name="Conversation")
    expect(log.locator(".assistant")).to_have_count(1)
    expect(log.locator(".assistant .text")).to_contain_text("hello there")
    page.screenshot(path="/tmp/webapp-smoke.png")
