"""Clients that misbehave: a phone that stops reading, links that never say hello, a
slowloris HTTP client, too many links from one address or of one person. Each is cut off
with a code; the conversation and everyone else go on."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from tests.conftest import Harness, eventually
from tests.test_link import TEXT, _stall, _unstall, phone_and_link
from transport import protocol, server
from transport.config import Limits

LIMIT = 256 * 1024


async def test_a_phone_that_stops_reading_is_cut_off_and_nothing_else_is(
    harness: Harness,
) -> None:
    await harness.start(limits=Limits(link_buffer=LIMIT))
    stalled, slow, client_transport = await phone_and_link(harness)
    person = harness.person(stalled)
    reading = await harness.phone(stalled.device)  # the same person's other phone
    other = await harness.phone()  # someone else
    _stall(client_transport, slow)
    live = harness.server.directory.get(person)
    assert live is not None
    seqs, most = [], 0
    while not slow._dropped:  # type: ignore[attr-defined]
        seqs.append(live.stream.emit("reply.delta", reply="r", text=TEXT)["seq"])
        most = max(most, slow.held())
        await asyncio.sleep(0)
    assert most <= LIMIT + len(TEXT) + 100  # never more than the limit and one frame

    _unstall(client_transport, slow)  # it reads again within the grace: gets the close code
    await eventually(lambda: stalled.ws is not None and stalled.ws.closed)
    assert stalled.ws.close_code == 4503
    await eventually(lambda: harness.links(reading) == 1)
    deltas = lambda: [f["seq"] for f in reading.frames if f["type"] == "reply.delta"]  # noqa: E731
    await eventually(lambda: len(deltas()) == len(seqs))
    assert deltas() == seqs  # the same person's reading phone got every one, in order
    await reading.say("Are you still there?")  # the conversation goes on
    assert (await reading.reply())["text"]
    back = await harness.phone(stalled.device, conversation=str(live.id))
    assert back.welcome["conversation"] == str(live.id)
    await other.say("And me?")
    assert (await other.reply())["text"]
    for phone in (reading, other, back):
        await phone.close()


async def _first_and_close(
    harness: Harness, *frames: dict[str, object]
) -> tuple[list[str], int | None]:
    """Open a WebSocket, send `frames` (a tenth of a second apart), and read until the
    server closes it: what it answered (error codes, else types) and its close code."""
    codes = []
    async with harness.http.ws_connect(harness.url("/v1/ws")) as ws:
        for frame in frames:
            await ws.send_str(orjson.dumps(frame).decode())
            await asyncio.sleep(0.1)
        async for message in ws:
            frame = orjson.loads(message.data)
            codes.append(frame.get("code", frame["type"]))
        return codes, ws.close_code


async def test_a_link_that_never_says_hello_or_says_it_too_slowly_is_closed(
    harness: Harness,
) -> None:
    await harness.start(limits=Limits(hello_timeout=0.5))
    assert await _first_and_close(harness) == (["hello_timeout"], 4408)
    wrong = {"type": "hello", "v": 2, "device": "d" * 30}  # hellos that never succeed
    ping = {"type": "ping"}
    codes, closed = await _first_and_close(harness, wrong, ping, wrong)  # for 0.3 s
    assert codes == ["unsupported_version", "pong", "unsupported_version", "hello_timeout"]
    assert closed == 4408
    phone = await harness.phone()  # one that says hello in time stays
    await asyncio.sleep(0.7)
    await phone.send({"type": "ping"})
    await phone.expect("pong")
    assert phone.ws is not None and not phone.ws.closed
    await phone.close()


class _Clock:
    """`time` for transport.protocol's token buckets: seconds pass when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


async def _refused(harness: Harness, path: str) -> tuple[int, str]:
    """A link asked for on `path` (a WebSocket upgrade or an event stream): its status and
    code, when it is refused."""
    device = {"X-Stillhere-Device": "d" * 30}
    async with harness.http.get(harness.url(path), headers=device) as response:
        return response.status, (await response.json())["code"]


