"""The Origin check and the app's files, over real HTTP: a browser page from another site
cannot open a link or write, phones (no Origin) and the server's own page can."""

from __future__ import annotations

import argparse
import re

import aiohttp
import pytest
from yarl import URL

from tests.conftest import Harness
from transport.config import Settings, add_options, settings_from

DEVICE = {"X-Stillhere-Device": "device-origin-0123456789abcdef"}
ELSEWHERE = "https://elsewhere.example"


def own_origin(harness: Harness) -> str:
    return harness.url("/").rstrip("/")


async def say(harness: Harness, id_: str, origin: str | None) -> tuple[int, dict[str, object]]:
    headers = {**DEVICE, **({"Origin": origin} if origin else {})}
    body = {"id": id_, "text": "hello"}
    async with harness.http.post(harness.url("/v1/say"), json=body, headers=headers) as answer:
        return answer.status, await answer.json()


async def test_a_foreign_origin_is_refused_and_nothing_is_stored(harness: Harness) -> None:
    await harness.start()
    status, error = await say(harness, "s1", ELSEWHERE)
    assert status == 403
    assert error == {
        "type": "error",
        "code": "origin_refused",
        "message": "requests from this web origin are not accepted",
    }
    status, ack = await say(harness, "s1", None)  # a phone: no Origin
    assert status == 200 and ack["type"] == "ack" and "repeat" not in ack


@pytest.mark.parametrize("origin", [None, "own", "http://friend.example"])
async def test_phones_the_own_page_and_allowed_origins_pass(
    harness: Harness, origin: str | None
) -> None:
    await harness.start(allowed_origins=("http://friend.example",))
    sent = own_origin(harness) if origin == "own" else origin
    status, ack = await say(harness, "s-" + str(origin), sent)
    assert status == 200 and ack["type"] == "ack"
    headers = {"Origin": sent} if sent else {}
    async with harness.http.ws_connect(harness.url("/v1/ws"), headers=headers) as ws:
        await ws.send_json({"type": "hello", "v": 1, "device": DEVICE["X-Stillhere-Device"]})
        assert (await ws.receive_json())["type"] == "welcome"


@pytest.mark.parametrize("origin", [ELSEWHERE, "null", "http://friend.example.evil"])
async def test_the_websocket_refuses_a_foreign_origin(harness: Harness, origin: str) -> None:
    await harness.start(allowed_origins=("http://friend.example",))
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await harness.http.ws_connect(harness.url("/v1/ws"), headers={"Origin": origin})
    assert refused.value.status == 403
    headers = {**DEVICE, "Origin": origin}
    async with harness.http.get(harness.url("/v1/events"), headers=headers) as r:
        assert r.status == 403 and (await r.json())["code"] == "origin_refused"


async def test_writes_of_the_other_apis_are_guarded_reads_are_not(harness: Harness) -> None:
    await harness.start()
    foreign = {**DEVICE, "Origin": ELSEWHERE}
    writes = [
        ("POST", "/v1/rules", {"text": "always answer in French"}),
        ("POST", "/v1/memories", {"text": "Owen arrives Friday"}),
        ("POST", "/v1/memories/bulk", {"action": "mute", "ids": ["x"]}),
        ("POST", "/v1/interrupt", {}),
        ("POST", "/v1/leave", {}),
    ]
    for method, path, body in writes:
        async with harness.http.request(method, harness.url(path), json=body, headers=foreign) as r:
            assert (r.status, (await r.json())["code"]) == (403, "origin_refused"), path
    async with harness.http.get(harness.url("/v1/rules"), headers=foreign) as r:
        assert r.status == 200 and (await r.json()) == {"rules": []}  # nothing was added


def test_allowed_origins_are_parsed_and_bad_ones_refused() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser)
    args = parser.parse_args(["--allowed-origins", "https://App.example.org/, http://x:8080"])
    assert settings_from(args).allowed_origins == ("https://app.example.org", "http://x:8080")
    assert Settings().allowed_origins == ()
    for bad in ("app.example.org", "ftp://x", "https://x/path"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--allowed-origins", bad])


async def test_the_app_is_served_with_its_policy_and_cache_validators(harness: Harness) -> None:
    await harness.start()
    async with harness.http.get(harness.url("/")) as page:
        assert page.status == 200 and page.content_type == "text/html"
        html = await page.text()
        headers = page.headers
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", html, re.DOTALL)
    assert scripts == [""] and 'src="/app/main.js"' in html  # one script, none inline
    assert 'role="log"' in html
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe" not in policy
    assert "default-src 'none'" in policy
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Cache-Control"] == "no-cache"
    assert f"connect-src 'self' ws://{URL(harness.url('/')).authority}" in policy
    etag = headers["ETag"]
    odd = {"Host": "x; script-src *"}
    async with harness.http.get(harness.url("/"), headers=odd) as page:
        assert "script-src *" not in page.headers["Content-Security-Policy"]
    async with harness.http.get(harness.url("/"), headers={"If-None-Match": etag}) as again:
        assert again.status == 304 and await again.read() == b""
    async with harness.http.get(harness.url("/app/main.js")) as script:
        assert script.status == 200 and script.content_type == "text/javascript"
        assert script.headers["ETag"] != etag
    for missing in ("/app/nothing.js", "/app/../app.py"):
        async with harness.http.get(harness.url(missing)) as absent:
            assert absent.status == 404
