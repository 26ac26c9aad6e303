"""The messy space between replies: messages sent mid-reply, interruptions, model hiccups."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from actors import tools
from actors.turn import FALLBACK
from providers.notes import CUT_MARK, NOTE_CUT_BEFORE_WORDS, NOTE_DURING_REPLY, NOTE_INTERRUPTED
from storage.records import StoredSay
from storage.store import Store
from tests.conftest import Harness, HeldReplies, Phone, eventually
from tests.fakes.openai_server import Cut, Empty, Fail, FakeOpenAI, Reply

SLOW = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"


def _contents(request: dict[str, Any]) -> list[str]:
    return [m.get("content") or "" for m in request["messages"]]


async def _deltas_until(phone: Phone, count: int) -> str:
    text = ""
    for _ in range(count):
        text += (await phone.expect("reply.delta"))["text"]
    return text


def _deltas_of(phone: Phone, end: dict[str, Any]) -> list[str]:
    return [
        f["text"] for f in phone.frames if f["type"] == "reply.delta" and f["reply"] == end["reply"]
    ]


async def test_pieces_close_together_share_one_delta(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    """The first piece goes at once; the window outlasts the reply, so every later piece is
    held and sent as one delta just before reply.end."""
    await harness.start(llm_url=fake_llm.url, delta_window=10.0)
    fake_llm.queue(Reply(SLOW, chunk=3, delay=0.01))
    phone = await harness.phone()
    await phone.say("Count for me.")
    end = await phone.reply()
    assert _deltas_of(phone, end) == [SLOW[:3], SLOW[3:]]
    assert end["text"] == SLOW
    await harness.recorded()
    assert await db.fetchval("SELECT text FROM turns WHERE role = 'assistant'") == SLOW


async def test_with_no_delta_window_each_piece_is_its_own_delta(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url, delta_window=0.0)
    fake_llm.queue(Reply(SLOW, chunk=3))
    phone = await harness.phone()
    await phone.say("Count for me.")
    end = await phone.reply()
    assert _deltas_of(phone, end) == [SLOW[i : i + 3] for i in range(0, len(SLOW), 3)]


async def test_by_default_a_paced_reply_goes_out_a_few_words_a_delta(harness: Harness) -> None:
    """At 20 words/s a word comes every 50 ms, inside the default window of 100 ms: the
    first word goes at once, later ones share deltas, and nothing is lost."""
    await harness.start(rehearsal_rate=20)
    phone = await harness.phone()
    await phone.say("Say back these eight words for me, please.")
    end = await phone.reply()
    deltas = _deltas_of(phone, end)
    words = end["text"].split()
    assert "".join(deltas) == end["text"]
    assert len(deltas[0].split()) == 1
    assert len(deltas) < len(words) * 0.75
    assert all(delta.strip() for delta in deltas)


async def test_pieces_held_when_a_reply_is_cut_off_are_neither_sent_nor_stored(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    await harness.start(llm_url=fake_llm.url, delta_window=10.0)
    fake_llm.queue(Reply(SLOW, chunk=3, delay=0.05), Reply("Go on."))
    phone = await harness.phone()
    await phone.say("Tell me everything.")
    first = await phone.expect("reply.delta")
    await asyncio.sleep(0.2)  # a few more pieces arrive, and are held
    await phone.send({"type": "interrupt"})
    end = await phone.reply()
    assert end["interrupted"] is True
    assert _deltas_of(phone, end) == [first["text"]] == [end["text"]]
    await harness.recorded()
    stored = await db.fetchval("SELECT text FROM turns WHERE role = 'assistant'")
    assert stored == first["text"]


async def test_messages_during_a_reply_are_answered_together(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply(SLOW, chunk=3, delay=0.05), Reply("Both answered."))
    phone = await harness.phone()
    await phone.say("Plan my Saturday.", "m1")
    await phone.expect("reply.delta")
    await phone.say("Owen comes too.", "m2")  # acked at once, mid-reply
    await phone.say("And Hannah.", "m3")
    first = await phone.reply()
    assert first["text"] == SLOW and first["interrupted"] is False
    start = await phone.expect("reply.start")
    assert start["in_reply_to"] == ["m2", "m3"]
    assert (await phone.reply())["text"] == "Both answered."
    handed = _contents(fake_llm.requests[1])
    assert handed[-4:] == [SLOW, NOTE_DURING_REPLY, "Owen comes too.", "And Hannah."]
    assert len(fake_llm.requests) == 2


async def test_messages_during_a_reply_are_recorded_after_it(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    """A message sent mid-reply is stored at once, yet its place in the record is after
    the reply in progress, as in the window the model was handed: so the history a phone
    gets back after a restart reads as the talk went."""
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply(SLOW, chunk=3, delay=0.1), Reply("Both answered."))
    phone = await harness.phone()
    await phone.say("Plan my Saturday.", "m1")
    await phone.expect("reply.delta")
    await phone.say("Owen comes too.", "m2")
    rows = await db.fetch("SELECT role FROM turns ORDER BY id")
    assert [r["role"] for r in rows] == ["user", "user"]  # the reply's row is written later
    await phone.reply()
    await phone.reply()
    await harness.recorded()
    await harness.stop()
    await harness.start(llm_url=fake_llm.url)
    again = await harness.phone(phone.device)
    assert again.welcome["resumed"] is True
    assert [t["text"] for t in again.welcome["history"]] == [
        "Plan my Saturday.",
        SLOW,
        "Owen comes too.",
        "Both answered.",
    ]


async def test_interrupt_frame_cuts_the_reply_and_the_next_call_knows(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply(SLOW, chunk=3, delay=0.1), Reply("Sorry, go on."))
    phone = await harness.phone()
    await phone.say("Tell me everything.")
    await phone.expect("reply.start")
    seen = await _deltas_until(phone, 2)
    await phone.send({"type": "interrupt"})
    end = await phone.reply()
    assert end["interrupted"] is True
    assert end["text"].startswith(seen) and len(end["text"]) < len(SLOW)
    await harness.recorded()
    stored = await db.fetchrow("SELECT text, interrupted FROM turns WHERE role = 'assistant'")
    assert (stored["text"], stored["interrupted"]) == (end["text"], True)
    await phone.say("What I meant was: only the weekend.")
    await phone.reply()
    handed = _contents(fake_llm.requests[1])
    assert end["text"] + CUT_MARK in handed
    assert NOTE_INTERRUPTED in handed


async def test_an_interrupt_before_any_word_is_said_plainly_to_the_model(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    # Slow to begin: cut before its first word (or before it was even asked for; then the
    # next turn gets it, which is no slower).
    fake_llm.queue(Reply("Go on.", chunk=100, delay=0.5))
    phone = await harness.phone()
    await phone.say("Tell me everything.")
    await phone.expect("reply.start")
    await phone.send({"type": "interrupt"})
    end = await phone.reply()
    assert (end["interrupted"], end["text"]) == (True, "")
    await phone.say("Actually, just the weekend.")
    await phone.reply()

    handed = fake_llm.requests[-1]["messages"]
    assert {"role": "system", "content": NOTE_CUT_BEFORE_WORDS} in handed
    assert not [m for m in handed if m["role"] == "assistant"]  # no turn of just a cut mark
    assert not [m for m in handed if CUT_MARK.strip() in (m.get("content") or "")]


async def test_a_reply_cut_mid_stream_names_the_fault_and_the_next_say_is_answered(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Cut("Let me think about that"), Reply("Here is your week."))
    phone = await harness.phone()
    await phone.say("Plan my week.")
    end = await phone.reply()
    assert end["error"] == "stream_cut" and end["text"].startswith("Let me think")
    await phone.say("Well?")
    assert (await phone.reply())["text"] == "Here is your week."
    assert len(fake_llm.requests) == 2  # a reply that had begun is not asked for again


async def test_a_short_stop_word_interrupts_and_is_answered(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply(SLOW, chunk=3, delay=0.1), Reply("Yes?"))
    phone = await harness.phone()
    await phone.say("Tell me everything.")
    await _deltas_until(phone, 1)
    await phone.say("Hold on!", "stop-1")
    cut = await phone.reply()
    assert cut["interrupted"] is True
    start = await phone.expect("reply.start")
    assert start["in_reply_to"] == ["stop-1"]
    assert (await phone.reply())["text"] == "Yes?"
    handed = _contents(fake_llm.requests[1])
    assert handed[-2:] == [NOTE_INTERRUPTED, "Hold on!"]


async def test_a_long_message_with_a_stop_word_does_not_interrupt(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply(SLOW, chunk=3, delay=0.05), Reply("ok"))
    phone = await harness.phone()
    await phone.say("Tell me everything.")
    await _deltas_until(phone, 1)
    await phone.say("wait until Friday before you book anything please")
    assert (await phone.reply())["interrupted"] is False


async def test_first_call_is_retried_once_after_a_failure(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Fail(503), Reply("Here I am."))
    phone = await harness.phone()
    await phone.say("hello")
    assert (await phone.reply())["text"] == "Here I am."
    assert len(fake_llm.requests) == 2


async def test_first_call_is_retried_once_after_an_empty_answer(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Empty(), Reply("Here I am."))
    phone = await harness.phone()
    await phone.say("hello")
    assert (await phone.reply())["text"] == "Here I am."
    assert len(fake_llm.requests) == 2


async def test_only_once_then_the_fallback_is_stored(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Fail(503), Fail(503), Reply("never asked"))
    phone = await harness.phone()
    await phone.say("hello")
    end = await phone.reply()
    assert (end["text"], end["error"]) == (FALLBACK, "http_503")
    assert len(fake_llm.requests) == 2
    await harness.recorded()
    assert await db.fetchval("SELECT text FROM turns WHERE role = 'assistant'") == FALLBACK


async def test_no_replay_after_a_tool_ran(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    """A failure after a tool ran is not retried: a replay could make a second card."""
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(
        Reply("", tool_calls=[("remember", {"text": "Owen lives in Bristol"})]),
        Fail(503),
        Reply("never asked"),
    )
    phone = await harness.phone()
    await phone.say("Remember Owen lives in Bristol")
    await phone.expect("card")
    end = await phone.reply()
    assert end["error"] == "http_503"
    assert len(fake_llm.requests) == 2
    assert await db.fetchval("SELECT count(*) FROM cards") == 1


async def test_the_lent_phone_speaker_is_kept_and_resets_after_silence(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    await harness.start(llm_url=fake_llm.url, speaker_reset=600)
    fake_llm.queue(Reply("", tool_calls=[("set_speaker", {"name": "Owen"})]), Reply("Hi Owen."))
    phone = await harness.phone()
    await phone.say("This is Owen speaking")
    await phone.reply()
    await phone.drop()
    harness.clock.advance(60)
    again = await harness.phone(phone.device)
    assert again.welcome["speaker"] == "Owen"
    await again.say("what time is it?")
    await again.reply()
    assert "person speaking now is Owen" in _contents(fake_llm.requests[-1])[0]
    harness.clock.advance(601)  # ten minutes of silence: the phone is back with its owner
    await again.drop()
    reopened = await harness.phone(phone.device)
    assert reopened.welcome["speaker"] is None  # what the next reply will assume
    await reopened.say("it's me")
    await reopened.reply()
    assert "person speaking now" not in _contents(fake_llm.requests[-1])[0]


async def test_a_failing_tool_ends_the_turn_and_the_conversation_goes_on(
    harness: Harness, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    await harness.start(llm_url=fake_llm.url)

    async def broken(ctx: object, args: object) -> dict[str, object]:
        raise RuntimeError("injected: the card table is gone")

    monkeypatch.setitem(tools._EXECUTORS, "remember", broken)
    fake_llm.queue(Reply("", tool_calls=[("remember", {"text": "Owen"})]), Reply("Still here."))
    phone = await harness.phone()
    await phone.say("Remember Owen")
    end = await phone.reply()
    assert (end["error"], end["text"]) == ("internal_error", FALLBACK)
    await phone.say("hello?")
    assert (await phone.reply())["text"] == "Still here."


# -- between a say and its ack ------------------------------------------------------------------
#
# A link handles its frames in order, so what comes between a say and its ack comes from
# another link of the same conversation (a second screen, or SSE's concurrent POSTs).


class HeldSays:
    """Says whose store waits until released: the moments between a say and its ack."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached: set[str] = set()
        self._gates: dict[str, asyncio.Event] = {}
        add_say = Store.add_say

        async def held(store: Store, *args: Any, **kwargs: Any) -> StoredSay:
            text = args[3]  # (conversation, person, client_id, text, now, place, epoch)
            if (gate := self._gates.get(text)) is not None:
                self.reached.add(text)
                await gate.wait()
            return await add_say(store, *args, **kwargs)

        monkeypatch.setattr(Store, "add_say", held)

    def hold(self, text: str) -> asyncio.Event:
        """Hold the store of the say with this text until the event is set."""
        return self._gates.setdefault(text, asyncio.Event())

    async def reach(self, text: str) -> None:
        await eventually(lambda: text in self.reached)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> HeldSays:
    return HeldSays(monkeypatch)


