"""The replay buffer: ended replies' deltas are folded, never lost; replay stays exact.

Protocol v1: a hello with `last_seq` gets every event with a greater seq, in order. The
buffer folds an ended reply's deltas into slices of its `reply.end` text to save memory;
these tests check that a replay from any `last_seq` is still exactly the events emitted
after it (deltas rebuilt equal to what was sent), that the deltas of a reply in progress
stay as they are, and that the hand-over to the events table (real PostgreSQL) at the
buffer's oldest seq leaves no gap and no duplicate, even while saves or reads are slow.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from actors.replay import DeltaRun, ReplayBuffer
from actors.stream import ConversationStream
from storage.event_log import EventLog
from storage.store import Store
from tests.conftest import own

Frame = dict[str, Any]
NON_DELTA = ("ack", "reply.start", "reply.end", "card")


class Numbering:
    """Makes frames the way `ConversationStream.emit` does, for the buffer alone."""

    def __init__(self) -> None:
        self.seq = 0
        self.sent: list[Frame] = []

    def __call__(self, type_: str, **fields: Any) -> Frame:
        self.seq += 1
        frame: Frame = {"type": type_, "seq": self.seq, **fields}
        self.sent.append(frame)
        return frame


Emit = Callable[..., Frame]


def one_turn(emit: Emit, words: int = 5, *, card_at: int | None = None, end: bool = True) -> str:
    """An ack, a reply of `words` deltas (a card and a second ack in the middle if asked),
    and its end; returns the reply id."""
    reply = str(uuid.uuid4())
    emit("ack", id=uuid.uuid4().hex)
    emit("reply.start", reply=reply, in_reply_to=["m"])
    parts = [f"w{i} " for i in range(words)]
    for i, part in enumerate(parts):
        if i == card_at:
            emit("card", card={"id": "c", "text": "Owen arrives Friday"})
            emit("ack", id=uuid.uuid4().hex)  # a say that arrived while it was writing
        emit("reply.delta", reply=reply, text=part)
    if end:
        emit("reply.end", reply=reply, text="".join(parts), interrupted=False)
    return reply


def filled(limit: int, turns: int, **turn: Any) -> tuple[ReplayBuffer, Numbering]:
    buffer, emit = ReplayBuffer(limit), Numbering()
    for _ in range(turns):
        one_turn(emit, **turn)
    for frame in emit.sent:
        buffer.append(frame)
    return buffer, emit


# -- the buffer on its own ---------------------------------------------------------------


def test_replay_from_every_seq_is_exactly_what_was_sent() -> None:
    buffer, emit = filled(10_000, 4, words=6, card_at=3)
    for last_seq in range(emit.seq + 1):
        assert buffer.after(last_seq) == emit.sent[last_seq:]


def test_an_ended_reply_keeps_no_delta_frame_but_counts_every_event() -> None:
    buffer, emit = filled(10_000, 3, words=40)
    entries = list(buffer._entries)
    assert not [e for e in entries if isinstance(e, dict) and e["type"] == "reply.delta"]
    assert len(buffer) == emit.seq == 3 * 43  # `buffered`: every event, folded or not
    assert len(entries) == 3 * 4  # per turn: ack, start, one run, end
    end = entries[3]
    run = entries[2]
    assert isinstance(run, DeltaRun) and run.text is end["text"]  # the text is shared


def test_a_reply_cut_by_other_events_folds_around_them_in_seq_order() -> None:
    buffer, emit = filled(10_000, 1, words=6, card_at=2)
    kinds = [
        e.__class__.__name__ if isinstance(e, DeltaRun) else e["type"] for e in buffer._entries
    ]
    assert kinds == ["ack", "reply.start", "DeltaRun", "card", "ack", "DeltaRun", "reply.end"]
    assert buffer.after(0) == emit.sent


def test_the_reply_in_progress_keeps_its_delta_frames() -> None:
    buffer, emit = ReplayBuffer(10_000), Numbering()
    one_turn(emit, words=4)
    reply = one_turn(emit, words=3, end=False)
    for frame in emit.sent:
        buffer.append(frame)
    tail = list(buffer._entries)[-4:]
    assert [f["type"] for f in tail] == ["reply.start"] + ["reply.delta"] * 3
    assert all(f["reply"] == reply for f in tail)
    assert tail == emit.sent[-4:]  # the very frames that were sent


def test_the_frame_bound_evicts_oldest_first_folded_deltas_one_by_one() -> None:
    buffer, emit = filled(10, 5, words=7)
    assert len(buffer) == 10
    assert buffer.oldest(emit.seq + 1) == emit.seq - 9
    assert buffer.after(0) == emit.sent[-10:]
    assert buffer.after(emit.seq - 3) == emit.sent[-3:]


@pytest.mark.parametrize("through", [0, 1, 5, 20, 22, 43, 60])
def test_a_trim_lets_go_of_everything_a_client_has(through: int) -> None:
    buffer, emit = filled(10_000, 2, words=20)  # seqs 1-23 and 24-46
    buffer.trim(through)
    left = emit.sent[through:]
    assert len(buffer) == len(left) and buffer.after(0) == left
    assert buffer.oldest(emit.seq + 1) == min(through, emit.seq) + 1


@pytest.mark.parametrize("through", [10, 19, 30, 40, 46])
def test_a_trim_after_evictions_and_mid_reply_keeps_every_later_seq(through: int) -> None:
    buffer, emit = filled(30, 2, words=20)  # seqs 17-46 held: a run already cut short
    reply = one_turn(emit, words=3, end=False)  # and a reply in progress, not folded
    for frame in emit.sent[46:]:
        buffer.append(frame)
    buffer.trim(through)
    left = emit.sent[max(through, emit.seq - 30) :]  # the bound held the last 30
    assert buffer.after(0) == left and len(buffer) == len(left)
    assert buffer.after(0)[-1]["reply"] == reply


def test_an_empty_buffer_starts_at_the_next_seq() -> None:
    assert ReplayBuffer(5).oldest(42) == 42


def test_a_reply_longer_than_the_buffer_still_replays_exactly() -> None:
    buffer, emit = filled(8, 1, words=20)  # its start and first deltas are evicted
    assert buffer.after(0) == emit.sent[-8:]
    assert len(buffer) == 8


# -- the stream, with the events table behind it -------------------------------------------


class Recorder:
    """A link that keeps what it is sent."""

    name = "recorder"

    def __init__(self) -> None:
        self.frames: list[Frame] = []

    def send(self, frame: Frame) -> None:
        self.frames.append(frame)

    def flush(self) -> None:
        pass

    def end(self, code: int = 1000) -> None:
        pass


class GatedLog(EventLog):
    """The real event log, its writes held while `gate` is closed."""

    def __init__(self, inner: EventLog, gate: asyncio.Event) -> None:
        super().__init__(inner._pool, inner._space, inner._fenced)
        self.gate = gate

    async def _write(self, entries: Any) -> bool:
        await self.gate.wait()
        return await super()._write(entries)


class Gated(Store):
    """The real store, with saves or reads held until the test opens a gate: a slow
    database, to catch the buffer moving on while it waits."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner._pool)
        self.save_gate = asyncio.Event()
        self.read_gate = asyncio.Event()
        self.save_gate.set()
        self.read_gate.set()
        self.reading = asyncio.Event()
        self.events = GatedLog(self.events, self.save_gate)

    async def events_between(self, conversation: uuid.UUID, after: int, below: int) -> list[Frame]:
        self.reading.set()
        await self.read_gate.wait()
        return await super().events_between(conversation, after, below)


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[Gated]:
    real = await Store.open(dsn)
    yield Gated(real)
    await real.close()


