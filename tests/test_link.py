"""A phone that stops reading: what it is sent waits for it in the link, not in the socket's
transport, and reaches it in order and exactly once when it reads again."""

from __future__ import annotations

import asyncio
import gc
import socket
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from actors.stream import ConversationStream
from providers.event_loop import run
from storage.store import Store
from tests.conftest import Harness, Phone, eventually, own
from tests.sse_client import SseClient
from transport.config import Limits
from transport.link import BACKLOG_BYTES, QueuedLink
from transport.session import Session
from transport.websocket import WebSocketLink
from transport.ws_wire import WebSocketWire

FRAMES = 60
TEXT = "x" * 20_000  # 60 frames of 20 KB: far more than the socket's buffers hold
BIG_BUFFER = 8 << 20  # a link buffer that holds them all: these phones are slow, not gone


def _send_buffer(link: QueuedLink, size: int) -> None:
    assert link.transport is not None
    link.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


def _stall(client_transport: Any, link: QueuedLink) -> None:
    """The phone stops reading; a small send buffer makes the backlog show sooner."""
    client_transport.pause_reading()
    _send_buffer(link, 4096)


def _unstall(client_transport: Any, link: QueuedLink) -> None:
    """The phone reads again (a send buffer left small would trickle the backlog out)."""
    _send_buffer(link, 1 << 20)
    client_transport.resume_reading()


def _only_link(harness: Harness, person: str) -> QueuedLink:
    live = harness.server.directory.get(person)
    assert live is not None and len(live.stream.links) == 1
    (link,) = live.stream.links
    assert isinstance(link, QueuedLink)
    return link


async def _flood(harness: Harness, person: str, link: QueuedLink) -> list[int]:
    """Emit FRAMES big deltas: most of them wait in the link, not in the transport (which
    takes frames until its backlog is full, then what aiohttp lets the writer task put there
    before it waits for the phone)."""
    live = harness.server.directory.get(person)
    assert live is not None and link.transport is not None
    seqs = []
    for _ in range(FRAMES):
        seqs.append(live.stream.emit("reply.delta", reply="r", text=TEXT)["seq"])
        assert link.transport.get_write_buffer_size() < FRAMES * len(TEXT) // 2
        await asyncio.sleep(0)
    return seqs


async def _more(harness: Harness, person: str) -> list[int]:
    """Emit FRAMES more while the backlog drains: they must not overtake it."""
    live = harness.server.directory.get(person)
    assert live is not None
    seqs = []
    for _ in range(FRAMES):
        seqs.append(live.stream.emit("reply.delta", reply="r", text=TEXT)["seq"])
        await asyncio.sleep(0.001)
    return seqs


async def phone_and_link(harness: Harness) -> tuple[Phone, QueuedLink, Any]:
    """A new phone, its link on the server, and its own (client) transport."""
    phone = await harness.phone()
    link = _only_link(harness, harness.person(phone))
    assert phone.ws is not None
    return phone, link, phone.ws._response.connection.transport  # type: ignore[union-attr]


async def test_a_websocket_phone_that_stops_reading_gets_everything_later(
    harness: Harness,
) -> None:
    await harness.start(limits=Limits(link_buffer=BIG_BUFFER))
    phone, link, client_transport = await phone_and_link(harness)
    person = harness.person(phone)
    _stall(client_transport, link)
    seqs = await _flood(harness, person, link)
    _unstall(client_transport, link)
    seqs += await _more(harness, person)
    await eventually(lambda: sum(f["type"] == "reply.delta" for f in phone.frames) == 2 * FRAMES)
    deltas = [f for f in phone.frames if f["type"] == "reply.delta"]
    assert [f["seq"] for f in deltas] == seqs == list(range(seqs[0], seqs[0] + 2 * FRAMES))
    assert all(f["text"] == TEXT for f in deltas)