async def _handled(harness: Harness, phone: Phone, told_before: int) -> None:
    """Wait until the phone's actor was told something more and has handled all of it."""
    live = harness.server.directory.get(harness.person(phone))
    assert live is not None
    await eventually(lambda: live.told > told_before and live.current_snapshot() is not None)
    await asyncio.sleep(0.05)  # what the actor asked of the loop has run


def _told(harness: Harness, phone: Phone) -> int:
    live = harness.server.directory.get(harness.person(phone))
    assert live is not None
    return live.told


async def _between_say_and_ack(
    harness: Harness, held: HeldSays, text: str, frame: dict[str, Any]
) -> Phone:
    """A phone says `text`; while it is being stored, another link of the conversation
    sends `frame`, and the actor handles it; then the store goes on."""
    release = held.hold(text)
    phone = await harness.phone()
    other = await harness.phone(phone.device)
    await phone.send({"type": "say", "id": "m1", "text": text})
    await held.reach(text)
    told = _told(harness, phone)
    await other.send(frame)
    await _handled(harness, phone, told)
    release.set()
    await phone.expect("ack")
    return phone


async def test_an_interrupt_before_the_say_is_stored_cuts_nothing(
    harness: Harness, fake_llm: FakeOpenAI, held: HeldSays
) -> None:
    """The stop button pressed before the reply began has no reply to stop."""
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply("All of it, in order."))
    phone = await _between_say_and_ack(harness, held, "Tell me everything.", {"type": "interrupt"})
    end = await phone.reply()
    assert (end["text"], end["interrupted"]) == ("All of it, in order.", False)


