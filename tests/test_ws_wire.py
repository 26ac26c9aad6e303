"""The WebSocket wire after the handshake (transport/ws_wire.py), spoken to byte by byte:
what RFC 6455 allows a phone is read, what it forbids fails the connection with its close
code and leaves what is stored untouched, and an open link is no longer aiohttp's."""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import uuid
from typing import Any

import orjson
import pytest
from yarl import URL

from tests.conftest import Harness, eventually
from tests.test_db_faults import stored_says
from transport.config import Limits

TEXT, BINARY, CONTINUATION, CLOSE, PING, PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA


def frame(opcode: int, payload: bytes, *, fin: bool = True, masked: bool = True) -> bytes:
    """A frame as a phone sends it (RFC 6455 5.2), masked unless told otherwise."""
    first = (0x80 if fin else 0) | opcode
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", first, (0x80 if masked else 0) | size)
    else:
        head = struct.pack("!BBQ", first, (0x80 if masked else 0) | 127, size)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class RawPhone:
    """A WebSocket client with no library in between: the handshake by hand, then frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.device = "device-" + uuid.uuid4().hex

    @classmethod
    async def connect(cls, harness: Harness, **headers: str) -> tuple[RawPhone, bytes]:
        """The phone and the server's answer to its upgrade, up to the blank line."""
        url = URL(harness.url("/v1/ws"))
        reader, writer = await asyncio.open_connection(url.host, url.port)
        sent = {
            "Host": f"{url.host}:{url.port}",
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
            "Sec-WebSocket-Version": "13",
            **headers,
        }
        lines = "".join(f"{name}: {value}\r\n" for name, value in sent.items() if value)
        writer.write(f"GET /v1/ws HTTP/1.1\r\n{lines}\r\n".encode())
        return cls(reader, writer), await reader.readuntil(b"\r\n\r\n")

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))

    def send_json(self, value: dict[str, Any]) -> None:
        self.send(frame(TEXT, orjson.dumps(value)))

    async def receive(self) -> tuple[int, bytes]:
        """The server's next frame: opcode and payload (a server's are unmasked, whole)."""
        first, second = await self.reader.readexactly(2)
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif size == 127:
            (size,) = struct.unpack("!Q", await self.reader.readexactly(8))
        return first & 0x0F, await self.reader.readexactly(size)

    async def expect(self, kind: str) -> dict[str, Any]:
        """The next protocol frame of type `kind`, skipping others."""
        while True:
            opcode, payload = await asyncio.wait_for(self.receive(), 10)
            assert opcode == TEXT, (opcode, payload)
            if (decoded := orjson.loads(payload))["type"] == kind:
                return decoded

    async def closed_with(self) -> int:
        """The code of the server's close frame, once the server has also closed the
        connection; frames before the close are skipped."""
        while (received := await asyncio.wait_for(self.receive(), 10))[0] != CLOSE:
            pass
        assert await asyncio.wait_for(self.reader.read(), 10) == b""  # the socket, closed
        return int.from_bytes(received[1][:2])

    async def hello(self) -> dict[str, Any]:
        self.send_json({"type": "hello", "v": 1, "device": self.device})
        return await self.expect("welcome")


async def test_a_message_sent_in_fragments_with_a_ping_between_is_read_whole(
    harness: Harness,
) -> None:
    await harness.start()
    phone, answer = await RawPhone.connect(harness)
    assert answer.startswith(b"HTTP/1.1 101")
    hello = orjson.dumps({"type": "hello", "v": 1, "device": phone.device})
    phone.send(
        frame(TEXT, hello[:10], fin=False),
        frame(PING, b"still there?"),  # a control frame may come between fragments
        frame(CONTINUATION, hello[10:20], fin=False),
        frame(CONTINUATION, hello[20:]),
    )
    assert await phone.receive() == (PONG, b"still there?")
    assert (await phone.expect("welcome"))["resumed"] is False

    say = orjson.dumps({"type": "say", "id": "s1", "text": "Hello there."})
    phone.send(frame(BINARY, say[:5], fin=False), frame(CONTINUATION, say[5:]))
    assert (await phone.expect("ack"))["id"] == "s1"
    await phone.expect("reply.end")