async def test_frames_of_every_length_reach_a_websocket_phone_whole(harness: Harness) -> None:
    """One frame per length class of a WebSocket header: under 126 bytes, under 64 KiB, and
    above it (an 8-byte length)."""
    await harness.start(limits=Limits(link_buffer=BIG_BUFFER))
    phone = await harness.phone()
    live = harness.server.directory.get(harness.person(phone))
    assert live is not None
    texts = ["hi", "y" * 300, "z" * 70_000]
    for text in texts:
        live.stream.emit("reply.delta", reply="r", text=text)
    assert [(await phone.expect("reply.delta"))["text"] for _ in texts] == texts


async def test_an_event_stream_phone_that_stops_reading_gets_everything_later(
    harness: Harness,
) -> None:
    await harness.start(limits=Limits(link_buffer=BIG_BUFFER))
    client = SseClient(harness.http, harness.url)
    stream = await client.open()
    await stream.expect("welcome")
    person = harness.server.identity.person(device=client.secret)
    link = _only_link(harness, person)
    assert stream.response.connection is not None
    client_transport = stream.response.connection.transport
    _stall(client_transport, link)
    seqs = await _flood(harness, person, link)
    _unstall(client_transport, link)
    seqs += await _more(harness, person)
    deltas = [await stream.expect("reply.delta") for _ in range(2 * FRAMES)]
    assert [e.seq for e in deltas] == seqs == list(range(seqs[0], seqs[0] + 2 * FRAMES))
    assert all(e.data["text"] == TEXT for e in deltas)
    await stream.close()


class ScriptedLink(QueuedLink):
    """A link whose phone keeps up or not on command, and whose waiting writes wait for the
    test: to pin down the order of frames across the two ways out."""

    kind = "scripted"

    def __init__(self) -> None:
        super().__init__(None, BIG_BUFFER)
        self.keeping_up = True
        self.released = asyncio.Event()
        self.wire: list[int] = []
        self.writes = 0  # how many writes carried them

    def encode(self, frame: dict[str, Any]) -> bytes:
        return orjson.dumps(frame)

    def write_now(self, frames: list[bytes]) -> bool:
        if self.keeping_up:
            self.wire += [orjson.loads(f)["seq"] for f in frames]
            self.writes += 1
        return self.keeping_up

    async def write(self, frames: list[bytes]) -> None:
        await self.released.wait()
        self.wire += [orjson.loads(f)["seq"] for f in frames]
        self.writes += 1

    async def close(self, code: int) -> None:
        pass

    def closing_bytes(self, code: int) -> bytes:
        return b""


async def test_frames_of_one_loop_step_leave_in_one_write_at_its_end() -> None:
    link = ScriptedLink()
    link.send({"seq": 1})
    link.send({"seq": 2})
    assert link.wire == []  # held to the step's end
    await asyncio.sleep(0)
    assert (link.wire, link.writes) == ([1, 2], 1)
    link.send({"seq": 3})
    await asyncio.sleep(0)
    assert (link.wire, link.writes) == ([1, 2, 3], 2)


