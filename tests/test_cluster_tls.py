"""`stillhere cluster --tls-cert --tls-key`: Debian's HAProxy terminates TLS in front of two
nodes. Phones reach each node over `wss://` and `https://` with the certificate verified,
answers carry HSTS, and each node sees the phone's own address through HAProxy's
X-Forwarded-For (its per-address limit counts phones, not HAProxy), which a phone cannot
forge."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from client import Phone
from tests.test_cluster import (
    NODES,
    START_TIMEOUT_S,
    Cluster,
    refused,
    routes_to_each_node,
    start_cluster,
    stop_cluster,
)
from tests.test_deploy import needs_haproxy
from tests.test_tls import talk
from tests.tls_support import Authority, needs_openssl

pytestmark = [needs_haproxy, needs_openssl]


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Authority]]:
    """A TLS cluster whose nodes allow one link per address, and the authority to trust."""
    folder = tmp_path_factory.mktemp("tls-cluster")
    authority = Authority.make(folder / "ca")
    pair = authority.issue("edge")
    options = ["--tls-cert", str(pair.cert), "--tls-key", str(pair.key)]
    cluster = start_cluster(folder, "cluster.log", "--max-links-per-address", "1", options=options)
    yield cluster, authority
    stop_cluster(cluster)


def verified(authority: Authority, local: str = "127.0.0.1") -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(ssl=authority.client_context(), local_addr=(local, 0))
    return aiohttp.ClientSession(connector=connector)


async def every_route(http: aiohttp.ClientSession, cluster: Cluster) -> dict[str, str]:
    """A route to each node, once HAProxy's checks have brought both in (routes found
    before then would move as the second node joins)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            await routes_to_each_node(http, cluster)
            return await routes_to_each_node(http, cluster)
        except AssertionError:  # a node not in yet: HAProxy answered 503, or one node only
            assert time.monotonic() < deadline, cluster.output()
            await asyncio.sleep(0.5)


async def test_each_node_is_reached_over_verified_tls_with_hsts(
    edge: tuple[Cluster, Authority],
) -> None:
    cluster, authority = edge
    assert (cluster.data / "haproxy.pem").stat().st_mode & 0o077 == 0
    assert "cluster ready: https://127.0.0.1:" in cluster.output()
    async with verified(authority) as http:
        routes = await every_route(http, cluster)
        assert sorted(routes) == [f"node-{i}" for i in range(1, NODES + 1)]
        for node, route in routes.items():
            url = f"wss://127.0.0.1:{cluster.port}/v1/ws?r={route}"
            async with http.ws_connect(url) as ws:
                assert ws._response.headers["X-Served-By"] == node
                assert ws._response.headers["Strict-Transport-Security"] == "max-age=63072000"
                await ws.send_json({"type": "hello", "v": 1, "device": uuid.uuid4().hex * 2})
                assert (await ws.receive_json(timeout=30))["type"] == "welcome"
    for transport in ("ws", "sse"):
        async with Phone(cluster.base, transport=transport, ca_file=authority.ca_file) as phone:
            await talk(phone)


async def test_nodes_count_each_phone_by_its_own_address_through_haproxy(
    edge: tuple[Cluster, Authority],
) -> None:
    """Phones from 127.0.0.2 and 127.0.0.3 each hold their one link on the same node; a
    second link from 127.0.0.2 is refused, whatever X-Forwarded-For it writes."""
    cluster, authority = edge
    async with verified(authority) as http:
        route = (await every_route(http, cluster))["node-1"]
    url = f"wss://127.0.0.1:{cluster.port}/v1/ws?r={route}"
    async with (
        verified(authority, "127.0.0.2") as second,
        verified(authority, "127.0.0.3") as third,
        verified(authority, "127.0.0.2") as forger,
        second.ws_connect(url) as one,
        third.ws_connect(url) as other,
    ):
        for ws in (one, other):
            await ws.send_json({"type": "hello", "v": 1, "device": uuid.uuid4().hex * 2})
            assert (await ws.receive_json(timeout=30))["type"] == "welcome"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await forger.ws_connect(url, headers={"X-Forwarded-For": "203.0.113.9"})
        assert refused.value.status == 429
    node_log = (cluster.data / "logs" / "node-1.log").read_text()
    assert "refused a link from 127.0.0.2: 1 links open from there" in node_log
    assert "203.0.113.9" not in node_log


def test_a_certificate_that_does_not_load_starts_nothing(tmp_path: Path) -> None:
    authority = Authority.make(tmp_path / "ca")
    pair, other = authority.issue("one"), authority.issue("other")
    said = refused(tmp_path, "--tls-cert", str(pair.cert), "--tls-key", str(other.key))
    assert said == f"stillhere cluster: the key in {other.key} is not the key of {pair.cert}\n"
