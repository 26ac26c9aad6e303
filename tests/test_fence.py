"""The writes a conversation's turn makes besides its says, events and reply (a memory, a
reminder, the speaker, loose ends, a judged merge; the mood rides with the reply,
tests/test_event_log.py) are fenced by the person's owner epoch: under an epoch that is no
longer theirs they change nothing, and the node is told so it lets the person go. Against a
real PostgreSQL, and through two real nodes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from actors.clock import ManualClock
from storage.loose_ends import Noted
from storage.memories import MemoryStore
from storage.owners import Fenced
from storage.records import MemoryDraft
from storage.store import Store
from tests.conftest import Harness, Phone, eventually, own
from tests.fakes.embeddings_server import FakeEmbeddings
from tests.fakes.openai_server import FakeOpenAI, Reply

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
PERSON = "p-fenced"
# Every table a turn's side writes land in.
TABLES = ("reminders", "conversations", "moods", "loose_ends", "cards", "reinforcements")
TABLES += ("memory_links", "turns", "events")


async def rows(db: asyncpg.Connection) -> dict[str, list[asyncpg.Record]]:
    return {t: await db.fetch(f"SELECT * FROM {t} ORDER BY 1") for t in TABLES}


class Setting:
    """One person's conversation and two memories, written under an epoch since lost."""

    def __init__(self, store: Store, memories: MemoryStore) -> None:
        self.store = store
        self.memories = memories
        self.told: list[tuple[str, int]] = []
        store.on_fenced = memories.on_fenced = lambda p, e: self.told.append((p, e))

    async def prepare(self) -> None:
        self.stale = await own(self.store, PERSON)
        self.conversation = await self.store.create_conversation(PERSON, NOW, self.stale)
        self.first, _ = await self.memories.create(PERSON, MemoryDraft("Owen likes tea."), NOW)
        self.second, _ = await self.memories.create(PERSON, MemoryDraft("Owen loves tea."), NOW)
        self.current = await own(self.store, PERSON)  # a new take: `stale` is no longer held


Write = Callable[[Setting, int], Awaitable[Any]]


def _memory_write(name: str) -> Write:
    async def write(s: Setting, epoch: int) -> Any:
        draft = MemoryDraft("Owen drinks tea.")
        if name == "create":
            return await s.memories.create(PERSON, draft, NOW, epoch=epoch)
        if name == "reinforce":
            return await s.memories.reinforce(
                PERSON, s.first.id, tier="exact", score=1.0, said=draft, now=NOW, epoch=epoch
            )
        if name == "link":
            return await s.memories.link(PERSON, s.second.id, s.first.id, "contradicts", NOW, epoch)
        if name == "note":
            return await s.memories.set_recognition(PERSON, s.second.id, "judge: same", epoch)
        absorbed = [(s.second.id, 0.9, "judge")]
        return await s.memories.merge(
            PERSON, s.first.id, absorbed, NOW, decided_by="judge", epoch=epoch
        )

    return write


WRITES: dict[str, Write] = {
    "reminder": lambda s, e: s.store.add_reminder(s.conversation, PERSON, e, "bed", "Thu", NOW),
    "speaker": lambda s, e: s.store.set_speaker(s.conversation, "Owen", NOW, PERSON, e),
    "loose ends": lambda s, e: s.store.loose_ends.settle(
        PERSON, s.conversation, e, NOW, [], [Noted("person", "point", "the bed")]
    ),
    "memory": _memory_write("create"),
    "reinforcement": _memory_write("reinforce"),
    "judged merge": _memory_write("merge"),
    "judged contradiction": _memory_write("link"),
    "judge's note": _memory_write("note"),
}


@pytest.mark.parametrize("name", list(WRITES))
async def test_a_write_under_a_lost_epoch_changes_nothing_and_is_told(
    name: str, store: Store, db: asyncpg.Connection
) -> None:
    setting = Setting(store, MemoryStore(store.pool))
    await setting.prepare()
    before = await rows(db)

    with pytest.raises(Fenced):
        await WRITES[name](setting, setting.stale)

    assert await rows(db) == before
    assert setting.told == [(PERSON, setting.stale)]
    await WRITES[name](setting, setting.current)  # the owner's own write goes through
    assert await rows(db) != before
    assert len(setting.told) == 1


# -- through two nodes -------------------------------------------------------------------


async def _node(name: str, dsn: str, clock: ManualClock, tmp: Path, **urls: str) -> Harness:
    # A lease long enough that no renewal notices the takeover first: the tool's write does.
    return await Harness(dsn, clock, tmp / name).start(node_id=name, lease=60.0, **urls)