class Tap:
    """Emits on a real stream and keeps what was emitted, for the checks."""

    def __init__(self, stream: ConversationStream) -> None:
        self.stream = stream
        self.base = stream.last_seq  # the seq before the stream's first event
        self.sent: list[Frame] = []

    def __call__(self, type_: str, **fields: Any) -> Frame:
        frame = self.stream.emit(type_, **fields)
        self.sent.append(frame)
        return frame


async def open_stream(
    store: Store, buffer_size: int, sure: Callable[[str], bool] = lambda _: True
) -> tuple[ConversationStream, Tap]:
    person = "person-" + uuid.uuid4().hex
    epoch = await own(store, person)
    conversation = await store.create_conversation(person, datetime.now(UTC), epoch)
    stream = await ConversationStream.open(
        store, conversation, person, epoch=epoch, sure=sure, buffer_size=buffer_size
    )
    return stream, Tap(stream)


async def settle(stream: ConversationStream) -> None:
    """Let the event log write everything emitted so far."""
    await stream.written()


async def attach(stream: ConversationStream, last_seq: int | None) -> tuple[Recorder, int]:
    link = Recorder()
    count = await stream.attach(link, {"type": "welcome"}, last_seq)
    assert link.frames[0]["type"] == "welcome"
    return link, count


