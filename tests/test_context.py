"""The context handed to the model before every turn (docs/context.md), end to end: a real
server on a real PostgreSQL, a fake model over HTTP that records what it was handed.

"What were we talking about last time?" must get the last exchanges word for word with
their age, after a leave and after the idle sweep; a neighbour's conversations never
appear; each source failing or late still yields the others; muted memories and duplicated
summaries never appear; the budget holds and the order is deterministic.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest

from actors import context
from actors.clock import ManualClock
from actors.context import RECALL_INSTRUCTION, relative_age
from actors.prompt import SYSTEM
from tests.conftest import Harness, Phone
from tests.fakes.embeddings_server import FakeEmbeddings
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.memory_support import MODEL

ASKED = "Can you make me a list for the weekend?"
ANSWERED = "There, I've noted all of that."
SUMMARY = "Weekend in Sicily with Claire, dates to confirm."
QUESTION = "What were we talking about last time?"
# Far from every other memory's length: an unfingerprinted memory of a similar length
# would be taken for a restatement of it (the recognition's verbatim tier).
TENT = "Claire brings the big green tent and both camping stoves on Saturday."


async def start(
    harness: Harness, fake_llm: FakeOpenAI, fake_embeddings: FakeEmbeddings, **kw: Any
) -> None:
    await harness.start(
        llm_url=fake_llm.url, embed_url=fake_embeddings.url, embed_model=MODEL, **kw
    )


def handed_context(fake_llm: FakeOpenAI, index: int = -1) -> str:
    """The context of a model call: the first system message after the fixed instructions
    and a blank line ("" if there was none)."""
    first = fake_llm.requests[index]["messages"][0]["content"]
    _, _, handed = first.partition(SYSTEM + "\n\n")
    return handed


def turn_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "handing the model" in r.getMessage()]


async def talk_then(harness: Harness, fake_llm: FakeOpenAI, device: str | None = None) -> Phone:
    """A first conversation: one exchange, answered by the fake model."""
    phone = await harness.phone(device)
    fake_llm.queue(Reply(ANSWERED))
    await phone.say(ASKED)
    await phone.reply()
    return phone


async def leave(phone: Phone, fake_llm: FakeOpenAI, summary: str = SUMMARY) -> None:
    fake_llm.queue(Reply(summary))  # the archive's summary call
    await phone.send({"type": "leave"})
    assert (await phone.expect("bye"))["reason"] == "leave"
    await phone.close()
    await phone.harness.server.directory.settle()  # the summary is written after the bye


async def ask_again(harness: Harness, fake_llm: FakeOpenAI, device: str) -> str:
    phone = await harness.phone(device)
    assert phone.welcome["resumed"] is False
    fake_llm.queue(Reply("We were making your weekend list."))
    await phone.say(QUESTION)
    await phone.reply()
    return handed_context(fake_llm)


async def add_rule(harness: Harness, device: str, text: str) -> dict[str, Any]:
    async with harness.http.post(
        harness.url("/v1/rules"), json={"text": text}, headers={"X-Stillhere-Device": device}
    ) as response:
        assert response.status == 201
        return orjson.loads(await response.read())["rule"]


async def insert_memory(
    db: asyncpg.Connection, person: str, text: str, mentioned: datetime, **columns: Any
) -> uuid.UUID:
    values = {
        "id": uuid.uuid4(),
        "person": person,
        "kind": "fact",
        "text": text,
        "created_at": mentioned,
        "first_mentioned": mentioned,
        "last_mentioned": mentioned,
        **columns,
    }
    names = ", ".join(values)
    marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    await db.execute(f"INSERT INTO cards ({names}) VALUES ({marks})", *values.values())
    return values["id"]


# -- "what were we talking about last time?" -------------------------------------------------


async def test_after_leave_the_last_exchanges_are_handed_word_for_word(
    harness: Harness,
    fake_llm: FakeOpenAI,
    fake_embeddings: FakeEmbeddings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await start(harness, fake_llm, fake_embeddings)
    phone = await talk_then(harness, fake_llm)
    first_context = handed_context(fake_llm)
    assert "none: this is our first conversation" in first_context
    await leave(phone, fake_llm)
    harness.clock.advance(12 * 60)

    handed = await ask_again(harness, fake_llm, phone.device)

    assert f"- 12 min ago, 2 turns: {SUMMARY}" in handed
    assert f"You: {ASKED}\nMe: {ANSWERED}" in handed
    assert "How the most recent conversation (12 min ago) ended, word for word:" in handed
    assert RECALL_INSTRUCTION in handed
    assert handed.startswith("Recent conversations")  # the section at the top
    line = turn_lines(caplog)[-1]
    assert "1 recent conversations (2 turns word for word)" in line
    assert "failed sources: none" in line and f"context {len(handed)} chars" in line


async def test_after_the_idle_sweep_too(
    harness: Harness, fake_llm: FakeOpenAI, fake_embeddings: FakeEmbeddings
) -> None:
    await start(harness, fake_llm, fake_embeddings)
    phone = await talk_then(harness, fake_llm)
    await phone.close()
    fake_llm.queue(Reply(SUMMARY))
    harness.clock.advance(31 * 60)
    await harness.sweep()
    await harness.server.directory.settle()  # the summary is written after the archive

    handed = await ask_again(harness, fake_llm, phone.device)

    assert f"- 31 min ago, 2 turns: {SUMMARY}" in handed
    assert f"You: {ASKED}\nMe: {ANSWERED}" in handed


async def test_long_turns_are_shortened_and_older_conversations_listed(
    harness: Harness, fake_llm: FakeOpenAI, fake_embeddings: FakeEmbeddings
) -> None:
    await start(harness, fake_llm, fake_embeddings)
    phone = await talk_then(harness, fake_llm)
    await leave(phone, fake_llm, "The first talk.")
    harness.clock.advance(2 * 86400)
    again = await harness.phone(phone.device)
    fake_llm.queue(Reply("word " * 400))
    await again.say("Tell me a long one")
    await again.reply()
    await leave(again, fake_llm, "The second talk.")
    harness.clock.advance(3600)

    handed = await ask_again(harness, fake_llm, phone.device)

    second = handed.index("- 1 hour ago, 2 turns: The second talk.")
    first = handed.index("- 2 days ago, 2 turns: The first talk.")
    assert second < first  # newest first
    [me] = [line for line in handed.splitlines() if line.startswith("Me: word")]
    assert me.endswith("…") and len(me) <= 4 + 300


async def test_a_neighbours_conversations_never_appear(
    harness: Harness, fake_llm: FakeOpenAI, fake_embeddings: FakeEmbeddings
) -> None:
    await start(harness, fake_llm, fake_embeddings)
    neighbour = await harness.phone()
    fake_llm.queue(Reply("Your locker code is 4417."))
    await neighbour.say("My locker code is 4417, remember it")
    await neighbour.reply()
    await leave(neighbour, fake_llm, "Neighbour's locker code.")
    await add_rule(harness, neighbour.device, "Always answer in Welsh")

    mine = await harness.phone()
    fake_llm.queue(Reply("Nothing yet."))
    await mine.say(QUESTION)
    await mine.reply()

    handed = handed_context(fake_llm)
    assert "none: this is our first conversation" in handed
    for theirs in ("4417", "locker", "Welsh"):
        assert theirs not in handed


# -- each source on its own -------------------------------------------------------------------


async def full_setup(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> tuple[Phone, dict[str, str]]:
    """A person with something in every source; returns the phone and a marker per source."""
    first = await talk_then(harness, fake_llm)
    await leave(first, fake_llm)
    person = harness.server.identity.person(device=first.device)
    now = harness.clock.now()
    await insert_memory(db, person, "The gate code is 1234.", now - timedelta(days=1))
    await insert_memory(
        db, person, "Paul's birthday is in June.", now - timedelta(days=20), mention_count=5
    )
    await add_rule(harness, first.device, "Call me Hannah.")
    phone = await harness.phone(first.device)
    fake_llm.queue(Reply("", tool_calls=[("remember", {"text": TENT})]), Reply("Noted."))
    await phone.say(f"Remember {TENT}")
    await phone.reply()
    fake_llm.queue(Reply("ok"))  # a turn's context is assembled once, before its first call
    await phone.say("Good.")
    await phone.reply()
    markers = {
        "conversations": f"You: {ASKED}",
        "working": f"Memories made or recalled in this conversation:\n- [fact] {TENT}",
        "recent": "The gate code is 1234.",
        "sample": "Paul's birthday is in June. (mentioned 5 times)",
        "rules": "- Call me Hannah.",
    }
    return phone, markers


@pytest.mark.parametrize(
    ("broken", "how"),
    # A local source (the turn's own) does no I/O, so it can fail but not be late.
    [(name, how) for name in context.SOURCES for how in ("error", "late")]
    + [(name, "error") for name in context.LOCAL_SOURCES],
)
async def test_a_failing_or_late_source_leaves_the_others(
    harness: Harness,
    fake_llm: FakeOpenAI,
    fake_embeddings: FakeEmbeddings,
    db: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    broken: str,
    how: str,
) -> None:
    # No cache: every turn reads every source, so the broken one is asked.
    await start(harness, fake_llm, fake_embeddings, context_timeout=0.2, context_cache=0)
    phone, markers = await full_setup(harness, fake_llm, db)
    before = handed_context(fake_llm)
    assert all(marker in before for marker in markers.values()), before

    async def failing(*args: Any) -> list[Any]:
        if how == "late":
            await asyncio.sleep(5)
        raise RuntimeError("database said no")

    def failing_here(*args: Any) -> list[Any]:
        raise RuntimeError("database said no")

    if broken in context.LOCAL_SOURCES:
        monkeypatch.setitem(context.LOCAL_SOURCES, broken, failing_here)
    else:
        monkeypatch.setitem(context.SOURCES, broken, failing)
    fake_llm.queue(Reply("Still here."))
    await phone.say(QUESTION)
    assert (await phone.reply())["text"] == "Still here."

    handed = handed_context(fake_llm)
    for source, marker in markers.items():
        assert (marker in handed) is (source != broken), (source, handed)
    line = turn_lines(caplog)[-1]
    assert f"failed sources: {broken}" in line
    word = "late" if how == "late" else "failed (RuntimeError"
    [left_out] = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert left_out.startswith(f"context sources left out: {broken} {word}")
    failures = harness.server.runtime.metrics.context_source_failures.labels(source=broken)
    assert failures._value.get() == 1


# -- reads kept between turns -----------------------------------------------------------------


def count_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Wrap every source so the test sees how often a turn really reads it."""
    reads = dict.fromkeys([*context.SOURCES, *context.LOCAL_SOURCES], 0)
    for name, local in list(context.LOCAL_SOURCES.items()):

        def counted_here(*args: Any, name: str = name, local: Any = local) -> list[Any]:
            reads[name] += 1
            return local(*args)

        monkeypatch.setitem(context.LOCAL_SOURCES, name, counted_here)
    for name, source in list(context.SOURCES.items()):

        async def counted(*args: Any, name: str = name, source: Any = source) -> list[Any]:
            reads[name] += 1
            return await source(*args)

        monkeypatch.setitem(context.SOURCES, name, counted)
    return reads


