"""The live view (`GET /` on the admin listener) in a real Chromium, against a real server.

Playwright drives Debian's `chromium` (never a downloaded browser) against `stillhere serve`
in a subprocess, with the rehearsal model and the session's PostgreSQL, through the browser
tests' shared fixtures (tests/browser_support.py); the phone is the person's web app, in a
tab of its own. Every page is watched for console errors and uncaught exceptions. The
screenshots in docs/ are taken here.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, FloatRect, Locator, Page, expect

from tests.browser_support import Served, Tab, box, browser, open_tab, serving, tabs
from tests.test_restart import ROOT, free_port
from tests.test_web_app import turn

__all__ = ["browser", "tabs"]  # the fixtures

TOKEN = "live-view-token-" + uuid.uuid4().hex
WAIT_MS = 15_000  # for the page to show a change: the view reads again every 1 to 2 s


@dataclasses.dataclass
class Live:
    """The server, as a phone reaches it (`served`), and its admin listener (`admin`)."""

    served: Served
    admin: Served

    def api(self, path: str) -> Any:
        status, answer = self.admin.call("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, answer
        return answer


@pytest.fixture(scope="module")
def live(postgres: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """`stillhere serve` with its admin listener, and so the live view, on."""
    port = free_port()
    options = ["--admin-token", TOKEN, "--admin-port", str(port)]
    with serving(postgres, tmp_path_factory.mktemp("live"), options) as served:
        yield Live(served, dataclasses.replace(served, base=f"http://127.0.0.1:{port}"))
        assert TOKEN not in served.log()


def view(browser: Browser, tabs: list[Tab], live: Live, width: int = 1280) -> Page:
    page = open_tab(browser, tabs, "", width=width, height=900).page
    page.set_default_timeout(WAIT_MS)
    page.goto(live.admin.base + "/")
    return page


def right(rect: FloatRect) -> float:
    return rect["x"] + rect["width"]


def whole_table_shown(page: Page, row: Locator) -> None:
    """Every column and its header, whole, inside the table's panel: nothing cut at the
    right, nothing to scroll sideways for."""
    panel = box(page.get_by_role("region", name="Live actors", exact=True))
    table = page.get_by_role("table", name="Live actors, one row each")
    last = table.get_by_role("columnheader").last
    expect(last).to_have_text("Last activity")
    for cell in (last, row.get_by_role("cell").last):
        assert right(box(cell)) <= right(panel), (box(cell), panel)
    assert table.evaluate("t => t.parentElement.scrollWidth <= t.parentElement.clientWidth")


def labels_beside_their_fields(page: Page) -> None:
    """Each of the table's filters: its label on the line of its field, just before it."""
    for name in ("State", "Filter by person or conversation"):
        label = box(page.locator("label", has_text=name))
        field = box(page.get_by_label(name))
        middle = label["y"] + label["height"] / 2
        same_line = field["y"] <= middle <= field["y"] + field["height"]
        below = field["y"] >= label["y"] + label["height"] and field["x"] <= label["x"] + 1
        if name == "State":  # a short pair: always side by side
            assert same_line and 0 <= field["x"] - right(label) <= 16, (name, label, field)
        else:  # a long label may have its field on the line below, under it
            assert (same_line and field["x"] >= right(label)) or below, (name, label, field)


def sign_in(page: Page, token: str) -> None:
    page.get_by_label("Admin token").fill(token)
    page.get_by_role("button", name="Open the live view").click()


