"""The WebSocket heartbeat: one loop-wide sweep pings the links whose phones have gone
silent, keeps those that answer, and drops those that do not."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import aiohttp
import orjson
import pytest

from tests.conftest import Harness, eventually, loop_turns
from transport import websocket


async def _receive(ws: aiohttp.ClientWebSocketResponse) -> aiohttp.WSMessage:
    """The next message; the server's first sweep comes within its default 5 s."""
    return await asyncio.wait_for(ws.receive(), 15.0)


async def test_a_silent_link_is_pinged_kept_while_it_answers_then_dropped(
    harness: Harness,
) -> None:
    await harness.start()
    harness.server.ping_after, harness.server.pong_within = 0.3, 0.6
    phone = SimpleNamespace(device="device-" + uuid.uuid4().hex)
    ws = await harness.http.ws_connect(harness.url("/v1/ws"), autoping=False)
    await ws.send_str(orjson.dumps({"type": "hello", "v": 1, "device": phone.device}).decode())
    welcome = await _receive(ws)
    assert orjson.loads(welcome.data)["type"] == "welcome"

    for _ in range(3):  # silent: pinged, again and again, while it answers
        ping = await _receive(ws)
        assert ping.type is aiohttp.WSMsgType.PING
        await ws.pong(ping.data)
    assert harness.links(phone) == 1

    ping = await _receive(ws)  # not answered this time: the link is dropped
    assert ping.type is aiohttp.WSMsgType.PING
    gone = await _receive(ws)
    assert gone.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
    await eventually(lambda: harness.links(phone) == 0)


async def test_a_phone_that_talks_is_not_pinged_and_its_pings_are_answered(
    harness: Harness,
) -> None:
    await harness.start()
    harness.server.ping_after, harness.server.pong_within = 1.0, 0.6
    ws = await harness.http.ws_connect(harness.url("/v1/ws"), autoping=False)
    device = "device-" + uuid.uuid4().hex
    await ws.send_str(orjson.dumps({"type": "hello", "v": 1, "device": device}).decode())
    assert orjson.loads((await _receive(ws)).data)["type"] == "welcome"
    for _ in range(30):  # 6 s, a frame every 0.2 s: never silent for `ping_after`
        await ws.ping(b"are you there")
        pong = await _receive(ws)
        assert (pong.type, pong.data) == (aiohttp.WSMsgType.PONG, b"are you there")
        await asyncio.sleep(0.2)
    await ws.close()


async def test_the_sweep_lets_the_loop_run_between_slices_of_links(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 10,000 links one sweep in a piece held the loop for tens of milliseconds, and
    every say arriving meanwhile waited: the sweep yields after every `BEAT_SLICE` links."""
    await harness.start()
    harness.server.ping_after, harness.server.pong_within = 0.2, 0.3
    monkeypatch.setattr(websocket, "BEAT_SLICE", 1, raising=False)
    phones = [await harness.http.ws_connect(harness.url("/v1/ws")) for _ in range(3)]
    for ws in phones:
        device = "device-" + uuid.uuid4().hex
        await ws.send_str(orjson.dumps({"type": "hello", "v": 1, "device": device}).decode())
        assert orjson.loads((await _receive(ws)).data)["type"] == "welcome"
    async with loop_turns() as turns:
        seen: list[int] = []  # the loop's turns at each beat
        beat = websocket.WebSocketLink.beat

        def counted(link: websocket.WebSocketLink, *args: float) -> None:
            seen.append(turns())
            beat(link, *args)

        monkeypatch.setattr(websocket.WebSocketLink, "beat", counted)
        await eventually(lambda: len(seen) >= 3)
    assert len(set(seen[:3])) == 3, f"three links beaten in one go: {seen[:3]}"
    for ws in phones:
        await ws.close()