async def test_leaving_while_the_say_is_stored_keeps_the_say_and_gives_no_reply(
    harness: Harness, held: HeldSays, db: asyncpg.Connection
) -> None:
    await harness.start()
    phone = await _between_say_and_ack(harness, held, "Book the room.", {"type": "leave"})
    assert (await phone.expect("bye"))["reason"] == "leave"
    assert not [f for f in phone.frames if f["type"].startswith("reply.")]
    rows = await db.fetch("SELECT role, text FROM turns ORDER BY id")
    assert [(r["role"], r["text"]) for r in rows] == [("user", "Book the room.")]


async def test_a_say_resent_while_idle_is_acked_again_and_leaves_the_turn_as_it_was(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    """The resend is planned into a full window before it is known to be one: the window, and
    the note that the last reply was cut, are as they were for the next say."""
    await harness.start(llm_url=fake_llm.url, window_turns=2)
    fake_llm.queue(Reply(SLOW, chunk=3, delay=0.1), Reply("Go on."))
    phone = await harness.phone()
    first = await phone.say("Tell me everything.", "m1")
    await _deltas_until(phone, 1)
    await phone.send({"type": "interrupt"})
    cut = await phone.reply()
    assert cut["interrupted"] is True
    again = await phone.say("Tell me everything.", "m1")
    assert again["seq"] == first["seq"]
    await phone.say("Only the weekend.", "m2")
    assert (await phone.reply())["text"] == "Go on."
    handed = _contents(fake_llm.requests[1])
    assert handed[1:] == [
        "Tell me everything.",
        cut["text"] + CUT_MARK,
        NOTE_INTERRUPTED,
        "Only the weekend.",
    ]
    assert len([f for f in phone.frames if f["type"] == "reply.start"]) == 2


async def test_a_say_after_a_reply_waits_for_one_sent_during_it_that_is_still_being_stored(
    harness: Harness, fake_llm: FakeOpenAI, held: HeldSays
) -> None:
    """The conversation is idle again, but an earlier say is not stored yet: the new one
    must not be answered first."""
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply(SLOW, chunk=3, delay=0.05), Reply("Owen, fine."), Reply("Hannah too."))
    release = held.hold("Owen comes too.")
    phone = await harness.phone()
    other = await harness.phone(phone.device)
    await phone.say("Plan my Saturday.", "m1")
    await phone.expect("reply.delta")
    await phone.send({"type": "say", "id": "m2", "text": "Owen comes too."})
    await held.reach("Owen comes too.")
    assert (await phone.reply())["text"] == SLOW
    told = _told(harness, phone)
    await other.send({"type": "say", "id": "m3", "text": "And Hannah."})
    await _handled(harness, phone, told)
    release.set()
    assert (await phone.expect("reply.start"))["in_reply_to"] == ["m2"]
    assert (await phone.reply())["text"] == "Owen, fine."
    assert (await phone.expect("reply.start"))["in_reply_to"] == ["m3"]
    assert (await phone.reply())["text"] == "Hannah too."