@pytest.mark.timeout(180)
def test_the_live_view_shows_an_actor_and_follows_it(
    browser: Browser, live: Live, tabs: list[Tab]
) -> None:
    phone = open_tab(browser, tabs, live.served.base + "/").page
    turn(phone, "Hello there, how are you today?", "You said")
    (row,) = live.api("/admin/actors")["actors"]
    person = row["person"]
    page = view(browser, tabs, live)
    sign_in(page, TOKEN)
    table = page.get_by_role("table", name="Live actors, one row each")
    actor_row = table.get_by_role("row").filter(
        has=page.get_by_role("button", name=person[:12], exact=True)
    )
    expect(actor_row).to_have_count(1)
    cells = actor_row.get_by_role("cell")
    expect(cells.nth(1)).to_have_text(row["conversation"][:8])
    expect(cells.nth(2)).to_have_text("idle")
    expect(cells.nth(5)).to_have_text("1")  # one link
    expect(cells.nth(7)).to_have_text("2")  # the say and its reply
    expect(page.get_by_text("1 live actor: 1 idle")).to_be_visible()
    expect(page.get_by_role("figure", name="Live actors: 1")).to_be_visible()

    actor_row.get_by_role("button", name=person[:12]).click()
    detail = page.get_by_role("region", name=f"Actor {person[:12]}")
    expect(detail).to_contain_text("Hello there, how are you today?")
    (first,) = live.api(f"/admin/actors/{person}/turns")["turns"]
    traces = detail.get_by_role("list", name="Last turns' context")
    expect(traces).to_contain_text(f"reply {first['reply'][:8]}")
    expect(traces).to_contain_text(f"context {first['context_chars']} chars")
    stream = live.api(f"/admin/actors/{person}")["stream"]
    expect(detail).to_contain_text(f"seq {stream['last_seq']}, ")

    # Live: another say shows in the detail, its trace first, without touching the page.
    turn(phone, "Tell me something about Thursdays.", "Thursdays")
    expect(detail).to_contain_text("Tell me something about Thursdays.")
    (second,) = [t for t in live.api(f"/admin/actors/{person}/turns")["turns"] if t != first]
    expect(traces.get_by_role("listitem").first).to_contain_text(f"reply {second['reply'][:8]}")
    expect(cells.nth(7)).to_have_text("4")
    expect(page.get_by_role("figure", name="Turns per second")).to_be_visible()

    whole_table_shown(page, actor_row)
    page.screenshot(path=ROOT / "docs" / "live-view-1280.png", full_page=True)
    page.set_viewport_size({"width": 360, "height": 800})
    page.screenshot(path=ROOT / "docs" / "live-view-360.png", full_page=True)
    for width in (390, 360):
        page.set_viewport_size({"width": width, "height": 800})
        labels_beside_their_fields(page)
    page.set_viewport_size({"width": 1280, "height": 900})

    # Filter: the person's key matches, another does not.
    page.get_by_label("Filter by person or conversation").fill(person[3:14])
    expect(actor_row).to_have_count(1)
    page.get_by_label("Filter by person or conversation").fill("no-such-actor")
    expect(table).to_contain_text("No actor matches the filter")
    page.get_by_label("Filter by person or conversation").fill("")
    page.get_by_label("State").select_option("replying")
    expect(table).to_contain_text("No actor matches the filter")
    page.get_by_label("State").select_option("")
    expect(actor_row).to_have_count(1)

    expect(page.get_by_role("region", name="Supervisor sweeps")).to_contain_text(
        "failed actors replaced since start"
    )

    # The token is kept for the tab: a reload goes straight back to the view.
    page.reload()
    expect(actor_row).to_have_count(1)
    expect(page.get_by_label("Admin token")).to_be_hidden()
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("Admin token")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0


def test_a_wrong_token_is_told_and_not_kept(browser: Browser, live: Live, tabs: list[Tab]) -> None:
    page = view(browser, tabs, live, width=360)
    expect(page.get_by_role("status")).to_have_text("Not signed in")
    sign_in(page, "not-the-token")
    expect(page.get_by_role("alert").first).to_have_text(
        "The admin API refused this token: check the --admin-token the server was started with."
    )
    expect(page.get_by_role("table", name="Live actors, one row each")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    # The one error is the browser's own note of the refused request, nothing else.
    (tab,) = tabs
    (refused,) = tab.errors
    assert "401" in refused, refused
    tab.errors.clear()  # expected: not one for the fixture's check
