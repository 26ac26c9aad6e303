"""`--trusted-proxies`: the client's address and scheme come from `X-Forwarded-For` and
`X-Forwarded-Proto` only on a connection from a trusted proxy, and a client cannot forge
them: neither from an untrusted address, nor by writing the header before the proxy
appends to it. The per-address link limits and their log lines use that address."""

from __future__ import annotations

import contextlib
import ipaddress
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import Harness, eventually
from transport import server
from transport.config import Limits
from transport.forwarded import forwarded

PROXY = ipaddress.ip_network("127.0.0.1/32")  # the tests' proxy: this host's first address
INNER = ipaddress.ip_network("10.0.0.0/8")  # another proxy behind which the first sits
ELSEWHERE = "127.0.0.2"  # an untrusted peer: a client reaching the node directly


def session(local: str = "127.0.0.1") -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(local, 0)))


@pytest.fixture
async def echo() -> AsyncIterator[str]:
    """A server with the middleware, answering with the client address and scheme it sees."""

    async def seen(request: web.Request) -> web.Response:
        return web.json_response({"remote": request.remote, "scheme": request.scheme})

    app = web.Application(middlewares=[forwarded((PROXY, INNER))])
    app.router.add_get("/", seen)
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server()
    yield str(test_server.make_url("/"))
    await test_server.close()


async def seen_as(url: str, headers: dict[str, str], local: str = "127.0.0.1") -> dict[str, str]:
    async with session(local) as http, http.get(url, headers=headers) as answer:
        return dict(await answer.json())


@pytest.mark.parametrize(
    ("forwarded_for", "client"),
    [
        ("203.0.113.5", "203.0.113.5"),
        # The client wrote the first address itself; the proxy appended the one it heard.
        ("198.51.100.7, 203.0.113.5", "203.0.113.5"),
        ("203.0.113.5, 10.1.2.3", "203.0.113.5"),  # passed through another trusted proxy
        ("2001:db8::5", "2001:db8::5"),
        ("not-an-address", "127.0.0.1"),
    ],
)
async def test_a_trusted_proxy_names_the_client(echo: str, forwarded_for: str, client: str) -> None:
    headers = {"X-Forwarded-For": forwarded_for, "X-Forwarded-Proto": "https"}
    assert await seen_as(echo, headers) == {"remote": client, "scheme": "https"}


async def test_headers_from_an_untrusted_peer_are_ignored(echo: str) -> None:
    headers = {"X-Forwarded-For": "203.0.113.5", "X-Forwarded-Proto": "https"}
    assert await seen_as(echo, headers, ELSEWHERE) == {"remote": ELSEWHERE, "scheme": "http"}


async def test_the_link_limits_count_the_client_behind_the_proxy(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(server, "REFUSAL_DELAY_S", 0.01)
    await harness.start(trusted_proxies=(PROXY,), limits=Limits(max_links_per_address=1))
    async with contextlib.AsyncExitStack() as links:

        async def link(local: str, forwarded_for: str) -> int:
            """A WebSocket link from `local`: 101 once welcomed, else the refusal's status."""
            http = await links.enter_async_context(session(local))
            headers = {"X-Forwarded-For": forwarded_for}
            try:
                ws = await links.enter_async_context(
                    http.ws_connect(harness.url("/v1/ws"), headers=headers)
                )
            except aiohttp.WSServerHandshakeError as refused:
                return refused.status
            await ws.send_json({"type": "hello", "v": 1, "device": uuid.uuid4().hex * 2})
            assert (await ws.receive_json())["type"] == "welcome"
            return 101

        assert await link("127.0.0.1", "203.0.113.5") == 101
        assert await link("127.0.0.1", "198.51.100.7, 203.0.113.5") == 429  # the same client
        assert await link("127.0.0.1", "203.0.113.6") == 101  # another one behind the proxy
        assert await link(ELSEWHERE, "203.0.113.9") == 101
        assert await link(ELSEWHERE, "203.0.113.10") == 429  # the peer, whatever it says
        assert set(harness.server.address_links) == {"203.0.113.5", "203.0.113.6", ELSEWHERE}
    await eventually(lambda: not harness.server.address_links)
    assert "refused a link from 203.0.113.5: 1 links open from there" in caplog.text
    assert f"refused a link from {ELSEWHERE}: 1 links open from there" in caplog.text
    assert "198.51.100.7" not in caplog.text