async def test_links_over_the_limit_of_an_address_are_refused_with_a_code(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "REFUSAL_DELAY_S", 0.01)
    await harness.start(limits=Limits(max_links_per_address=2))
    first, second = await harness.phone(), await harness.phone()
    for path in ("/v1/ws", "/v1/events"):
        assert await _refused(harness, path) == (429, "too_many_links")
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await harness.phone()
    assert refused.value.status == 429
    await first.close()
    await eventually(lambda: sum(harness.server.address_links.values()) == 1)
    third = await harness.phone()  # room again
    await third.say("Made it")
    await third.reply()
    for phone in (second, third):
        await phone.close()


async def test_an_address_opening_links_too_fast_is_refused_with_a_code(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "REFUSAL_DELAY_S", 0.01)
    clock = _Clock()
    monkeypatch.setattr(protocol, "time", clock)
    limits = Limits(links_per_s_per_address=2.0, link_burst_per_address=3)
    await harness.start(limits=limits)
    phones = [await harness.phone() for _ in range(2)]
    await phones[0].close()  # a closed link does not give its opening back
    async with harness.http.get(harness.url("/v1/events"), params={"device": "e" * 30}):
        pass  # an event stream is a link too: the third of the burst
    for path in ("/v1/ws", "/v1/events"):
        assert await _refused(harness, path) == (429, "too_many_links")
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await harness.phone()
    assert refused.value.status == 429
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))  # another address
    async with (
        aiohttp.ClientSession(connector=connector) as elsewhere,
        elsewhere.ws_connect(harness.url("/v1/ws")) as ws,
    ):
        await ws.send_json({"type": "hello", "v": 1, "device": "f" * 30})
        assert (await ws.receive_json())["type"] == "welcome"
    clock.now += 0.5  # one new link a half second
    again = await harness.phone()
    await again.say("Made it")
    await again.reply()
    assert await _refused(harness, "/v1/ws") == (429, "too_many_links")
    for phone in (phones[1], again):
        await phone.close()


async def test_a_person_over_the_link_limit_loses_the_oldest_link(harness: Harness) -> None:
    await harness.start(limits=Limits(max_links_per_person=2))
    oldest = await harness.phone()
    middle = await harness.phone(oldest.device)
    other = await harness.phone()  # another person's links do not count
    newest = await harness.phone(oldest.device)
    assert (await oldest.expect("error"))["code"] == "too_many_links"
    await eventually(lambda: oldest.ws is not None and oldest.ws.closed)
    assert oldest.ws is not None and oldest.ws.close_code == 4429
    assert harness.links(newest) == 2
    await newest.say("Still talking")
    await newest.reply()
    await middle.expect("reply.end")  # the other link still gets everything
    for phone in (middle, other, newest):
        await phone.close()


async def test_a_slowloris_client_is_closed_and_holds_nobody_up(harness: Harness) -> None:
    await harness.start(limits=Limits(http_idle_timeout=0.5))
    assert harness.test_server is not None
    host, port = harness.test_server.host, harness.test_server.port

    async def trickle() -> bool:
        """Send a request's headers a line at a time, forever; True once the server
        closes the connection (before 100 lines)."""
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /v1/threads HTTP/1.1\r\nHost: stillhere\r\n")
        try:
            for line in range(100):
                writer.write(b"X-Slow-%d: still typing\r\n" % line)
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(1024), timeout=0.1) == b"":
                        return True
                except TimeoutError:
                    continue
            return False
        except ConnectionError:
            return True
        finally:
            writer.close()

    slow = [asyncio.ensure_future(trickle()) for _ in range(50)]
    async with harness.http.get(harness.url("/metrics")) as response:  # answered meanwhile
        assert response.status == 200
    phone = await harness.phone()
    await phone.say("Anyone home?")
    await phone.reply()
    assert await asyncio.gather(*slow) == [True] * 50
    await phone.close()