async def test_a_say_s_ack_and_its_reply_s_start_leave_in_one_write(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A say the conversation was idle for: its reply starts in the step that acks it, so
    the phone gets both in one write (one system call and one packet, not one each)."""
    await harness.start()
    writes: list[list[str]] = []
    write_now = WebSocketLink.write_now

    def recorded(link: WebSocketLink, frames: list[bytes]) -> bool:
        written = write_now(link, frames)
        if written:
            writes.append([orjson.loads(frame)["type"] for frame in frames])
        return written

    monkeypatch.setattr(WebSocketLink, "write_now", recorded)
    phone = await harness.phone()
    for text in ("Hello there.", "And again."):
        writes.clear()
        await phone.say(text)
        await phone.reply()
        acked = [write for write in writes if "ack" in write]
        assert acked == [["ack", "reply.start"]]


async def test_a_welcome_leaves_at_once_and_live_events_at_the_step_end(store: Store) -> None:
    person = "person-" + uuid.uuid4().hex
    epoch = await own(store, person)
    conversation = await store.create_conversation(person, datetime.now(UTC), epoch)
    stream = await ConversationStream.open(
        store, conversation, person, epoch=epoch, sure=lambda _: True
    )
    link = ScriptedLink()
    await stream.attach(link, {"type": "welcome"}, None)
    assert link.wire == [stream.last_seq]  # a resume is timed to it: no waiting
    start = stream.emit("reply.start", reply="r", in_reply_to=[])
    assert link.wire == [start["seq"] - 1]
    await asyncio.sleep(0)
    assert link.wire == [start["seq"] - 1, start["seq"]]
    await stream.close()


async def test_a_frame_never_overtakes_those_waiting_before_it() -> None:
    link = ScriptedLink()
    link.keeping_up = False
    link.send({"seq": 1})
    for _ in range(2):
        await asyncio.sleep(0)  # cannot go at once: a writer takes it and waits on the phone
    link.keeping_up = True
    link.send({"seq": 2})  # could go at once, but 1 waits: queued behind it
    await asyncio.sleep(0)
    assert link.wire == []
    link.released.set()
    link.send({"seq": 3})
    await link.drain()
    assert link.wire == [1, 2, 3]


async def test_a_link_holds_a_writer_task_only_while_a_write_must_wait() -> None:
    before = len(asyncio.all_tasks())
    link = ScriptedLink()
    link.send({"seq": 1})
    await asyncio.sleep(0)  # straight out at the step's end: no task
    assert link.wire == [1] and len(asyncio.all_tasks()) == before
    link.keeping_up = False
    link.send({"seq": 2})
    await asyncio.sleep(0)  # must wait: a writer
    assert len(asyncio.all_tasks()) == before + 1
    link.keeping_up = True
    link.released.set()
    for _ in range(3):
        await asyncio.sleep(0)  # the writer sends 2 and, the queue empty, ends
    assert link.wire == [1, 2]
    assert len(asyncio.all_tasks()) == before
    link.send({"seq": 3})
    await asyncio.sleep(0)
    assert link.wire == [1, 2, 3]


class GoneLink(ScriptedLink):
    """Its phone is gone: every write that must wait fails."""

    closes = 0

    async def write(self, frames: list[bytes]) -> None:
        raise ConnectionError("reset by peer")

    async def close(self, code: int) -> None:
        self.closes += 1


async def test_a_link_found_gone_takes_no_more_frames() -> None:
    link = GoneLink()
    link.keeping_up = False
    link.send({"seq": 1})
    for _ in range(3):
        await asyncio.sleep(0)  # the writer's write fails: the link is gone
    before = len(asyncio.all_tasks())
    link.keeping_up = True
    link.send({"seq": 2})  # dropped, not written, no writer started for it
    assert len(asyncio.all_tasks()) == before and link.wire == []
    await link.drain()
    assert link.closes == 0, "a link already gone is not closed again"


class RawLink(QueuedLink):
    """Writes raw bytes: straight into the transport when it can, else by the writer."""

    kind = "raw"
    waited = 0

    def encode(self, frame: dict[str, Any]) -> bytes:
        return frame["bytes"]

    def write_now(self, frames: list[bytes]) -> bool:
        transport = self._ready_transport()
        if transport is None:
            return False
        transport.write(b"".join(frames))
        return True

    async def write(self, frames: list[bytes]) -> None:
        self.waited += 1
        assert self.transport is not None
        self._in_socket(sum(map(len, frames)))
        self.transport.write(b"".join(frames))  # type: ignore[attr-defined]

    async def close(self, code: int) -> None:
        pass

    def closing_bytes(self, code: int) -> bytes:
        return b""


class HeldTransport:
    """A socket's transport whose phone reads only when the test says so: it holds all
    that was written to it, less what the test lets the phone read."""

    def __init__(self, held: int) -> None:
        self.held = held

    def write(self, data: bytes) -> None:
        self.held += len(data)

    def get_write_buffer_size(self) -> int:
        return self.held

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class BehindLink(RawLink):
    """A link whose phone is behind: frames of `{"size": n}` bytes go into a HeldTransport,
    holding `held` bytes to begin with, and a write that must wait waits for `read` (set
    once for each)."""

    def __init__(self, held: int, limit: int) -> None:
        self.socket = HeldTransport(held)
        super().__init__(self.socket, limit)  # type: ignore[arg-type]
        self.read = asyncio.Event()

    def encode(self, frame: dict[str, Any]) -> bytes:
        return b"x" * frame["size"]

    async def write(self, frames: list[bytes]) -> None:
        await super().write(frames)
        await self.read.wait()
        self.read.clear()


LINK_LIMIT = 150_000
BEHIND = BACKLOG_BYTES + 1000  # more than the socket may hold for a write at once


async def test_a_batch_waiting_for_the_phone_is_counted_once() -> None:
    """The writer's batch, in the socket's buffer while it waits for the phone, is counted
    there only: a link holding just under its limit is not cut (it was counted twice)."""
    link = BehindLink(BEHIND, LINK_LIMIT)
    link.send({"size": 1_000})
    await eventually(lambda: link.socket.held == BEHIND + 1_000)  # the writer waits
    link.send({"size": 40_000})  # queued behind it
    link.read.set()  # the first write ends; the phone has read nothing: the next one waits
    await eventually(lambda: link.socket.held == BEHIND + 41_000)
    link.send({"size": 10_000})  # 117,536 bytes held in all
    assert (link.held(), link._dropped) == (BEHIND + 51_000, False)
    link.socket.held = 20_000  # the phone reads
    link.read.set()
    await link.drain()
    assert (link.socket.held, link._dropped) == (30_000, False)


async def test_a_batch_written_straight_into_the_socket_is_counted_once() -> None:
    """Once the phone has read, the writer's next batch goes straight into the socket's
    buffer and is counted there only (it was counted twice: the link was cut)."""
    link = BehindLink(BEHIND, LINK_LIMIT)
    link.send({"size": 1_000})
    await eventually(lambda: link.socket.held == BEHIND + 1_000)  # the writer waits
    link.send({"size": 62_000})  # 129,536 held
    link.socket.held = 30_000  # the phone reads: the next batch may go at once
    link.read.set()
    await link.drain()
    assert (link.socket.held, link._dropped) == (92_000, False)


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_frames_go_straight_out_on_either_loop(kind: str) -> None:
    """The direct path must work on the loop the server runs on (uvloop's transports are
    not registered as `asyncio.WriteTransport`), not only on the tests' asyncio loop."""

    async def exchange() -> tuple[bytes, int]:
        received: asyncio.Queue[bytes] = asyncio.Queue()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.put_nowait(await reader.readexactly(5))
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        link = RawLink(writer.transport, BIG_BUFFER)
        link.send({"bytes": b"hello"})
        got = await received.get()
        await link.drain()
        writer.close()
        server.close()
        await server.wait_closed()
        return got, link.waited

    assert run(exchange(), kind) == (b"hello", 0)


async def test_a_dropped_websocket_link_is_freed_without_the_collector(harness: Harness) -> None:
    """A phone in a tunnel: the server's close goes into a dead socket and fails. Nothing of
    the link may be left in reference cycles, which only a collection (the loop stopped)
    would free: with the collector off, the link is gone as soon as its connection is."""
    await harness.start()
    phone = await harness.phone()
    await phone.say("Into the tunnel.")
    await phone.reply()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await phone.drop()
        await eventually(lambda: not harness.server.links)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, WebSocketLink | WebSocketWire | Session)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