def check_replay(frames: list[Frame], sent: list[Frame], last_seq: int) -> None:
    """In seq order, no duplicate, each frame as sent, every turn-level event after
    `last_seq` (what a replay from the events table must carry at least)."""
    seqs = [f["seq"] for f in frames]
    assert seqs == sorted(set(seqs))
    by_seq = {f["seq"]: f for f in sent}
    assert all(f == by_seq[f["seq"]] for f in frames)
    turn_level = [f for f in sent if f["seq"] > last_seq and f["type"] != "reply.delta"]
    assert [f for f in frames if f["type"] != "reply.delta"] == turn_level


async def test_a_replay_reaching_past_the_buffer_reads_the_events_table(store: Gated) -> None:
    stream, emit = await open_stream(store, buffer_size=12)
    for _ in range(4):
        one_turn(emit, words=6, card_at=2)
    await settle(stream)
    oldest = stream.last_seq - 11
    for last_seq in range(emit.base, stream.last_seq + 1):
        link, count = await attach(stream, last_seq)
        replay = link.frames[1:]
        assert count == len(replay)
        check_replay(replay, emit.sent, last_seq)
        # from the buffer's oldest seq on, the replay is whole, deltas included
        held = [f for f in emit.sent if f["seq"] >= oldest and f["seq"] > last_seq]
        assert [f for f in replay if f["seq"] >= oldest] == held
        stream.detach(link)
    await stream.close()


async def test_a_link_back_mid_reply_gets_start_and_every_delta_then_the_live_rest(
    store: Gated,
) -> None:
    stream, emit = await open_stream(store, buffer_size=2000)
    one_turn(emit, words=5)
    reply = one_turn(emit, words=4, end=False)
    seen = stream.last_seq - 3  # the phone got the start and one delta
    link, _ = await attach(stream, seen)
    emit("reply.delta", reply=reply, text="w4 ")
    emit("reply.end", reply=reply, text="w0 w1 w2 w3 w4 ", interrupted=False)
    got = link.frames[1:]
    assert got == [f for f in emit.sent if f["seq"] > seen]
    assert "w0 " + "".join(f["text"] for f in got if f["type"] == "reply.delta") == got[-1]["text"]
    await stream.close()


async def test_a_link_back_after_its_reply_ended_gets_the_missed_deltas_rebuilt(
    store: Gated,
) -> None:
    stream, emit = await open_stream(store, buffer_size=2000)
    one_turn(emit, words=8)
    seen = emit.base + 4  # ack, start and two deltas got through before the tunnel
    link, count = await attach(stream, seen)
    got = link.frames[1:]
    assert count == 7 and got == emit.sent[4:]
    assert "w0 w1 " + "".join(f["text"] for f in got[:-1]) == got[-1]["text"]
    await stream.close()


async def test_events_evicted_before_they_are_written_are_still_replayed(store: Gated) -> None:
    stream, emit = await open_stream(store, buffer_size=5)
    store.save_gate.clear()  # the database is slow: nothing written yet
    for _ in range(3):
        one_turn(emit, words=4)
    link, _ = await attach(stream, emit.base)
    check_replay(link.frames[1:], emit.sent, emit.base)
    store.save_gate.set()
    await stream.close()