async def _stop(*nodes: Harness) -> None:
    for node in nodes:
        await node.stop()
        await node.http.close()


async def _taken_during_the_tool_call(
    node: Harness, phone: Phone, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> tuple[str, dict[str, list[asyncpg.Record]]]:
    """Say something whose answer is a tool call; while the model takes its time, another
    node takes the person behind this one's back. The rows as they were before."""
    await phone.send({"type": "say", "id": "s1", "text": "do it"})
    await eventually(lambda: len(fake_llm.requests) == 1)
    await node.recorded()
    person = node.person(phone)
    before = await rows(db)
    await db.execute(
        "UPDATE owners SET node = 'b', epoch = nextval('owner_epochs') WHERE person = $1", person
    )
    return person, before


def _lost_by_a_side_write(records: list[logging.LogRecord]) -> bool:
    """The node learnt it lost the person from a refused write, before any of its stream
    events or replies was refused: from the tool's (the lease outlasts the test)."""
    said = [r.getMessage() for r in records]
    lost = next((i for i, m in enumerate(said) if "lost: another node owns them" in m), None)
    events = next((i for i, m in enumerate(said) if "refused: another node" in m), len(said))
    return lost is not None and lost < events


TOOL_CALLS = {
    "schedule_reminder": {"text": "get the spare bed out", "when": "on Thursday"},
    "remember": {"text": "Owen arrives Friday evening.", "type": "fact"},
    "set_speaker": {"name": "Owen"},
}


@pytest.mark.parametrize("tool", list(TOOL_CALLS))
async def test_a_tool_of_a_node_that_lost_the_person_writes_nothing_and_lets_them_go(
    tool: str,
    dsn: str,
    clock: ManualClock,
    tmp_path: Path,
    db: asyncpg.Connection,
    fake_llm: FakeOpenAI,
    fake_embeddings: FakeEmbeddings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = await _node("a", dsn, clock, tmp_path, llm_url=fake_llm.url, embed_url=fake_embeddings.url)
    try:
        phone = await a.phone()
        fake_llm.queue(Reply("", tool_calls=[(tool, TOOL_CALLS[tool])], delay=0.15))
        person, before = await _taken_during_the_tool_call(a, phone, fake_llm, db)

        assert (await phone.expect("bye"))["reason"] == "moved"
        await eventually(lambda: a.server.directory.get(person) is None)
        assert await rows(db) == before
        assert not [f for f in phone.frames if f["type"] in ("card", "reminder")]
        assert _lost_by_a_side_write(caplog.records)
        assert await db.fetchval("SELECT node FROM owners WHERE person = $1", person) == "b"
    finally:
        await _stop(a)


async def test_a_reminder_fires_once_across_two_nodes(
    dsn: str,
    clock: ManualClock,
    tmp_path: Path,
    db: asyncpg.Connection,
    fake_llm: FakeOpenAI,
) -> None:
    """Node a lost the person during the tool call: it stores and emits nothing. The phone
    moves to node b, where the reminder is scheduled: one row, one `reminder` event."""
    a = await _node("a", dsn, clock, tmp_path, llm_url=fake_llm.url)
    b = await _node("b", dsn, clock, tmp_path, llm_url=fake_llm.url)
    remind = ("schedule_reminder", TOOL_CALLS["schedule_reminder"])
    try:
        phone = await a.phone()
        fake_llm.queue(Reply("", tool_calls=[remind], delay=0.15))
        await _taken_during_the_tool_call(a, phone, fake_llm, db)
        assert (await phone.expect("bye"))["reason"] == "moved"

        there = await b.phone(phone.device)
        fake_llm.queue(Reply("", tool_calls=[remind]), Reply("Done."))
        await there.say("remind me to get the spare bed out on Thursday", "s2")
        fired = await there.expect("reminder")
        await there.reply()
        await b.recorded()

        assert fired["reminder"]["due"] == "on Thursday"
        assert await db.fetchval("SELECT count(*) FROM reminders") == 1
        events = "SELECT count(*) FROM events WHERE frame->>'type' = 'reminder'"
        assert await db.fetchval(events) == 1
        stored = await db.fetchval("SELECT id FROM reminders")
        assert UUID(fired["reminder"]["id"]) == stored
        assert not [f for f in phone.frames if f["type"] == "reminder"]
        await there.close()
    finally:
        await _stop(a, b)