@dataclass
class Counted:
    """A person with something in every source, their phone, and how often each source has
    been read since."""

    phone: Phone
    markers: dict[str, str]
    reads: dict[str, int]


@pytest.fixture
async def counted(
    harness: Harness,
    fake_llm: FakeOpenAI,
    fake_embeddings: FakeEmbeddings,
    db: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> Counted:
    await start(harness, fake_llm, fake_embeddings)
    phone, markers = await full_setup(harness, fake_llm, db)
    return Counted(phone, markers, count_reads(monkeypatch))


def read_since(reads: dict[str, int], before: dict[str, int]) -> set[str]:
    return {name for name in reads if reads[name] > before[name]}


async def next_turn(phone: Phone, fake_llm: FakeOpenAI, reads: dict[str, int]) -> set[str]:
    """One more turn; the sources it read from scratch."""
    before = dict(reads)
    fake_llm.queue(Reply("ok"))
    await phone.say("And?")
    await phone.reply()
    return read_since(reads, before)


async def test_reads_are_kept_until_what_they_read_changes(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection, counted: Counted
) -> None:
    phone, markers, reads = counted.phone, counted.markers, counted.reads
    person = harness.person(phone)
    everything = set(context.SOURCES) | {"working"}

    assert await next_turn(phone, fake_llm, reads) == {"working"}  # from the actor, always
    handed = handed_context(fake_llm)
    assert all(marker in handed for marker in markers.values()), handed

    # A write from outside this server (another process, plain SQL) is seen at once.
    now = harness.clock.now()
    made = await insert_memory(db, person, "The bins go out on Tuesday.", now)
    assert await next_turn(phone, fake_llm, reads) == everything
    assert "The bins go out on Tuesday." in handed_context(fake_llm)
    await db.execute("UPDATE cards SET status = 'muted' WHERE id = $1", made)
    assert await next_turn(phone, fake_llm, reads) == everything
    assert "The bins go out on Tuesday." not in handed_context(fake_llm)

    rule = await add_rule(harness, phone.device, "Keep it short.")
    assert await next_turn(phone, fake_llm, reads) == everything
    assert "- Keep it short." in handed_context(fake_llm)
    await Rules(harness, phone.device).call("DELETE", f"/v1/rules/{rule['id']}")
    assert await next_turn(phone, fake_llm, reads) == everything
    assert "Keep it short." not in handed_context(fake_llm)

    # Nothing changed, but "mentioned in the last days" slides with the clock.
    assert await next_turn(phone, fake_llm, reads) == {"working"}
    harness.clock.advance(61)
    assert await next_turn(phone, fake_llm, reads) == everything


async def test_a_failed_read_is_not_kept(
    harness: Harness,
    fake_llm: FakeOpenAI,
    fake_embeddings: FakeEmbeddings,
    db: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await start(harness, fake_llm, fake_embeddings, context_timeout=0.2)
    phone, markers = await full_setup(harness, fake_llm, db)
    await insert_memory(db, harness.person(phone), "Something new.", harness.clock.now())
    real, broken = context.SOURCES["rules"], [True]

    async def once_broken(*args: Any) -> list[Any]:
        if broken.pop() if broken else False:
            raise RuntimeError("database said no")
        return await real(*args)

    monkeypatch.setitem(context.SOURCES, "rules", once_broken)
    reads = count_reads(monkeypatch)
    assert await next_turn(phone, fake_llm, reads) == set(context.SOURCES) | {"working"}
    assert markers["rules"] not in handed_context(fake_llm)
    # The others were kept; the rules, which failed, are read again, and are back.
    assert await next_turn(phone, fake_llm, reads) == {"rules", "working"}
    assert markers["rules"] in handed_context(fake_llm)


async def turn_on_a_say_kept_during_a_reply(
    phone: Phone,
    fake_llm: FakeOpenAI,
    reads: dict[str, int],
    meanwhile: Callable[[], Awaitable[object]] | None = None,
) -> set[str]:
    """A say sent while a reply streams is kept, and its turn starts when the reply ends;
    `meanwhile` runs in between. The sources that second turn read from scratch."""
    # Worded afresh each time, in its first chunk: the echo guard holds back a reply that
    # begins as the last one did until the word that differs, and one differing only at
    # its end would come whole, perhaps before the second say's ack.
    thinking = f"Message {len(fake_llm.requests) + 1}: one moment please, let me think it over."
    fake_llm.queue(Reply(thinking, chunk=4, delay=0.05), Reply("ok"))
    await phone.say("Tell me.")
    await phone.expect("reply.delta")
    await phone.say("And?")
    if meanwhile is not None:
        await meanwhile()
    before = dict(reads)
    await phone.reply()
    await phone.reply()
    return read_since(reads, before)


async def test_a_change_during_a_reply_reaches_the_turn_on_says_kept_meanwhile(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection, counted: Counted
) -> None:
    """The kept say was stored (with the generation of its time) before the change: its turn
    reads the generation afresh, so it does not reuse reads the change made stale."""
    phone, reads = counted.phone, counted.reads
    person, now = harness.person(phone), harness.clock.now()

    async def remember() -> None:
        await insert_memory(db, person, "The bins go out on Tuesday.", now)

    everything = set(context.SOURCES) | {"working"}
    assert await turn_on_a_say_kept_during_a_reply(phone, fake_llm, reads, remember) == everything
    assert "The bins go out on Tuesday." in handed_context(fake_llm)
    assert await turn_on_a_say_kept_during_a_reply(phone, fake_llm, reads) == {"working"}


async def test_without_its_generation_a_turn_reads_everything_and_keeps_nothing(
    harness: Harness,
    fake_llm: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    counted: Counted,
) -> None:
    phone, markers, reads = counted.phone, counted.markers, counted.reads

    async def unreadable(person: str) -> int:
        raise RuntimeError("database said no")

    monkeypatch.setattr(harness.server.runtime.store.context, "generation", unreadable)
    everything = set(context.SOURCES) | {"working"}
    for _ in range(2):  # nothing kept: the second time it reads it all again
        assert await turn_on_a_say_kept_during_a_reply(phone, fake_llm, reads) == everything
        handed = handed_context(fake_llm)
        assert all(marker in handed for marker in markers.values()), handed
    assert "none kept from earlier turns (generation failed (RuntimeError" in caplog.text


async def test_the_context_generation_moves_with_what_the_context_reads(
    harness: Harness, fake_llm: FakeOpenAI, fake_embeddings: FakeEmbeddings, db: asyncpg.Connection
) -> None:
    await start(harness, fake_llm, fake_embeddings)
    phone = await talk_then(harness, fake_llm)
    person = harness.person(phone)

    async def generation() -> int:
        return await harness.server.runtime.store.context.generation(person)

    assert await generation() == 0  # turns and their last_activity do not count
    now = harness.clock.now()
    ids = [await insert_memory(db, person, f"Fact {i}.", now) for i in range(3)]
    assert await generation() == 3
    await db.execute("UPDATE cards SET mention_count = 2 WHERE id = ANY($1)", ids)
    assert await generation() == 4  # one statement, one step, however many rows
    await db.execute("DELETE FROM cards WHERE id = ANY($1)", ids)
    assert await generation() == 5
    rule = await add_rule(harness, phone.device, "Be brief.")
    await Rules(harness, phone.device).call("DELETE", f"/v1/rules/{rule['id']}")
    assert await generation() == 7
    await leave(phone, fake_llm)  # archived, summarised, the summary kept as a memory
    assert await generation() == 10
    assert await harness.server.runtime.store.context.generation("nobody") == 0


# -- what never appears -----------------------------------------------------------------------


async def test_muted_memories_never_appear(
    harness: Harness, fake_llm: FakeOpenAI, fake_embeddings: FakeEmbeddings, db: asyncpg.Connection
) -> None:
    await start(harness, fake_llm, fake_embeddings)
    phone = await harness.phone()
    person = harness.person(phone)
    now = harness.clock.now()
    await insert_memory(db, person, "Muted yesterday.", now - timedelta(days=1), status="muted")
    await insert_memory(
        db, person, "Muted long ago.", now - timedelta(days=30), status="muted", mention_count=9
    )
    await insert_memory(db, person, "Kept yesterday.", now - timedelta(days=1))
    fake_llm.queue(Reply("ok"))
    await phone.say("hello")
    await phone.reply()
    handed = handed_context(fake_llm)
    assert "Kept yesterday." in handed
    assert "Muted" not in handed


async def test_summaries_are_not_repeated_among_facts(
    harness: Harness,
    fake_llm: FakeOpenAI,
    fake_embeddings: FakeEmbeddings,
    db: asyncpg.Connection,
) -> None:
    await start(harness, fake_llm, fake_embeddings)
    phone = await talk_then(harness, fake_llm)
    await leave(phone, fake_llm)
    person = harness.server.identity.person(device=phone.device)
    kept = await db.fetchval("SELECT text FROM cards WHERE kind = 'summary'")
    assert kept == SUMMARY  # archiving keeps the summary as a memory, findable by meaning
    memory = harness.server.runtime.memory
    assert memory is not None
    assert SUMMARY in [f.memory.text for f in await memory.search(person, SUMMARY)]
    now = harness.clock.now()
    await insert_memory(db, person, SUMMARY, now)  # the same text stored as a plain fact
    await insert_memory(db, person, "Findable later.", now, kind="summary")
    await insert_memory(db, person, "A plain fact.", now)

    handed = await ask_again(harness, fake_llm, phone.device)

    assert handed.count(SUMMARY) == 1  # in the recent-conversations section only
    assert f"2 turns: {SUMMARY}" in handed
    assert "Findable later." not in handed
    assert "A plain fact." in handed


# -- budget and order -------------------------------------------------------------------------


async def test_the_budget_holds_in_priority_order_and_is_deterministic(
    harness: Harness,
    fake_llm: FakeOpenAI,
    fake_embeddings: FakeEmbeddings,
    db: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = 900
    await start(harness, fake_llm, fake_embeddings, context_budget=budget)
    phone = await talk_then(harness, fake_llm)
    await leave(phone, fake_llm)
    person = harness.server.identity.person(device=phone.device)
    now = harness.clock.now()
    for i in range(60):  # far more than fits
        await insert_memory(db, person, f"Recent fact number {i:02d}.", now - timedelta(hours=i))
        await insert_memory(
            db, person, f"Old fact {i:02d}.", now - timedelta(days=10), mention_count=1 + i % 7
        )
    await add_rule(harness, phone.device, "Always answer in French.")

    again = await harness.phone(phone.device)
    for _ in range(2):
        fake_llm.queue(Reply("ok"))
        await again.say("hello")
        await again.reply()
    first, second = handed_context(fake_llm, -2), handed_context(fake_llm, -1)

    assert 0 < len(first) <= budget
    # The second turn differs only by its own window, never by what the context holds.
    assert first == second
    # Priority: rules and the last conversation are in; recent facts before the sample.
    assert "- Always answer in French." in first
    assert f"You: {ASKED}" in first
    assert "Recent fact number 00." in first
    assert "Old fact" not in first  # the lowest priority is what the budget cut
    recent = [line for line in first.splitlines() if line.startswith("- [fact] Recent")]
    assert recent == sorted(recent)  # latest mention first: 00, 01, 02...
    assert f"context {len(first)} chars" in turn_lines(caplog)[-1]


def test_relative_ages_in_words() -> None:
    now = datetime(2026, 5, 19, 12, 0, tzinfo=ManualClock().now().tzinfo)
    ago = [
        (timedelta(seconds=20), "just now"),
        (timedelta(minutes=12), "12 min ago"),
        (timedelta(hours=1), "1 hour ago"),
        (timedelta(hours=5), "5 hours ago"),
        (timedelta(hours=30), "yesterday"),
        (timedelta(days=3), "3 days ago"),
        (timedelta(days=21), "3 weeks ago"),
        (timedelta(days=90), "3 months ago"),
        (timedelta(days=800), "2 years ago"),
    ]
    assert [relative_age(now - delta, now) for delta, _ in ago] == [words for _, words in ago]


# -- the rules API ----------------------------------------------------------------------------


class Rules:
    def __init__(self, harness: Harness, device: str | None = None) -> None:
        self.harness = harness
        self.device = device or "device-" + uuid.uuid4().hex

    async def call(
        self, method: str, path: str, body: Any = None, **headers: str
    ) -> tuple[int, dict[str, Any]]:
        sent = {"X-Stillhere-Device": self.device, **headers}
        data = orjson.dumps(body) if body is not None else None
        async with self.harness.http.request(
            method, self.harness.url(path), data=data, headers=sent
        ) as response:
            return response.status, orjson.loads(await response.read())


async def test_rules_are_stored_listed_and_deleted_per_person(
    harness: Harness, fake_llm: FakeOpenAI, fake_embeddings: FakeEmbeddings, db: asyncpg.Connection
) -> None:
    await start(harness, fake_llm, fake_embeddings)
    mine, theirs = Rules(harness), Rules(harness)
    status, made = await mine.call("POST", "/v1/rules", {"text": "  Always answer\nin French "})
    assert status == 201 and made["rule"]["text"] == "Always answer in French"
    await mine.call("POST", "/v1/rules", {"text": "Call me Hannah"})
    status, listed = await mine.call("GET", "/v1/rules")
    assert [r["text"] for r in listed["rules"]] == ["Always answer in French", "Call me Hannah"]
    assert (await theirs.call("GET", "/v1/rules"))[1] == {"rules": []}

    rule_id = made["rule"]["id"]
    status, refused = await theirs.call("DELETE", f"/v1/rules/{rule_id}")
    assert (status, refused["code"]) == (404, "unknown_rule")
    status, refused = await mine.call("DELETE", f"/v1/rules/{uuid.uuid4()}")
    assert (status, refused["code"]) == (404, "unknown_rule")
    status, refused = await mine.call("DELETE", "/v1/rules/not-an-id")
    assert (status, refused["code"]) == (404, "unknown_rule")
    assert await db.fetchval("SELECT count(*) FROM rules") == 2

    assert (await mine.call("DELETE", f"/v1/rules/{rule_id}"))[0] == 200
    status, listed = await mine.call("GET", "/v1/rules")
    assert [r["text"] for r in listed["rules"]] == ["Call me Hannah"]


async def test_rules_refuse_bad_input_and_strangers(
    harness: Harness, fake_llm: FakeOpenAI, fake_embeddings: FakeEmbeddings, db: asyncpg.Connection
) -> None:
    await start(harness, fake_llm, fake_embeddings)
    rules = Rules(harness)
    for body, code in [
        ({}, "invalid_field"),
        ({"text": "   "}, "invalid_field"),
        ({"text": 42}, "invalid_field"),
        ({"text": "x" * 501}, "invalid_field"),
    ]:
        status, refused = await rules.call("POST", "/v1/rules", body)
        assert (status, refused["code"]) == (400, code), body
    async with harness.http.post(harness.url("/v1/rules"), data=b"[1") as response:
        assert response.status == 400
        assert orjson.loads(await response.read())["code"] == "bad_json"
    async with harness.http.get(harness.url("/v1/rules")) as response:
        assert response.status == 401
        assert orjson.loads(await response.read())["code"] == "unauthorized"
    for i in range(50):
        assert (await rules.call("POST", "/v1/rules", {"text": f"rule {i}"}))[0] == 201
    status, refused = await rules.call("POST", "/v1/rules", {"text": "one more"})
    assert (status, refused["code"]) == (409, "too_many_rules")
    assert await db.fetchval("SELECT count(*) FROM rules") == 50


async def test_a_rule_reaches_the_very_next_turn(
    harness: Harness, fake_llm: FakeOpenAI, fake_embeddings: FakeEmbeddings
) -> None:
    await start(harness, fake_llm, fake_embeddings)
    phone = await harness.phone()
    made = await add_rule(harness, phone.device, "Always answer in French.")
    fake_llm.queue(Reply("D'accord."), Reply("ok"))
    await phone.say("hello")
    await phone.reply()
    assert "- Always answer in French." in handed_context(fake_llm)
    await Rules(harness, phone.device).call("DELETE", f"/v1/rules/{made['id']}")
    await phone.say("hello again")
    await phone.reply()
    assert "Always answer in French." not in handed_context(fake_llm)


async def test_the_context_log_line_is_one_line_per_turn(
    harness: Harness,
    fake_llm: FakeOpenAI,
    fake_embeddings: FakeEmbeddings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    await start(harness, fake_llm, fake_embeddings)
    phone = await harness.phone()
    fake_llm.queue(Reply("ok"))
    await phone.say("hello")
    await phone.reply()
    [line] = turn_lines(caplog)
    assert "0 turns of history, 0 recent conversations (0 turns word for word)" in line
    assert "memories 0 working / 0 recent / 0 sampled, 0 rules, failed sources: none" in line
