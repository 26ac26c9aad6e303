"""The app in a real browser (Debian's chromium through Playwright), against a real server
process with the rehearsal model and PostgreSQL: the person's stories, told through the
page, selected by role and accessible name as a person (or a screen reader) finds them."""

from __future__ import annotations

import json
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from playwright.sync_api import (
    Browser,
    FloatRect,
    Locator,
    Page,
    Request,
    WebSocketRoute,
    expect,
)

from tests.browser_support import (
    SECRET,
    STORY,
    Served,
    Tab,
    box,
    browser,
    elsewhere,
    open_tab,
    run_sql,
    server,
    tabs,
)
from tests.test_reply_matching import BOOK, WEEKEND
from tests.test_restart import ROOT
from transport.identity import Identity

__all__ = ["browser", "elsewhere", "server", "tabs"]  # the fixtures

LAST_SENTENCE = "Sentence 12 of the story about the lighthouse"
FIRST_SENTENCE = "Sentence 1 of the story about the lighthouse"
DOCS = ROOT / "docs"


def log_of(page: Page) -> Locator:
    return page.get_by_role("log", name="Conversation")


def send(page: Page, text: str) -> None:
    """Type and press Enter, as a person at a keyboard does."""
    box = page.get_by_role("textbox", name="Message")
    box.fill(text)
    box.press("Enter")


def said(page: Page, text: str) -> Locator:
    exactly = page.locator(".text", has_text=re.compile(f"^{re.escape(text)}$"))
    return log_of(page).locator(".person").filter(has=exactly)


def replies(page: Page) -> Locator:
    return log_of(page).locator(".assistant")


def turn(page: Page, text: str, reply: str) -> None:
    """Say `text`, wait for the reply that contains `reply` to finish."""
    before = replies(page).count()
    send(page, text)
    expect(replies(page)).to_have_count(before + 1)
    expect(replies(page).last).to_contain_text(reply)
    expect(page.get_by_role("button", name="Stop")).to_be_hidden()


def record_states(page: Page) -> None:
    """Keep every state the dot takes from now on, however briefly, in `window.dotStates`."""
    page.evaluate(
        """() => {
            const dot = document.getElementById("status");
            window.dotStates = [dot.dataset.state];
            new MutationObserver(() => window.dotStates.push(dot.dataset.state))
                .observe(dot, {attributes: true, attributeFilter: ["data-state"]});
        }"""
    )


def states(page: Page) -> list[str]:
    seen: list[str] = page.evaluate("window.dotStates")
    return [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s]


def stored(page: Page, name: str) -> object:
    return json.loads(page.evaluate(f"localStorage.getItem('stillhere.{name}')") or "null")


def test_the_tunnel_story(browser: Browser, server: Served, tabs: list[Tab]) -> None:
    """Offline mid-reply: the dot goes red, then amber as the browser comes back; "two",
    typed in the tunnel, is answered in the same conversation; the reply completes once."""
    tab = open_tab(browser, tabs, server.base + "/")
    page = tab.page
    status = page.get_by_role("status")
    expect(status).to_have_text("Connected")
    send(page, STORY)
    story = replies(page).first
    expect(story).to_contain_text(FIRST_SENTENCE)
    conversation = stored(page, "conversation")
    record_states(page)

    tab.context.set_offline(True)
    expect(status).to_have_text("Offline")
    assert LAST_SENTENCE not in story.inner_text()  # cut mid-reply
    send(page, "two")
    expect(said(page, "two")).to_contain_text("Not sent yet")

    tab.context.set_offline(False)
    expect(status).to_have_text("Connected")
    assert states(page)[-3:] == ["down", "connecting", "up"]
    expect(story).to_contain_text(LAST_SENTENCE)
    expect(replies(page)).to_have_count(2)
    expect(replies(page).last).to_contain_text('You said "two"')
    assert story.inner_text().count(FIRST_SENTENCE) == 1
    assert log_of(page).inner_text().count(FIRST_SENTENCE) == 1
    expect(said(page, "two")).to_have_count(1)
    assert stored(page, "conversation") == conversation
    assert stored(page, "outbox") == []