async def test_a_say_that_cannot_be_stored_is_refused_and_the_talk_goes_on(
    harness: Harness, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, db: asyncpg.Connection
) -> None:
    """The refused say leaves nothing behind: not in the record, not in the next turn's window,
    and the next say is stored and answered."""
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Reply("One or two?"), Reply("Two nights, then."))
    add_say = Store.add_say

    async def failing(store: Store, *args: Any, **kwargs: Any) -> StoredSay:
        if args[3] == "lost in a storm":  # the text, after conversation, person, client_id
            raise RuntimeError("injected: the disk is full")
        return await add_say(store, *args, **kwargs)

    monkeypatch.setattr(Store, "add_say", failing)
    phone = await harness.phone()
    await phone.say("Book the hotel.", "m1")
    await phone.reply()
    await phone.send({"type": "say", "id": "m2", "text": "lost in a storm"})
    error = await phone.expect("error")
    assert (error["code"], error["id"]) == ("internal_error", "m2")
    await phone.say("two", "m3")
    assert (await phone.reply())["text"] == "Two nights, then."
    assert _contents(fake_llm.requests[1])[1:] == ["Book the hotel.", "One or two?", "two"]
    rows = await db.fetch("SELECT text FROM turns WHERE role = 'user' ORDER BY id")
    assert [r["text"] for r in rows] == ["Book the hotel.", "two"]


async def test_a_reply_ends_before_its_write_and_the_next_say_is_stored_after_it(
    harness: Harness, held_replies: HeldReplies, db: asyncpg.Connection
) -> None:
    """`reply.end` leaves beside its reply's write, not after it; a say that follows waits
    for that write, so the record keeps the order things were said."""
    await harness.start()
    phone = await harness.phone()
    await phone.say("Book the hotel.", "m1")
    await phone.reply()
    await asyncio.wait_for(held_replies.reached.wait(), 10)
    assert await db.fetchval("SELECT count(*) FROM turns WHERE role = 'assistant'") == 0
    await phone.send({"type": "say", "id": "m2", "text": "two"})
    await asyncio.sleep(0.3)  # long enough for the say to be stored, were it not to wait
    held_replies.release.set()
    assert (await phone.expect("ack"))["id"] == "m2"
    await phone.reply()
    await harness.recorded()
    rows = await db.fetch("SELECT role, client_id FROM turns ORDER BY id")
    assert [(r["role"], r["client_id"]) for r in rows] == [
        ("user", "m1"),
        ("assistant", None),
        ("user", "m2"),
        ("assistant", None),
    ]
