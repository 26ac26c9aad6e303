"""The admin API and `stillhere inspect`: live actor state for a developer, behind a token."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pykka
import pytest

from actors.conversation import ConversationActor
from cli.main import main
from tests.conftest import Harness, eventually
from tests.fakes.openai_server import FakeOpenAI, Reply
from transport import admin
from transport.app import listening_line

TOKEN = "admin-token-for-tests-0123456789abcdef"
SLOW = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"


async def _start(harness: Harness, **overrides: Any) -> str:
    """Start the server with its admin API on a free port; the admin base URL."""
    await harness.start(admin_token=TOKEN, admin_port=0, **overrides)
    return f"http://127.0.0.1:{harness.server.admin_port}"


async def _get(harness: Harness, url: str, token: str | None = TOKEN) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with harness.http.get(url, headers=headers) as response:
        return response.status, await response.json(content_type=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_admin_api_is_off_without_a_token(harness: Harness) -> None:
    await harness.start(admin_port=0)
    assert harness.server.admin_port is None  # no admin listener at all
    assert listening_line(harness.server, 8765).endswith(", admin off (no --admin-token)")
    async with harness.http.get(harness.url("/admin/actors")) as response:
        assert response.status == 404  # and nothing of it on the main listener


async def test_a_missing_or_wrong_token_is_refused(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    url = await _start(harness)
    for token in (None, "wrong-token", TOKEN[:-1], ""):
        status, body = await _get(harness, url + "/admin/actors", token)
        assert status == 401
        assert (body["type"], body["code"]) == ("error", "unauthorized")
        assert body["message"]
    async with harness.http.get(
        url + "/admin/actors", headers={"Authorization": f"Basic {TOKEN}"}
    ) as response:
        assert response.status == 401
    status, _ = await _get(harness, url + "/admin/no-such-page", None)
    assert status == 401  # refused before routing: nothing can be probed
    status, _ = await _get(harness, url + "/admin/actors")
    assert status == 200
    status, body = await _get(harness, url + "/admin/no-such-page")
    assert (status, body["code"]) == (404, "not_found")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with harness.http.post(url + "/admin/actors", headers=auth) as response:
        body = await response.json()
        assert (response.status, body["code"]) == (405, "method_not_allowed")
    assert TOKEN not in caplog.text


async def test_the_list_shows_each_live_actor(harness: Harness) -> None:
    url = await _start(harness)
    phone = await harness.phone()
    await phone.say("Note that Owen arrives Friday evening")
    await phone.reply()
    gone = await harness.phone()
    await gone.drop()
    await eventually(lambda: harness.links(gone) == 0)
    harness.clock.advance(5)
    status, listing = await _get(harness, url + "/admin/actors")
    assert status == 200
    assert listing["count"] == 2
    rows = {row["person"]: row for row in listing["actors"]}
    row = rows[harness.person(phone)]
    assert row["conversation"] == phone.welcome["conversation"]
    assert (row["state"], row["links"], row["pending"], row["window"]) == ("idle", 1, 0, 2)
    assert (row["age_s"], row["idle_s"]) == (5.0, 5.0)  # the injected clock
    assert row["last_activity"].startswith("2026-05-19T09:00:00")
    other = rows[harness.person(gone)]
    assert (other["links"], other["window"]) == (0, 0)


async def test_the_list_pages_filters_and_sorts_on_the_server(harness: Harness) -> None:
    url = await _start(harness)
    phones = [await harness.phone() for _ in range(5)]
    for n, phone in enumerate(phones):  # phone n has said n things: windows 0, 2, 4, 6, 8
        for _ in range(n):
            await phone.say("hello")
            await phone.reply()
    people = [harness.person(phone) for phone in phones]

    _, page = await _get(harness, url + "/admin/actors?sort=-window&limit=2&offset=1")
    assert (page["total"], page["count"], page["offset"], page["limit"]) == (5, 5, 1, 2)
    assert [row["person"] for row in page["actors"]] == [people[3], people[2]]
    assert page["states"] == {
        "idle": 5,
        "replying": 0,
        "ending": 0,
        "inactive": 0,
        "stopped": 0,
        "unresponsive": 0,
    }
    _, page = await _get(harness, url + "/admin/actors?sort=window")
    assert [row["window"] for row in page["actors"]] == [0, 2, 4, 6, 8]
    assert page["limit"] is None  # no limit: every row, as before paging existed

    _, page = await _get(harness, f"{url}/admin/actors?q={people[4][:10].upper()}")
    assert [row["person"] for row in page["actors"]] == [people[4]]
    assert (page["total"], page["count"]) == (5, 1)
    conversation = phones[1].welcome["conversation"]
    _, page = await _get(harness, f"{url}/admin/actors?q={conversation[:8]}")
    assert [row["conversation"] for row in page["actors"]] == [conversation]
    _, page = await _get(harness, url + "/admin/actors?state=replying,ending")
    assert (page["count"], page["actors"]) == (0, [])
    _, page = await _get(harness, url + "/admin/actors?state=idle&limit=3&offset=4")
    assert (page["count"], len(page["actors"])) == (5, 1)


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=1001",
        "limit=ten",
        "offset=-1",
        "sort=mood",
        "sort=--idle",
        "state=asleep",
        "q=" + "x" * 201,
    ],
)
async def test_a_bad_list_query_is_a_clear_400(harness: Harness, query: str) -> None:
    url = await _start(harness)
    await harness.phone()
    status, body = await _get(harness, f"{url}/admin/actors?{query}")
    assert status == 400
    assert (body["type"], body["code"]) == ("error", "invalid_field")
    assert query.split("=")[0] in body["message"]


async def test_the_admin_listener_serves_the_metrics_behind_the_token(harness: Harness) -> None:
    url = await _start(harness)
    phone = await harness.phone()
    await phone.say("hello")
    await phone.reply()
    status, _ = await _get(harness, url + "/admin/metrics", None)
    assert status == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with harness.http.get(url + "/admin/metrics", headers=auth) as response:
        assert response.status == 200
        text = await response.text()
    assert "stillhere_live_actors 1.0" in text
    assert "stillhere_turn_seconds_count 1.0" in text


async def test_the_live_view_files_are_served_without_the_token(harness: Harness) -> None:
    url = await _start(harness)
    async with harness.http.get(url + "/") as response:
        assert response.status == 200
        assert response.content_type == "text/html"
        page, etag = await response.text(), response.headers["ETag"]
        csp = response.headers["Content-Security-Policy"]
        assert response.headers["Cache-Control"] == "no-cache"
    assert "script-src 'self'" in csp and "unsafe" not in csp
    assert '<script type="module" src="/live/live.js">' in page
    async with harness.http.get(url + "/", headers={"If-None-Match": etag}) as response:
        assert response.status == 304  # unchanged: the browser keeps its copy
    async with harness.http.get(url + "/live/live.js") as response:
        assert response.status == 200
        assert response.content_type == "text/javascript"
    status, _ = await _get(harness, url + "/live/secrets.js", None)
    assert status == 401  # only the view's own files go without the token
    status, body = await _get(harness, url + "/live/secrets.js")
    assert (status, body["code"]) == (404, "not_found")


async def test_a_replying_actor_shows_its_state_and_pending_messages(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    url = await _start(harness, llm_url=fake_llm.url)
    fake_llm.queue(Reply(SLOW, chunk=3, delay=0.05), Reply("Both answered."))
    phone = await harness.phone()
    await phone.say("Plan my Saturday.")
    await phone.expect("reply.delta")
    await phone.say("Owen comes too.", "m2")  # waits for the reply to end
    _, listing = await _get(harness, url + "/admin/actors")
    (row,) = listing["actors"]
    assert (row["state"], row["pending"], row["window"]) == ("replying", 1, 1)
    _, actor = await _get(harness, f"{url}/admin/actors/{row['person']}")
    assert actor["state"] == "replying"
    assert [(t["text"], t["client_id"]) for t in actor["pending"]] == [("Owen comes too.", "m2")]
    assert actor["during_reply"] is True
    await phone.reply()
    await phone.reply()
    _, actor = await _get(harness, f"{url}/admin/actors/{row['person']}")
    assert (actor["state"], actor["pending"], actor["during_reply"]) == ("idle", [], False)


async def test_one_actor_shows_its_window_cards_speaker_and_stream(harness: Harness) -> None:
    url = await _start(harness)
    phone = await harness.phone()
    await phone.say("Note that Owen arrives Friday evening")
    await phone.reply()
    await phone.say("This is Hannah speaking")
    await phone.reply()
    person = harness.person(phone)
    status, actor = await _get(harness, f"{url}/admin/actors/{person}")
    assert status == 200
    assert (actor["person"], actor["conversation"]) == (person, phone.welcome["conversation"])
    assert [t["role"] for t in actor["window"]] == ["user", "assistant"] * 2
    first = actor["window"][0]
    assert (first["text"], first["interrupted"]) == ("Note that Owen arrives Friday evening", False)
    assert all(t["at"] for t in actor["window"])
    (card,) = actor["cards"]
    assert "Owen" in card["text"]
    assert actor["speaker"] == "Hannah" and actor["speaker_at"]
    assert actor["pending"] == []
    stream = actor["stream"]
    assert stream["last_seq"] == phone.last_seq
    assert stream["buffered"] > 0
    (link,) = stream["links"]
    assert link.startswith("ws-")


async def test_an_unknown_person_is_404(harness: Harness) -> None:
    url = await _start(harness)
    status, body = await _get(harness, f"{url}/admin/actors/{'0' * 64}")
    assert status == 404
    assert (body["type"], body["code"]) == ("error", "unknown_person")


async def test_an_actor_that_does_not_answer_is_listed_as_unresponsive(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = await _start(harness)
    monkeypatch.setattr(admin, "SNAPSHOT_TIMEOUT", 0.05)
    phone = await harness.phone()
    live = harness.server.directory.get(harness.person(phone))
    assert live is not None
    deaf = _Deaf.start()
    real, live.ref = live.ref, deaf  # type: ignore[assignment]
    live.tell("a message it is stuck on")  # unhandled: its published snapshot is not current
    try:
        _, listing = await _get(harness, url + "/admin/actors")
        _, actor = await _get(harness, f"{url}/admin/actors/{live.person}")
    finally:
        live.ref = real
        deaf.stop(block=False)
    (row,) = listing["actors"]
    assert (row["state"], row["links"], row["window"]) == ("unresponsive", 1, None)
    assert actor["state"] == "unresponsive" and actor["window"] is None
    assert len(actor["stream"]["links"]) == 1  # the loop side still shows


class _Deaf(pykka.ThreadingActor):
    """An actor that never answers: a stand-in for one stuck in a long computation."""

    def on_receive(self, message: Any) -> None:
        pass


async def test_the_server_sweeps_on_its_own_every_sweep_interval(harness: Harness) -> None:
    url = await _start(harness, sweep_interval=0.05)
    async with asyncio.timeout(10):
        while len((await _get(harness, url + "/admin/sweeps"))[1]["sweeps"]) < 2:
            await asyncio.sleep(0.02)


async def test_sweeps_and_replaced_actors(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = await _start(harness)
    _, empty = await _get(harness, url + "/admin/sweeps")
    assert (empty["sweeps"], empty["replaced"], empty["sweeping"]) == ([], 0, False)
    phone = await harness.phone()
    await phone.say("hello")
    await phone.reply()
    await harness.sweep()
    harness.clock.advance(31 * 60)
    await harness.sweep()
    _, sweeps = await _get(harness, url + "/admin/sweeps")
    assert [(s["archived"], s["live"]) for s in sweeps["sweeps"]] == [(0, 1), (1, 0)]
    assert sweeps["interval_s"] == 300

    other = await harness.phone()
    real = ConversationActor._on_say

    def fail_once(self: ConversationActor, say: object) -> None:
        monkeypatch.setattr(ConversationActor, "_on_say", real)
        raise RuntimeError("injected failure")

    monkeypatch.setattr(ConversationActor, "_on_say", fail_once)
    await other.send({"type": "say", "id": "x1", "text": "two"})
    await other.expect("error")

    async def replaced() -> int:
        return int((await _get(harness, url + "/admin/sweeps"))[1]["replaced"])

    async with asyncio.timeout(10):
        while await replaced() != 1:
            await asyncio.sleep(0.01)


async def test_inspect_prints_the_table_and_one_actor(
    harness: Harness, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    url = await _start(harness)
    phone = await harness.phone()
    await phone.say("Note that Owen arrives Friday evening")
    await phone.reply()
    person = harness.person(phone)
    options = ["--admin-url", url, "--admin-token", TOKEN]

    assert await asyncio.to_thread(main, ["inspect", *options]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["PERSON", "CONVERSATION", "STATE"]
    assert table[1].split()[:3] == [person[:12], phone.welcome["conversation"][:8], "idle"]
    assert table[-1] == "1 live actor"

    assert await asyncio.to_thread(main, ["inspect", person[:12], *options]) == 0
    shown = capsys.readouterr().out
    assert person in shown
    assert "window (2 turns)" in shown
    assert "Note that Owen arrives Friday evening" in shown
    assert "cards (1 card)" in shown

    assert await asyncio.to_thread(main, ["inspect", "--json", *options]) == 0
    assert '"count": 1' in capsys.readouterr().out
    assert TOKEN not in caplog.text


async def test_inspect_reads_its_settings_from_the_environment(
    harness: Harness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = await _start(harness)
    monkeypatch.setenv("STILLHERE_ADMIN_URL", url)
    monkeypatch.setenv("STILLHERE_ADMIN_TOKEN", TOKEN)
    assert await asyncio.to_thread(main, ["inspect"]) == 0
    assert capsys.readouterr().out.strip() == "no live actors"


async def test_inspect_explains_what_went_wrong(
    harness: Harness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STILLHERE_ADMIN_TOKEN", raising=False)
    url = await _start(harness)

    async def fails(*argv: str) -> str:
        assert await asyncio.to_thread(main, ["inspect", *argv]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert TOKEN not in captured.err
        return captured.err

    assert "no admin token" in await fails("--admin-url", url)
    assert "refused the token (401)" in await fails("--admin-url", url, "--admin-token", "nope")
    assert "no live conversation for person abc" in await fails(
        "abc", "--admin-url", url, "--admin-token", TOKEN
    )
    assert "no live conversation" in await fails(
        "0" * 64, "--admin-url", url, "--admin-token", TOKEN
    )
    closed = f"http://127.0.0.1:{_free_port()}"
    assert "connection refused" in await fails("--admin-url", closed, "--admin-token", TOKEN)
    main_port = harness.url("/").rstrip("/")
    assert "not found (404)" in await fails("--admin-url", main_port, "--admin-token", TOKEN)
    for bad in ("ftp://127.0.0.1:8766", "http://127.0.0.1:port", "http://"):
        assert "--admin-url must be an address" in await fails(
            "--admin-url", bad, "--admin-token", TOKEN
        )


@pytest.mark.parametrize("form", ["bare", "as logged"])
async def test_inspect_takes_the_admin_url_as_typed_or_as_logged(
    harness: Harness, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    """A bare host:port, or the live view's `http://host:port/` the server logs at start-up."""
    url = await _start(harness)
    given = url.removeprefix("http://") if form == "bare" else f"{url}/"
    argv = ["inspect", "--admin-url", given, "--admin-token", TOKEN]
    assert await asyncio.to_thread(main, argv) == 0
    assert capsys.readouterr().out.strip() == "no live actors"