def test_a_reload_mid_reply_brings_the_conversation_back_whole(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    page = open_tab(browser, tabs, server.base + "/").page
    turn(page, "hello before the story", 'You said "hello before the story"')
    send(page, STORY)
    expect(replies(page).last).to_contain_text(FIRST_SENTENCE)
    assert LAST_SENTENCE not in replies(page).last.inner_text()

    page.reload()
    expect(page.get_by_role("status")).to_have_text("Connected")
    expect(replies(page)).to_have_count(2)
    expect(replies(page).last).to_contain_text(LAST_SENTENCE)
    text = log_of(page).inner_text()
    assert text.count(FIRST_SENTENCE) == 1 and text.count(LAST_SENTENCE) == 1
    expect(said(page, STORY)).to_have_count(1)
    expect(said(page, "hello before the story")).to_have_count(1)


class OutOfReach:
    """The server out of the page's reach, and back: its WebSockets closed as they open,
    its HTTP requests failed (`Tab.cut` tells the console check these failures are ours)."""

    def __init__(self, tab: Tab) -> None:
        self.page = tab.page
        self.on = False
        self.sockets: list[WebSocketRoute] = []
        tab.cut = re.compile(r"/v1/")
        tab.page.route_web_socket(re.compile(r"/v1/ws(\?.*)?$"), self._websocket)
        tab.page.route(tab.cut, lambda route: route.abort() if self.on else route.fallback())

    def _websocket(self, route: WebSocketRoute) -> None:
        if self.on:
            route.close()
        else:
            route.connect_to_server()
            self.sockets.append(route)

    def cut(self) -> None:
        self.on = True
        for socket in self.sockets:
            socket.close()

    def mend(self) -> None:
        self.on = False

    @classmethod
    def connected(cls, browser: Browser, tabs: list[Tab], server: Served) -> OutOfReach:
        """A page of the app, connected (through the routes that can cut it off)."""
        reach = cls(open_tab(browser, tabs, ""))
        reach.page.goto(server.base + "/")
        expect(reach.page.get_by_role("status")).to_have_text("Connected")
        return reach


def test_the_outbox_survives_a_reload_while_the_server_is_out_of_reach(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    reach = OutOfReach.connected(browser, tabs, server)
    page = reach.page
    status = page.get_by_role("status")

    reach.cut()
    expect(status).to_contain_text("Reconnecting in")
    send(page, "kept while out of reach")
    expect(said(page, "kept while out of reach")).to_contain_text("Not sent yet")
    page.reload()
    expect(said(page, "kept while out of reach")).to_contain_text("Not sent yet")
    expect(status).not_to_have_text("Connected")

    reach.mend()
    expect(status).to_have_text("Connected", timeout=20_000)
    expect(said(page, "kept while out of reach")).to_contain_text("Sent")
    expect(replies(page).last).to_contain_text('You said "kept while out of reach"')
    expect(said(page, "kept while out of reach")).to_have_count(1)
    assert stored(page, "outbox") == []


def test_the_tab_shown_again_reconnects_at_once(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    """Not at the end of the backoff's wait: the countdown had seconds left when it went."""
    reach = OutOfReach.connected(browser, tabs, server)
    page = reach.page
    status = page.get_by_role("status")
    reach.cut()
    expect(status).to_have_text(re.compile(r"Reconnecting in ([4-9]|1[0-9]) s"), timeout=15_000)
    page.evaluate(
        """() => {
            const words = document.getElementById("status-text");
            window.dotWords = [words.textContent];
            new MutationObserver(() => window.dotWords.push(words.textContent))
                .observe(words, {childList: true, characterData: true, subtree: true});
        }"""
    )
    reach.mend()
    page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
    expect(status).to_have_text("Connected")
    seen: list[str] = page.evaluate("window.dotWords")
    before = seen[seen.index("Connecting…") - 1]
    left = int(re.findall(r"\d+", before)[0])
    assert left >= 2, seen


def test_the_event_stream_carries_the_talk_when_websocket_cannot(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    tab = open_tab(browser, tabs, "")
    page = tab.page
    page.route_web_socket(re.compile(r"/v1/ws(\?.*)?$"), lambda route: route.close())
    streams: list[str] = []
    page.on("request", lambda r: streams.append(r.url) if "/v1/events" in r.url else None)
    page.goto(server.base + "/")
    expect(page.get_by_role("status")).to_have_text("Connected")
    turn(page, "over the event stream", 'You said "over the event stream"')
    assert streams, "the page never opened the event stream"


def test_stop_cuts_the_reply_and_marks_it_for_good(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    """The mark is the stored reply's: a reload (the welcome's history) shows it again."""
    page = open_tab(browser, tabs, server.base + "/").page
    send(page, STORY)
    expect(replies(page).last).to_contain_text(FIRST_SENTENCE)
    page.get_by_role("button", name="Stop").click()
    expect(replies(page).last).to_contain_text("Stopped")
    assert LAST_SENTENCE not in replies(page).last.inner_text()
    expect(page.get_by_role("button", name="Stop")).to_be_hidden()
    cut = replies(page).last.locator(".text").inner_text()

    page.reload()
    expect(page.get_by_role("status")).to_have_text("Connected")
    expect(replies(page)).to_have_count(1)
    expect(replies(page).last.locator(".text")).to_have_text(cut)
    expect(replies(page).last).to_contain_text("Stopped")


def bottom(rect: FloatRect) -> float:
    return rect["y"] + rect["height"]


def test_the_offline_say_shows_its_line_above_the_message_box(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    """At a laptop's 1280 by 800, with the conversation longer than the screen."""
    tab = open_tab(browser, tabs, server.base + "/", width=1280, height=800)
    page = tab.page
    for n in range(1, 8):
        turn(page, f"line {n} of a conversation longer than the screen", f"line {n} of")
    tab.context.set_offline(True)
    expect(page.get_by_role("status")).to_have_text("Offline")
    send(page, "typed in the tunnel")
    pending = said(page, "typed in the tunnel").get_by_text("Not sent yet")
    expect(pending).to_be_visible()
    line, log = box(pending), box(log_of(page))
    assert bottom(line) <= bottom(log), (line, log)
    assert bottom(line) <= box(page.get_by_role("textbox", name="Message"))["y"]
    tab.context.set_offline(False)
    expect(said(page, "typed in the tunnel")).to_contain_text("Sent")


def test_cards_sit_beside_their_reply_whatever_the_saved_state(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    """A browser whose saved state is older than its cards (it last kept the state before
    the card came) reloads: the card is beside the reply it came with, not at the end, and
    the next reply comes after the last say, as ever."""
    page = open_tab(browser, tabs, server.base + "/").page
    turn(page, "hello before the card", 'You said "hello before the card"')
    older = page.evaluate("JSON.stringify(localStorage)")
    turn(page, "Note that the spare key is under the blue pot", "Noted: the spare key")
    turn(page, "and after the card", 'You said "and after the card"')
    card_beside_its_reply(page)
    page.evaluate(
        """(older) => {
            for (const [name, value] of Object.entries(JSON.parse(older)))
                localStorage.setItem(name, value);
        }""",
        older,
    )
    page.reload()
    expect(page.get_by_role("status")).to_have_text("Connected")
    expect(replies(page)).to_have_count(3)
    card_beside_its_reply(page)
    turn(page, "one more after the reload", 'You said "one more after the reload"')
    card_beside_its_reply(page)
    chip = box(log_of(page).get_by_role("group", name="Shown with this reply"))
    last = box(replies(page).last)
    assert last["y"] > box(said(page, "one more after the reload"))["y"] > chip["y"]

    # Another browser of the same person, with no saved chips at all: the same place.
    other = open_tab(browser, tabs, "").page
    device = json.dumps(json.dumps(stored(page, "device")))
    other.add_init_script(f"localStorage.setItem('stillhere.device', {device})")
    other.goto(server.base + "/")
    expect(other.get_by_role("status")).to_have_text("Connected")
    card_beside_its_reply(other)


def card_beside_its_reply(page: Page) -> None:
    """The one card's row is below the reply that made it and above the next say."""
    chip = log_of(page).get_by_role("group", name="Shown with this reply")
    expect(chip).to_have_count(1)
    expect(chip).to_contain_text("Remembered the spare key is under the blue pot")
    noted = replies(page).filter(has_text=re.compile("^Noted: the spare key"))
    after = said(page, "and after the card")
    assert bottom(box(noted)) <= box(chip)["y"] < box(after)["y"]


def test_the_weekend_story_shows_what_a_say_replies_to(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    """Also the screenshots of the app, at a phone's width and a laptop's."""
    page = open_tab(browser, tabs, server.base + "/").page
    turn(page, "Note that Owen arrives Friday evening", "")
    expect(log_of(page).locator(".chip")).to_contain_text("Owen arrives Friday evening")
    turn(page, WEEKEND, "How was your weekend?")
    turn(page, BOOK, "Did you finish that book?")
    turn(page, "yes, loved it!", "")
    turn(page, "it was great, went hiking", "")
    hiking = said(page, "it was great, went hiking")
    expect(hiking).to_contain_text("↩ replying to “How was your weekend?”")
    expect(said(page, "yes, loved it!").locator(".replying-to")).to_have_count(0)

    page.get_by_role("textbox", name="Message").fill("remind me to call Anna tomorrow")
    page.get_by_role("button", name="Send").click()
    expect(log_of(page).locator(".chip").last).to_contain_text("call Anna (tomorrow)")
    expect(page.get_by_role("button", name="Stop")).to_be_hidden()
    # Before the reload: every message is then labelled "Sent", no clock time, so the same
    # run draws the same pictures.
    page.screenshot(path=DOCS / "app-1280.png")
    page.set_viewport_size({"width": 360, "height": 740})
    page.screenshot(path=DOCS / "app-360.png")

    page.reload()  # the history carries the reply_to too
    expect(said(page, "it was great, went hiking")).to_contain_text(
        "↩ replying to “How was your weekend?”"
    )


def test_memories_forget_500_in_one_request_then_clean_up(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    page = open_tab(browser, tabs, server.base + "/").page
    expect(page.get_by_role("status")).to_have_text("Connected")
    device = {"X-Stillhere-Device": stored(page, "device")}

    def create(n: int) -> int:
        memory = {"text": f"Fact number {n}: {words(n)}", "type": "fact"}
        return server.call("POST", "/v1/memories", memory, device)[0]

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(create, range(500)))
    assert statuses.count(201) == 500, statuses
    for n in range(3):
        memo = {"text": f"Memo {n}: buy {['milk', 'stamps', 'rope'][n]}", "type": "memo"}
        assert server.call("POST", "/v1/memories", memo, device)[0] == 201

    writes: list[Request] = []
    page.on("request", lambda r: writes.append(r) if r.method != "GET" else None)
    page.get_by_role("button", name="Memories").click()
    listed = page.get_by_role("list", name="Memories found").get_by_role("checkbox")
    expect(listed).to_have_count(50)
    first_page = listed.first.get_attribute("data-id")
    page.get_by_role("button", name="Next page").click()
    expect(page.get_by_text("Page 2")).to_be_visible()
    expect(listed).to_have_count(50)
    assert listed.first.get_attribute("data-id") != first_page
    page.get_by_role("button", name="Previous page").click()
    expect(listed.first).to_have_attribute("data-id", str(first_page))
    page.get_by_label("Type").select_option("fact")
    page.get_by_role("button", name="Find").click()
    page.get_by_role("button", name="Select all matching").click()
    expect(page.get_by_text("500 selected")).to_be_visible()
    page.get_by_role("button", name="Forget selected").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Forget 500 memories for good?")
    dialog.get_by_role("button", name="Forget 500 memories").click()
    expect(page.get_by_text("500 of 500 forgotten.")).to_be_visible()
    bulk = [r for r in writes if r.url.endswith("/v1/memories/bulk")]
    assert len(bulk) == 1 and len(writes) == 1
    assert bulk[0].post_data_json["action"] == "forget"
    assert len(set(bulk[0].post_data_json["ids"])) == 500
    status, left = server.call("GET", "/v1/memories?type=fact", headers=device)
    assert status == 200 and left["memories"] == []

    cleanup = page.get_by_role("form", name="Clean up")
    for category in ("appointments", "reminders"):
        cleanup.get_by_label(category).uncheck()
    cleanup.get_by_label("memos").check()
    cleanup.get_by_label("Which").select_option("all")
    cleanup.get_by_role("button", name="Preview clean-up").click()
    expect(page.get_by_text("3 memories would be forgotten.")).to_be_visible()
    expect(page.get_by_role("list", name="Would be forgotten")).to_contain_text("buy stamps")
    assert server.call("GET", "/v1/memories?type=memo", headers=device)[1]["memories"] != []
    page.get_by_role("button", name="Forget 3 memories").click()
    expect(page.get_by_text("3 memories forgotten.")).to_be_visible()
    assert server.call("GET", "/v1/memories?type=memo", headers=device)[1]["memories"] == []
    cleanups = [r.post_data_json for r in writes if r.url.endswith("/v1/memories/cleanup")]
    assert [c.get("dry_run", False) for c in cleanups] == [True, False]


WORDS = (
    *("apple", "river", "candle", "mountain", "violin"),
    *("pepper", "harbour", "lantern", "tiger", "meadow"),
)


def words(n: int) -> str:
    """Three words that tell memory `n` from every other (three digits in base ten)."""
    return " ".join(WORDS[int(d)] for d in f"{n:03d}")


def test_rules_are_added_and_removed(browser: Browser, server: Served, tabs: list[Tab]) -> None:
    page = open_tab(browser, tabs, server.base + "/").page
    page.get_by_role("button", name="Memories").click()
    page.get_by_role("textbox", name="New rule").fill("always answer in French")
    page.get_by_role("button", name="Add rule").click()
    rules = page.get_by_role("list", name="Rules")
    expect(rules).to_contain_text("always answer in French")
    page.get_by_role("button", name="Remove rule: always answer in French").click()
    expect(rules).not_to_contain_text("always answer in French")
    expect(page.get_by_role("list", name="Open threads")).to_contain_text("No open threads.")


def test_a_page_from_another_origin_cannot_drive_the_conversation(
    browser: Browser, server: Served, elsewhere: str
) -> None:
    """Another site's page (another port is another origin) knows a device secret and
    tries the WebSocket and a "simple" POST, which needs no preflight: both refused."""
    context = browser.new_context()
    try:
        page = context.new_page()
        answers: list[int] = []
        page.on("response", lambda r: answers.append(r.status) if "/v1/say" in r.url else None)
        page.goto(elsewhere)
        device = "device-from-elsewhere-0123456789"
        outcome = page.evaluate(
            """async ([base, device]) => {
                const socket = await new Promise((resolve) => {
                    const ws = new WebSocket(base.replace("http", "ws") + "/v1/ws");
                    ws.onopen = () => resolve("open");
                    ws.onerror = () => resolve("refused");
                });
                await fetch(base + "/v1/say", {
                    method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
                    body: JSON.stringify({device, id: "from-elsewhere", text: "hello"}),
                });
                return socket;
            }""",
            [server.base, device],
        )
    finally:
        context.close()
    assert outcome == "refused"
    assert answers == [403]
    # Nothing was stored: the same say from a phone (no Origin) is new, not a repeat.
    status, ack = server.call(
        "POST", "/v1/say", {"id": "from-elsewhere", "text": "hello"}, {"X-Stillhere-Device": device}
    )
    assert status == 200 and "repeat" not in ack
    assert "origin_refused" not in server.log()  # the log names the path, not the code
    assert f"refused POST /v1/say from origin {elsewhere.rstrip('/')}" in server.log()
    assert f"refused GET /v1/ws from origin {elsewhere.rstrip('/')}" in server.log()


def test_keyboard_only(browser: Browser, server: Served, tabs: list[Tab]) -> None:
    """The message box has the focus; Enter sends; Tab reaches the views' buttons."""
    page = open_tab(browser, tabs, server.base + "/").page
    expect(page.get_by_role("textbox", name="Message")).to_be_focused()
    page.keyboard.type("typed without a mouse")
    page.keyboard.press("Enter")
    expect(replies(page).last).to_contain_text('You said "typed without a mouse"')
    memories = page.get_by_role("button", name="Memories")
    for _ in range(12):
        if memories.evaluate("button => button === document.activeElement"):
            break
        page.keyboard.press("Shift+Tab")
    expect(memories).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("textbox", name="New rule")).to_be_visible()
    expect(page.get_by_role("textbox", name="Message")).to_be_hidden()


def test_an_account_token_pasted_in_settings(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    """The page then speaks as the account: a say from the account's other phone (the
    Python client's way, over HTTP) is answered in the page's conversation too."""
    token = Identity(SECRET).issue("anna-" + uuid.uuid4().hex[:8], 3600)
    page = open_tab(browser, tabs, server.base + "/").page
    expect(page.get_by_role("status")).to_have_text("Connected")
    page.get_by_role("button", name="Settings").click()
    page.get_by_label("Account token").fill("not-a-token")
    page.get_by_role("button", name="Use this account").click()
    expect(page.get_by_role("status")).to_have_text(
        "Not accepted: the account token does not verify"
    )
    page.get_by_label("Account token").fill(token)
    page.get_by_role("button", name="Use this account").click()
    expect(page.get_by_text("You are signed in with an account token.")).to_be_visible()
    assert stored(page, "token") == token
    page.get_by_role("button", name="Conversation", exact=True).click()
    expect(page.get_by_role("status")).to_have_text("Connected")
    turn(page, "hello from the browser", 'You said "hello from the browser"')
    bearer = {"Authorization": f"Bearer {token}"}
    status, ack = server.call(
        "POST", "/v1/say", {"id": "other", "text": "and from my phone"}, bearer
    )
    assert status == 200 and ack["type"] == "ack"
    expect(replies(page).last).to_contain_text('You said "and from my phone"')


def test_reminder_times_in_words(browser: Browser, server: Served, tabs: list[Tab]) -> None:
    """What the app makes of a reminder's `due` (words), read in the page's own module."""
    page = open_tab(browser, tabs, server.base + "/").page
    read = page.evaluate(
        """async () => {
            const { dueAt } = await import("/app/reminders.js");
            const now = new Date(2026, 4, 19, 10, 30);  // a Tuesday morning
            const when = (words) => dueAt(words, now)?.toString() ?? null;
            const at = (...parts) => new Date(...parts).toString();
            return [
                [when("tomorrow"), at(2026, 4, 20, 9, 0)],
                [when("tomorrow at 5pm"), at(2026, 4, 20, 17, 0)],
                [when("on Thursday"), at(2026, 4, 21, 9, 0)],
                [when("on Tuesday"), at(2026, 4, 26, 9, 0)],
                [when("at 9am"), at(2026, 4, 20, 9, 0)],
                [when("in 10 minutes"), at(2026, 4, 19, 10, 40)],
                [when("tonight"), at(2026, 4, 19, 20, 0)],
                [when("some day"), null],
            ];
        }"""
    )
    assert [got for got, _ in read] == [expected for _, expected in read]


def test_marking_wrong_ranges_and_muting(browser: Browser, server: Served, tabs: list[Tab]) -> None:
    page = open_tab(browser, tabs, server.base + "/").page
    expect(page.get_by_role("status")).to_have_text("Connected")
    device = {"X-Stillhere-Device": str(stored(page, "device"))}
    texts = ["Owen lives in Lisbon", "Owen lives in Porto"] + [
        f"The {w} is kept in the {v}" for w, v in zip(WORDS[:4], WORDS[4:8], strict=True)
    ]
    ids = {}
    for text in texts:
        status, created = server.call("POST", "/v1/memories", {"text": text}, device)
        assert status == 201, created
        ids[text] = created["memory"]["id"]
    writes: list[Request] = []
    page.on("request", lambda r: writes.append(r) if r.method != "GET" else None)
    page.get_by_role("button", name="Memories").click()
    found = page.get_by_role("list", name="Memories found")
    expect(found.get_by_role("checkbox")).to_have_count(6)

    page.get_by_role("button", name="Mark wrong: Owen lives in Lisbon").click()
    dialog = page.get_by_role("dialog", name="Mark as wrong")
    dialog.get_by_label("The memory that is right").select_option(label="Owen lives in Porto")
    dialog.get_by_role("button", name="Mark as wrong").click()
    expect(page.get_by_text("Marked as wrong")).to_be_visible()
    _, wrong = server.call("GET", f"/v1/memories/{ids['Owen lives in Lisbon']}", headers=device)
    assert wrong["memory"]["status"] == "erroneous"
    assert wrong["memory"]["corrected_by"] == ids["Owen lives in Porto"]

    page.get_by_label("Search").fill("Where does Owen live?")
    page.get_by_role("button", name="Find").click()
    expect(found.get_by_role("checkbox").first).to_have_attribute(
        "data-id", ids["Owen lives in Porto"]
    )
    expect(found).not_to_contain_text("Owen lives in Lisbon")  # erroneous: not active
    expect(found.get_by_text(re.compile(r"· match \d\.\d\d$")).first).to_be_visible()  # scored
    page.get_by_label("Search").fill("my tax return")  # nothing said of it: no result at all
    page.get_by_role("button", name="Find").click()
    expect(found).to_have_text("Nothing found.")
    page.get_by_label("Search").fill("")
    page.get_by_role("button", name="Find").click()
    boxes = found.get_by_role("checkbox")
    expect(boxes).to_have_count(5)  # the erroneous one left the active list
    boxes.nth(0).click()
    boxes.nth(3).click(modifiers=["Shift"])
    expect(page.get_by_text("4 selected")).to_be_visible()
    chosen = [boxes.nth(i).get_attribute("data-id") for i in range(4)]
    page.get_by_role("button", name="Mute selected", exact=True).click()
    page.get_by_role("dialog").get_by_role("button", name="Mute 4 memories").click()
    expect(page.get_by_text("4 of 4 muted.")).to_be_visible()
    expect(found.get_by_role("checkbox")).to_have_count(1)
    page.get_by_label("Status").select_option("muted")
    page.get_by_role("button", name="Find").click()
    expect(found.get_by_role("checkbox")).to_have_count(4)
    bulk = [r.post_data_json for r in writes if r.url.endswith("/v1/memories/bulk")]
    assert len(bulk) == 1 and bulk[0]["action"] == "mute"
    assert sorted(bulk[0]["ids"]) == sorted(chosen)


def test_a_page_chip_reopens_its_page_after_a_reload(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    """A page is never a memory: the app keeps it itself, and its chip opens it again."""
    page = open_tab(browser, tabs, server.base + "/").page
    turn(page, "show me a page about the Bristol weather", "Here is a page: Bristol weather.")
    chip = page.get_by_role("button", name="Page Bristol weather")
    for _ in range(2):
        chip.click()
        sheet = page.get_by_role("dialog", name="Bristol weather")
        expect(sheet).to_contain_text("A page about the Bristol weather, to read now")
        sheet.get_by_role("button", name="Close").click()
        expect(sheet).to_be_hidden()
        page.reload()
        expect(page.get_by_role("status")).to_have_text("Connected")
    device = {"X-Stillhere-Device": str(stored(page, "device"))}
    assert server.call("GET", "/v1/memories", headers=device)[1]["memories"] == []


def test_markup_from_the_person_or_the_model_stays_text(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    page = open_tab(browser, tabs, server.base + "/").page
    markup = '<img src="x" onerror="document.title=1"><b>bold</b>'
    turn(page, markup, "You said")
    expect(said(page, markup)).to_have_count(1)
    expect(replies(page).last).to_contain_text(f'You said "{markup}"')  # the model's, too
    assert log_of(page).locator("img, b").count() == 0


def test_a_reminder_becomes_a_notification_once_allowed(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    """At the time its words name ("at 11pm"), on the page's clock, fast-forwarded."""
    tab = open_tab(browser, tabs, "")
    page = tab.page
    tab.context.grant_permissions(["notifications"], origin=server.base)
    page.add_init_script(
        """window.shown = [];
        window.Notification = class extends window.Notification {
            constructor(title, options) { super(title, options); window.shown.push(options.body); }
        };"""
    )
    page.clock.install(time=datetime(2026, 5, 19, 22, 57))
    page.goto(server.base + "/")
    page.get_by_role("button", name="Settings").click()
    page.get_by_role("button", name="Allow reminder notifications").click()
    page.get_by_role("button", name="Conversation", exact=True).click()
    turn(page, "remind me to stretch at 11pm", "I'll remind you to stretch (at 11pm).")
    expect(log_of(page).locator(".chip")).to_contain_text("Reminder stretch (at 11pm)")
    assert page.evaluate("window.shown") == []
    page.clock.fast_forward("04:00")
    assert page.evaluate("window.shown") == ["stretch"]


def test_ending_the_conversation_starts_a_new_one(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    page = open_tab(browser, tabs, server.base + "/").page
    turn(page, "a first conversation", 'You said "a first conversation"')
    first = stored(page, "conversation")
    page.get_by_role("button", name="Settings").click()
    page.get_by_role("button", name="End this conversation").click()
    page.get_by_role("button", name="Conversation", exact=True).click()
    expect(page.get_by_text("You ended the conversation.")).to_be_visible()
    expect(page.get_by_role("status")).to_have_text("Connected")
    expect(said(page, "a first conversation")).to_have_count(0)
    assert stored(page, "conversation") not in (first, None)
    turn(page, "a second one", 'You said "a second one". (0 earlier turns in view.)')


def test_a_wrong_merge_is_split_back_out(browser: Browser, server: Served, tabs: list[Tab]) -> None:
    """A memory said again lists each time; one split out is a memory of its own, as said."""
    page = open_tab(browser, tabs, server.base + "/").page
    expect(page.get_by_role("status")).to_have_text("Connected")
    device = {"X-Stillhere-Device": str(stored(page, "device"))}
    owen = {"text": "Owen lives in Bristol", "people": ["owen"], "themes": ["family"]}
    again = {"text": "owen lives in bristol!", "people": ["owen"], "themes": ["family"]}
    _, created = server.call("POST", "/v1/memories", owen, device)
    status, reinforced = server.call("POST", "/v1/memories", again, device)
    assert (status, reinforced["result"]) == (200, "reinforced"), reinforced
    page.get_by_role("button", name="Memories").click()
    found = page.get_by_role("list", name="Memories found")
    expect(found.get_by_role("checkbox")).to_have_count(1)
    page.get_by_role("button", name="Said again: Owen lives in Bristol").click()
    dialog = page.get_by_role("dialog", name="Said again")
    dialog.get_by_role("button", name="Split out: owen lives in bristol!").click()
    expect(page.get_by_text("Split out as a memory of its own.")).to_be_visible()
    expect(found.get_by_role("checkbox")).to_have_count(2)
    expect(found).to_contain_text("owen lives in bristol!")
    _, former = server.call("GET", f"/v1/memories/{created['memory']['id']}", headers=device)
    assert former["memory"]["mention_count"] == 1
    [mention] = former["mentions"]
    assert mention["split_into"] is not None
    _, split = server.call("GET", f"/v1/memories/{mention['split_into']}", headers=device)
    assert (split["memory"]["text"], split["memory"]["people"]) == (again["text"], ["owen"])
    expect(page.get_by_role("button", name="Said again: Owen lives in Bristol")).to_have_count(0)


def test_a_conversation_moved_to_another_node_comes_back_at_once_by_its_route(
    browser: Browser, server: Served, tabs: list[Tab]
) -> None:
    """Another node asks for the person (as its hello would): this one closes the page's
    link with `bye` `moved`; the page reconnects at once, with its route, and goes on."""
    page = open_tab(browser, tabs, server.base + "/").page
    turn(page, "before the move", 'You said "before the move"')
    route = stored(page, "route")
    assert isinstance(route, str) and route
    record_states(page)
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    person = Identity(SECRET).person(device=str(stored(page, "device")))
    run_sql(
        server.dsn,
        "SELECT pg_notify('stillhere_handoff', node || ' ' || person) FROM owners "
        f"WHERE person = '{person}'",
    )
    expect(page.get_by_role("status")).to_have_text("Connected")
    # A function, not an expression: Playwright evaluates it once, and the page's CSP (no
    # eval) would refuse an expression evaluated again on each later poll.
    page.wait_for_function("() => window.dotStates.at(-1) === 'up' && window.dotStates.length > 2")
    assert states(page) == ["up", "connecting", "up"]  # at once: no backoff's wait between
    turn(page, "after the move", 'You said "after the move"')
    assert sockets and all(f"r={route}" in url for url in sockets)
    expect(page.get_by_text("The conversation ended after a long pause.")).to_have_count(0)
