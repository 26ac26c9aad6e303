"""`/healthz` and `/readyz` over real HTTP, with PostgreSQL reached through a proxy that can
take it off the network and bring it back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from actors.clock import ManualClock
from tests.conftest import Harness
from tests.fakes.cutting_proxy import CuttingProxy


@pytest.fixture
async def proxy(dsn: str) -> AsyncIterator[CuttingProxy]:
    """A TCP proxy in front of the test database's unix socket."""
    parts = urlsplit(dsn)
    socket_dir = parse_qs(parts.query)["host"][0]
    port = parse_qs(parts.query).get("port", ["5432"])[0]
    async with CuttingProxy("", 0, target_socket=f"{socket_dir}/.s.PGSQL.{port}") as running:
        yield running


@pytest.fixture
async def served(
    dsn: str, proxy: CuttingProxy, clock: ManualClock, tmp_path: Path
) -> AsyncIterator[Harness]:
    database = urlsplit(dsn).path
    harness = Harness(f"postgresql://postgres@127.0.0.1:{proxy.port}{database}", clock, tmp_path)
    await harness.start()
    yield harness
    await harness.stop()
    await harness.http.close()


async def probe(harness: Harness, path: str) -> tuple[int, dict[str, Any]]:
    async with harness.http.get(harness.url(path)) as response:
        assert response.content_type == "application/json"
        return response.status, orjson.loads(await response.read())


async def test_ready_while_postgresql_answers_and_alive_throughout(served: Harness) -> None:
    assert await probe(served, "/healthz") == (200, {"status": "alive"})
    status, ready = await probe(served, "/readyz")
    assert (status, ready["status"], ready["database"]) == (200, "ready", "ok")
    assert ready["models"]["chat"].startswith("rehearsal")
    assert ready["models"]["embeddings"] and ready["models"]["analysis"]


@pytest.mark.parametrize("fault", ["refuse", "blackhole"])
async def test_not_ready_while_postgresql_is_unreachable_and_ready_once_it_is_back(
    served: Harness, proxy: CuttingProxy, fault: str
) -> None:
    getattr(proxy, fault)()
    proxy.cut()  # the pool's connections go too

    status, refusal = await probe(served, "/readyz")
    assert (status, refusal["type"], refusal["code"]) == (503, "error", "database_unreachable")
    assert "PostgreSQL did not answer" in refusal["message"]
    assert await probe(served, "/healthz") == (200, {"status": "alive"})

    proxy.allow()  # the pool reconnects by itself: no restart
    status, ready = await probe(served, "/readyz")
    assert (status, ready["status"]) == (200, "ready")