async def test_a_read_that_the_buffer_outruns_is_read_again(store: Gated) -> None:
    stream, emit = await open_stream(store, buffer_size=6)
    for _ in range(2):
        one_turn(emit, words=3)
    await settle(stream)
    store.read_gate.clear()
    attaching = asyncio.get_running_loop().create_task(attach(stream, emit.base + 1))
    await store.reading.wait()  # reading below the oldest seq held
    for _ in range(2):  # meanwhile two more turns push the buffer on past that bound
        one_turn(emit, words=3)
    await settle(stream)
    store.read_gate.set()
    link, _ = await attaching
    check_replay(link.frames[1:], emit.sent, emit.base + 1)
    await stream.close()


async def test_buffered_counts_the_events_replayable_without_a_read(store: Gated) -> None:
    stream, emit = await open_stream(store, buffer_size=30)
    one_turn(emit, words=10)
    assert stream.buffered == 13
    for _ in range(3):
        one_turn(emit, words=10)
    assert stream.buffered == 30
    await settle(stream)
    store.read_gate.clear()  # a replay inside the buffer never touches the database
    link, count = await attach(stream, stream.last_seq - 30)
    assert count == 30 and not store.reading.is_set()
    assert link.frames[1:] == emit.sent[-30:]
    await stream.close()


async def test_a_confirmed_stretch_leaves_memory_and_replays_from_the_events_table(
    store: Gated,
) -> None:
    stream, emit = await open_stream(store, buffer_size=2000)
    for _ in range(3):
        one_turn(emit, words=6)
    await settle(stream)
    stream.confirm(emit.base + 9)  # the phone acked the first turn (ack, start, 6, end)
    assert stream.buffered == len(emit.sent) - 9
    store.read_gate.clear()  # from the confirmed seq on, no database read
    link, _ = await attach(stream, emit.base + 9)
    assert link.frames[1:] == emit.sent[9:] and not store.reading.is_set()
    store.read_gate.set()
    stream.detach(link)
    older, _ = await attach(stream, emit.base)  # another device, further back
    check_replay(older.frames[1:], emit.sent, emit.base)  # the first reply whole in its end
    assert older.frames[1:][3:] == emit.sent[9:]  # ack, start, end from the table first
    await stream.close()


async def test_a_hello_with_last_seq_confirms_what_came_before(store: Gated) -> None:
    stream, emit = await open_stream(store, buffer_size=2000)
    for _ in range(2):
        one_turn(emit, words=4)
    link, _ = await attach(stream, emit.base + 7)
    assert stream.buffered == len(emit.sent) - 7
    assert link.frames[1:] == emit.sent[7:]
    await stream.close()


async def test_events_of_an_unsure_lease_are_held_back_then_sent_in_order(store: Gated) -> None:
    """While the node cannot be sure it still owns the person, nothing reaches a link;
    once the lease is confirmed, what was held goes out in order, before anything new."""
    lease = {"sure": True}
    stream, emit = await open_stream(store, 100, lambda _: lease["sure"])
    link, _ = await attach(stream, None)
    emit("ack", id="s1")
    lease["sure"] = False
    held = [emit("reply.start", reply="r"), emit("reply.delta", reply="r", text="Two")]
    assert link.frames[1:] == emit.sent[:1]  # the ack only

    stream.catch_up()  # still unsure: nothing yet
    assert link.frames[1:] == emit.sent[:1]
    lease["sure"] = True
    stream.catch_up()
    after = emit("reply.end", reply="r", text="Two")
    assert link.frames[1:] == [emit.sent[0], *held, after]
    await settle(stream)


async def test_a_link_attached_while_unsure_gets_the_held_events_once(store: Gated) -> None:
    """A phone that resumes while events are held back is replayed what was sent before
    them, not the held ones: those reach it, with every other link, once the lease is
    confirmed. Replayed then and caught up again, they would reach it twice."""
    lease = {"sure": True}
    stream, emit = await open_stream(store, 100, lambda _: lease["sure"])
    emit("ack", id="s1")
    lease["sure"] = False
    held = [emit("reply.start", reply="r"), emit("reply.delta", reply="r", text="Two")]
    link, replayed = await attach(stream, emit.base)
    assert (replayed, link.frames[1:]) == (1, emit.sent[:1])
    assert link.frames[0]["seq"] == emit.sent[0]["seq"]  # the welcome's: the last one sent
    lease["sure"] = True
    stream.catch_up()
    assert link.frames[1:] == [emit.sent[0], *held]
    await settle(stream)