FORBIDDEN = [
    ("unmasked", frame(TEXT, b'{"type": "ping"}', masked=False), 1002),
    ("reserved bit", bytes([0xC1]) + frame(TEXT, b"{}")[1:], 1002),
    ("unknown opcode", frame(0x3, b"{}"), 1002),
    ("continuation of nothing", frame(CONTINUATION, b"{}"), 1002),
    ("new message mid-message", frame(TEXT, b"{", fin=False) + frame(TEXT, b"{}"), 1002),
    ("fragmented control frame", frame(PING, b"x", fin=False), 1002),
    ("control frame over 125 bytes", frame(PING, b"x" * 126), 1002),
    ("close frame of one byte", frame(CLOSE, b"\x03"), 1002),
    ("close code never sent", frame(CLOSE, struct.pack("!H", 1005)), 1002),
    ("text not UTF-8", frame(TEXT, b'{"type": "ping", "x": "\xff"}'), 1007),
    ("message over 4 x max-frame-bytes", frame(BINARY, b" " * 4001), 1009),
    (
        "fragments over 4 x max-frame-bytes",
        frame(TEXT, b" " * 3000, fin=False) + frame(CONTINUATION, b" " * 1500),
        1009,
    ),
]


@pytest.mark.parametrize(
    ("sent", "code"),
    [(sent, code) for _, sent, code in FORBIDDEN],
    ids=[name for name, _, _ in FORBIDDEN],
)
async def test_a_frame_the_protocol_forbids_fails_the_connection_with_its_code(
    harness: Harness, sent: bytes, code: int
) -> None:
    await harness.start(limits=Limits(max_frame_bytes=1000))
    phone, _ = await RawPhone.connect(harness)
    await phone.hello()
    phone.send_json({"type": "say", "id": "s1", "text": "Stored before the bad frame."})
    await phone.expect("reply.end")

    phone.send(sent, frame(TEXT, orjson.dumps({"type": "say", "id": "s2", "text": "Not read."})))
    assert await phone.closed_with() == code
    await eventually(lambda: harness.links(phone) == 0)

    again = await harness.phone(phone.device)  # the conversation goes on, as it was
    assert [turn["text"] for turn in again.welcome["history"]][:1] == [
        "Stored before the bad frame."
    ]
    await harness.recorded()
    assert await stored_says(harness.dsn) == ["s1"]


@pytest.mark.parametrize(
    ("sent", "echoed"), [(struct.pack("!H", 4000) + b"bye", 4000), (b"", 1000)]
)
async def test_a_phones_close_is_answered_with_its_code_and_ends_the_link(
    harness: Harness, sent: bytes, echoed: int
) -> None:
    await harness.start()
    phone, _ = await RawPhone.connect(harness)
    await phone.hello()
    assert harness.links(phone) == 1
    phone.send(frame(CLOSE, sent))
    assert await phone.closed_with() == echoed
    await eventually(lambda: harness.links(phone) == 0)


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"Sec-WebSocket-Key": ""}, "Sec-WebSocket-Key must be 16 bytes in base64"),
        ({"Sec-WebSocket-Key": "c2hvcnQ="}, "Sec-WebSocket-Key must be 16 bytes in base64"),
        ({"Sec-WebSocket-Version": "8"}, "unsupported WebSocket version '8'"),
        ({"Upgrade": "h2c"}, 'can "Upgrade" only to "websocket"'),
    ],
)
async def test_an_upgrade_the_server_cannot_accept_is_refused_with_400(
    harness: Harness, headers: dict[str, str], reason: str
) -> None:
    await harness.start()
    phone, answer = await RawPhone.connect(harness, **headers)
    assert answer.startswith(b"HTTP/1.1 400")
    length = next(
        int(line.split(b":")[1]) for line in answer.split(b"\r\n") if b"Content-Length" in line
    )
    body = orjson.loads(await asyncio.wait_for(phone.reader.readexactly(length), 10))
    assert (body["code"], body["message"]) == ("bad_request", reason)
    assert not harness.server.links


async def test_an_open_link_holds_no_aiohttp_connection_and_no_task(harness: Harness) -> None:
    """Taken over: aiohttp forgets the connection, and an idle link runs no task."""
    await harness.start()
    assert harness.test_server is not None and harness.test_server.runner.server is not None
    aiohttp_server = harness.test_server.runner.server
    before = len(asyncio.all_tasks())
    phones = [(await RawPhone.connect(harness))[0] for _ in range(5)]
    for phone in phones:
        await phone.hello()
    assert len(harness.server.links) == 5
    await eventually(lambda: not aiohttp_server.connections)
    await eventually(lambda: len(asyncio.all_tasks()) <= before)  # a hello's own are done

    phones[0].send_json({"type": "leave"})  # and each still ends as a link does
    await phones[0].expect("bye")
    assert await phones[0].closed_with() == 1000
    await eventually(lambda: len(harness.server.links) == 4)
