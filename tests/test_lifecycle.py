"""A conversation's life: racing links, resume or not, leave, sweep, parking, failure."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import asyncpg
import pytest

from actors import archive
from actors.conversation import ConversationActor
from actors.messages import Attach, TurnEnded
from storage.records import Turn
from tests.conftest import Harness, HeldReplies, Phone, eventually
from tests.fakes.openai_server import FakeOpenAI, Reply


async def _conversations(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT id::text, status, archive_reason, summary FROM conversations ORDER BY started_at"
    )


async def test_two_links_racing_share_one_conversation(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start()
    device = "device-racing-0123456789abcdef"
    a, b = await asyncio.gather(harness.phone(device), harness.phone(device))
    assert a.welcome["conversation"] == b.welcome["conversation"]
    assert len(harness.server.directory) == 1
    assert len(await _conversations(db)) == 1
    await a.say("hello from a")
    assert (await b.reply())["text"].startswith("[rehearsal]")  # b sees a's reply too


async def test_past_the_window_a_new_conversation_starts(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start()
    phone = await harness.phone()
    await phone.say("hello")
    await phone.reply()
    await phone.drop()
    harness.clock.advance(30 * 60 + 1)
    again = await harness.phone(phone.device, conversation=phone.welcome["conversation"])
    assert again.welcome["resumed"] is False
    assert again.welcome["conversation"] != phone.welcome["conversation"]
    assert again.welcome["history"] == []
    old, new = await _conversations(db)
    assert (old["status"], old["archive_reason"]) == ("archived", "idle")
    assert new["status"] == "active"
    assert await _summary(db, conversations=2)


async def _summary(db: asyncpg.Connection, conversations: int = 1) -> str:
    """The first conversation's summary (of `conversations` in all), once the model has
    written it: after the conversation is marked archived."""
    async with asyncio.timeout(10):
        while True:
            first, *others = await _conversations(db)
            assert len(others) == conversations - 1
            if first["summary"] is not None:
                return str(first["summary"])
            await asyncio.sleep(0.01)


async def _say_then_leave(harness: Harness) -> Phone:
    """A phone says one thing, hears the reply, leaves, and gets its `bye`."""
    phone = await harness.phone()
    await phone.say("Note that the dentist is on Tuesday")
    await phone.reply()
    await phone.send({"type": "leave"})
    assert (await phone.expect("bye"))["reason"] == "leave"
    return phone


async def test_leave_archives_at_once_with_a_summary(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start()
    phone = await _say_then_leave(harness)
    (row,) = await _conversations(db)
    assert (row["status"], row["archive_reason"]) == ("archived", "leave")
    assert "dentist" in await _summary(db)
    again = await harness.phone(phone.device)
    assert again.welcome["resumed"] is False


async def test_leave_says_bye_without_waiting_for_the_summary(
    harness: Harness, db: asyncpg.Connection, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply("Tuesday, noted."), Reply("We talked about the dentist.", delay=0.3))
    await _say_then_leave(harness)
    (row,) = await _conversations(db)
    assert row["status"] == "archived" and row["summary"] is None  # the model is still at it
    assert await _summary(db) == "We talked about the dentist."


async def test_the_summary_waits_for_the_last_reply_to_be_written(
    harness: Harness, held_replies: HeldReplies, monkeypatch: pytest.MonkeyPatch
) -> None:
    summarised: list[list[Turn]] = []
    summarise = archive.summarise

    async def seen(rt: Any, turns: list[Turn]) -> str:
        summarised.append(turns)
        return await summarise(rt, turns)

    monkeypatch.setattr(archive, "summarise", seen)
    await harness.start()
    phone = await harness.phone()
    await phone.say("My dentist appointment is on Tuesday.")
    await phone.reply()
    await asyncio.wait_for(held_replies.reached.wait(), 10)  # the phone has it; the record not
    await phone.send({"type": "leave"})
    await asyncio.sleep(0.3)  # long enough for the summary to begin, were it not to wait
    held_replies.release.set()
    assert (await phone.expect("bye"))["reason"] == "leave"
    await eventually(lambda: summarised)
    assert [t.role for t in summarised[0]] == ["user", "assistant"]


async def test_the_sweep_archives_idle_conversations_live_or_left_behind(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start()
    left = await harness.phone()
    await left.say("from an earlier process")
    await left.reply()
    await left.close()
    await harness.stop()  # the conversation stays active in the database
    await harness.start()
    live = await harness.phone()
    await live.say("still here")
    await live.reply()
    harness.clock.advance(29 * 60)
    assert (await harness.sweep())["archived"] == 0
    harness.clock.advance(61)
    report = await harness.sweep()
    assert report is not None and report["archived"] == 2
    assert (await live.expect("bye"))["reason"] == "idle"
    await eventually(lambda: live.ws is not None and live.ws.closed)  # bye ends the link
    assert [r["status"] for r in await _conversations(db)] == ["archived", "archived"]
    assert len(harness.server.directory) == 0


async def test_a_conversation_kept_alive_by_resends_is_not_archived_inside_its_window(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start()
    phone = await harness.phone()
    first = await phone.say("is the train on time?", "s1")
    await phone.reply()
    harness.clock.advance(20 * 60)
    again = await phone.say("is the train on time?", "s1")  # the outbox resends it
    resent_at = harness.clock.now()
    harness.clock.advance(20 * 60)  # 40 min since the last turn, 20 since the resend

    assert again["seq"] == first["seq"]  # the same ack: nothing new was stored
    assert (await harness.sweep())["archived"] == 0
    live = harness.server.directory.get(harness.person(phone))
    assert live is not None and (await live.ask(Attach)).last_activity == resent_at
    await phone.close()
    await harness.stop()  # and a restarted server counts it the same way
    await harness.start()
    back = await harness.phone(phone.device)
    assert back.welcome["resumed"] is True and back.welcome["age_s"] == 20 * 60
    await back.close()
    harness.clock.advance(10 * 60 + 1)
    assert (await harness.sweep())["archived"] == 1
    assert [r["status"] for r in await _conversations(db)] == ["archived"]


async def test_an_unlinked_actor_is_parked_and_rehydrated(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start(park_after=60)
    phone = await harness.phone()
    await phone.say("Note that Owen arrives Friday evening")
    await phone.reply()
    seen = phone.last_seq
    await phone.drop()
    await eventually(lambda: harness.links(phone) == 0)
    harness.clock.advance(61)
    assert (await harness.sweep())["parked"] == 1
    assert len(harness.server.directory) == 0
    again = await harness.phone(phone.device)
    assert again.welcome["resumed"] is True
    assert [t["role"] for t in again.welcome["history"]] == ["user", "assistant"]
    assert len(again.welcome["cards"]) == 1
    assert again.welcome["seq"] >= seen
    await again.say("two")
    assert (await again.expect("reply.start"))["seq"] > seen


async def test_a_half_streamed_reply_is_replayed_whole(harness: Harness) -> None:
    await harness.start(rehearsal_rate=40)
    phone = await harness.phone()
    await phone.say("tell me a story about trains")
    start = await phone.expect("reply.start")
    seen = [await phone.expect("reply.delta") for _ in range(3)]
    await phone.drop()
    again = await harness.phone(
        phone.device, conversation=phone.welcome["conversation"], last_seq=seen[-1]["seq"]
    )
    end = await again.reply()
    deltas = seen + [f for f in again.frames if f["type"] == "reply.delta"]
    seqs = [start["seq"]] + [d["seq"] for d in deltas] + [end["seq"]]
    assert seqs == list(range(start["seq"], end["seq"] + 1))
    assert "".join(d["text"] for d in deltas) == end["text"]


async def test_a_client_ack_lets_the_server_forget_what_the_phone_has(harness: Harness) -> None:
    await harness.start(rehearsal_rate=0)
    phone = await harness.phone()
    await phone.say("one night or two?")
    end = await phone.reply()
    stream = harness.server.directory.get(harness.person(phone)).stream
    assert stream.buffered >= 3
    await phone.send({"type": "ack", "seq": end["seq"]})
    await eventually(lambda: stream.buffered == 0)
    await phone.drop()  # back from further behind: the reply comes whole from the table
    again = await harness.phone(
        phone.device, conversation=phone.welcome["conversation"], last_seq=end["seq"] - 3
    )
    assert (await again.expect("reply.end"))["text"] == end["text"]


@pytest.mark.parametrize("actor_threads", [0, 4])  # a thread of its own, or the pool's
async def test_a_failed_actor_is_replaced_without_losing_the_conversation(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, actor_threads: int
) -> None:
    await harness.start(actor_threads=actor_threads)
    phone = await harness.phone()
    await phone.say("Note that Owen arrives Friday evening")
    await phone.reply()
    real = ConversationActor._on_say

    def fail_once(self: ConversationActor, say: object) -> None:
        monkeypatch.setattr(ConversationActor, "_on_say", real)
        raise RuntimeError("injected failure")

    monkeypatch.setattr(ConversationActor, "_on_say", fail_once)
    await phone.send({"type": "say", "id": "x1", "text": "two"})
    error = await phone.expect("error")
    assert (error["code"], error["id"]) == ("internal_error", "x1")
    live = harness.server.directory.get(harness.person(phone))
    assert live is not None
    failed_ref = live.ref
    await eventually(lambda: live.ref is not failed_ref)  # the supervisor replaced it
    await phone.say("two", "x1")  # the outbox resends with the same id
    end = await phone.reply()
    assert "Just before, I said" in end["text"]  # the window survived the failure


async def test_a_clean_shutdown_stores_the_reply_that_was_streaming(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start(rehearsal_rate=40)
    phone = await harness.phone()
    await phone.say("tell me a story about trains")
    seen = [await phone.expect("reply.delta") for _ in range(2)]
    await harness.stop()
    stored = await db.fetchrow("SELECT text, interrupted FROM turns WHERE role = 'assistant'")
    assert stored["interrupted"] is True
    assert stored["text"].startswith("".join(d["text"] for d in seen))


async def test_a_hello_racing_a_leave_never_meets_a_dead_actor(
    harness: Harness, db: asyncpg.Connection
) -> None:
    """Whichever wins, the second link ends in a consistent state, with no error."""
    await harness.start()
    first = await harness.phone()
    await first.say("hello")
    await first.reply()
    await first.send({"type": "leave"})
    second = await harness.phone(first.device)
    if second.welcome["resumed"]:  # it attached before the leave: it hears the bye
        assert (await second.expect("bye"))["reason"] == "leave"
    else:
        assert second.welcome["conversation"] != first.welcome["conversation"]
    assert not [f for f in second.frames if f["type"] == "error"]
    assert await db.fetchval("SELECT count(*) FROM conversations WHERE status = 'active'") <= 1


async def test_once_a_leave_has_begun_a_hello_opens_a_new_conversation(harness: Harness) -> None:
    """A hello reads the state the actor last published; the leave the actor has not yet
    handled must not be missed: it is marked on the loop as it is sent."""
    await harness.start()
    phone = await harness.phone()
    directory = harness.server.directory
    live = directory.get(harness.person(phone))
    assert live is not None
    leaving = asyncio.ensure_future(directory.end(live, "leave"))
    await asyncio.sleep(0)  # the `End` is on its way to the actor
    opened = await directory.open(live.person)
    assert await leaving
    assert opened.live is not live and not opened.resumed
    assert opened.live.id != live.id


async def test_a_hello_right_after_a_reply_finds_it_in_the_history(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The phone has the reply's end before the actor takes the turn into its window: a
    reconnect in between must not be welcomed with the snapshot from before the turn."""
    gate = threading.Event()
    handle = ConversationActor._handle

    def slow_to_take_turns(actor: ConversationActor, message: object) -> None:
        if isinstance(message, TurnEnded):
            gate.wait(10)
        handle(actor, message)

    monkeypatch.setattr(ConversationActor, "_handle", slow_to_take_turns)
    await harness.start()
    device = "device-quick-0123456789abcdef"
    first = await harness.phone(device)
    await first.say("hello")
    await first.reply()
    asyncio.get_running_loop().call_later(0.3, gate.set)
    again = await harness.phone(device)
    assert again.welcome["resumed"] is True
    assert [t["role"] for t in again.welcome["history"]] == ["user", "assistant"]
