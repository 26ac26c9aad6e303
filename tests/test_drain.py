"""A node stopped with SIGTERM drains: real `stillhere serve` processes on one PostgreSQL.

It fails /readyz with `draining` and sends new hellos elsewhere (`bye` `moved`, close 4001)
while its people's links stay open for `--drain-notice`; then it closes theirs with `moved`
too, and exits once the conversations are handed over: the next node takes them up with
their history and seq."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.test_restart import Client, ServerProcess, hello

NOTICE = "3s"  # long enough for the refusals below to happen well inside it


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def readyz(http: aiohttp.ClientSession, server: ServerProcess) -> tuple[int, dict[str, Any]]:
    async with http.get(server.base + "/readyz") as answer:
        return answer.status, orjson.loads(await answer.read())


async def closed_with(client: Client) -> tuple[list[dict[str, Any]], int | None]:
    """The frames a link got until it closed, and its close code."""
    frames = []
    async with asyncio.timeout(30):
        while True:
            message = await client.ws.receive()
            if message.type != aiohttp.WSMsgType.TEXT:
                return frames, client.ws.close_code
            frames.append(orjson.loads(message.data))


async def test_sigterm_fails_readyz_and_refuses_hellos_before_handing_over(
    dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    first = ServerProcess(dsn, tmp_path / "data", tmp_path / "a.log")
    await first.start(http, ["--node-id", "node-a", "--drain-notice", NOTICE])
    status, ready = await readyz(http, first)  # a balancer watches: the notice is given
    assert (status, ready["status"], ready["node"]) == (200, "ready", "node-a")
    device = "device-" + uuid.uuid4().hex
    staying, welcome = await hello(http, first, device=device)
    await staying.say("Hello before the stop")
    assert first.proc is not None
    first.proc.send_signal(signal.SIGTERM)

    async with asyncio.timeout(10):
        while (answer := await readyz(http, first))[0] == 200:
            await asyncio.sleep(0.02)
    status, body = answer
    assert (status, body["code"], body["node"]) == (503, "draining", "node-a")
    newcomer = Client(await http.ws_connect(first.base + "/v1/ws"))
    await newcomer.send({"type": "hello", "v": 1, "device": "device-" + uuid.uuid4().hex})
    assert await closed_with(newcomer) == ([{"type": "bye", "reason": "moved"}], 4001)
    async with http.get(
        first.base + "/v1/events", params={"device": "device-" + uuid.uuid4().hex}
    ) as stream:
        assert stream.status == 200
        said = (await stream.text()).strip()
    assert said.endswith('data: {"type":"bye","reason":"moved"}'), said
    async with http.post(
        first.base + "/v1/say", json={"device": device + "-other", "id": "x", "text": "Hi"}
    ) as refused:
        assert refused.status == 503
        assert (await refused.json())["code"] == "unavailable"
    assert not staying.ws.closed  # its people are handed over only after the notice

    frames, code = await closed_with(staying)
    assert (frames[-1], code) == ({"type": "bye", "reason": "moved"}, 4001)
    assert await asyncio.wait_for(first.proc.wait(), 30) == 0
    log = first.log()
    assert "draining: /readyz answers 503" in log
    assert "drained: 1 conversations handed over" in log

    second = ServerProcess(dsn, tmp_path / "data", tmp_path / "b.log")
    await second.start(http, ["--node-id", "node-b"])
    try:
        back, again = await hello(
            http, second, device=device, conversation=welcome["conversation"], last_seq=0
        )
        assert again["resumed"] is True and again["conversation"] == welcome["conversation"]
        assert [t["text"] for t in again["history"] if t["role"] == "user"] == [
            "Hello before the stop"
        ]
        _, end = await back.say("Hello after the stop")
        assert end["seq"] > max(staying.seqs)
    finally:
        await second.kill()


async def test_a_node_nobody_probes_hands_over_without_a_notice(
    dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """No /readyz asked: nothing to tell, so the links close at once (a long notice that
    is not waited out)."""
    server = ServerProcess(dsn, tmp_path / "data", tmp_path / "a.log")
    await server.start(http, ["--node-id", "node-a", "--drain-notice", "60s"])
    client, _ = await hello(http, server, device="device-" + uuid.uuid4().hex)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    frames, code = await closed_with(client)
    assert (frames[-1], code) == ({"type": "bye", "reason": "moved"}, 4001)
    assert await asyncio.wait_for(server.proc.wait(), 30) == 0
    assert "handing 1 conversations over in 0 s" in server.log()
