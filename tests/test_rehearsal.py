"""The rehearsal model: deterministic answers that show what a turn handed the model."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from actors.echo import NO_REPEAT
from actors.prompt import build_messages
from cli.main import _parser
from providers.chat import ChatEvent, ChatMessage, TextDelta, ToolCall, ToolSpec
from providers.notes import CUT_MARK, NOTE_DURING_REPLY, NOTE_INTERRUPTED, SUMMARY_PROMPT
from providers.rehearsal import RehearsalModel
from storage.records import Turn
from tests.conftest import Harness
from transport.config import settings_from

AT = datetime(2024, 5, 6, 12, 0, tzinfo=UTC)
OBJECT = {"type": "object", "properties": {}}
READING_S = 1.0  # from a reply's first words to a person pressing Stop
TOOLS = [
    ToolSpec("remember", "Store a memory card.", OBJECT),
    ToolSpec("schedule_reminder", "Schedule a reminder.", OBJECT),
    ToolSpec("set_speaker", "Note who is talking.", OBJECT),
    ToolSpec("show_page", "Show a page.", OBJECT),
]


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


def turn(role: str, text: str, *, interrupted: bool = False) -> Turn:
    return Turn(role, text, AT, interrupted=interrupted)


def window(
    history: list[Turn],
    new: list[str],
    *,
    during_reply: bool = False,
    after_interrupt: bool = False,
) -> list[ChatMessage]:
    """Messages exactly as a turn builds them, so the tests follow the real prompt."""
    messages, _ = build_messages(
        history,
        [turn("user", text) for text in new],
        speaker=None,
        cards=[],
        during_reply=during_reply,
        after_interrupt=after_interrupt,
    )
    return messages


async def events(
    messages: list[ChatMessage],
    tools: list[ToolSpec] | None = None,
    model: RehearsalModel | None = None,
) -> list[ChatEvent]:
    chat = model or RehearsalModel()
    return [e async for e in chat.stream(messages, TOOLS if tools is None else tools)]


def text_of(evs: list[ChatEvent]) -> str:
    return "".join(e.text for e in evs if isinstance(e, TextDelta))


def calls_of(evs: list[ChatEvent]) -> list[ToolCall]:
    return [e for e in evs if isinstance(e, ToolCall)]


async def reply(messages: list[ChatMessage], tools: list[ToolSpec] | None = None) -> str:
    evs = await events(messages, tools)
    assert not calls_of(evs)
    return text_of(evs)


async def only_call(text: str, tools: list[ToolSpec] | None = None) -> ToolCall:
    evs = await events(window([], [text]), tools)
    assert not text_of(evs), "a tool call turn yields no text"
    [call] = calls_of(evs)
    return call


# --- the everyday reply -------------------------------------------------------------------


async def test_label_says_it_is_not_a_real_model_and_close_is_harmless() -> None:
    model = RehearsalModel()
    assert model.label == "rehearsal (built-in, not a real model)"
    await model.close()


async def test_plain_message_is_said_back() -> None:
    text = await reply(window([], ["Hello there!"]))
    assert text == '[rehearsal] You said "Hello there!". (0 earlier turns in view.)'


async def test_text_reply_streams_one_delta_per_word() -> None:
    evs = await events(window([], ["what a lovely morning it is"]))
    deltas = [e.text for e in evs if isinstance(e, TextDelta)]
    assert len(deltas) == len(text_of(evs).split()) > 5
    assert all(d.endswith(" ") for d in deltas[:-1])
    assert not deltas[-1].endswith(" ")


async def test_same_messages_give_the_same_events() -> None:
    for messages in (window([], ["how are you?"]), window([], ["remind me to call Jo at 5"])):
        assert await events(messages) == await events(messages)


async def test_previous_reply_is_quoted_and_history_counted() -> None:
    history = [turn("user", "hi"), turn("assistant", "Hello! How can I help?")]
    text = await reply(window(history, ["nothing much"]))
    assert text == (
        '[rehearsal] You said "nothing much". Just before, I said: "Hello! How can I help?". '
        "(2 earlier turns in view.)"
    )


async def test_interrupted_reply_is_quoted_without_the_cut_mark() -> None:
    history = [turn("user", "hi"), turn("assistant", "Well, let me think", interrupted=True)]
    messages = window(history, ["stop"], after_interrupt=True)
    assert CUT_MARK in messages[2].content  # the prompt marks the cut...
    text = await reply(messages)
    assert 'Just before, I said: "Well, let me think".' in text  # ...the quote does not
    assert CUT_MARK.strip() not in text
    assert "I know I was interrupted." in text


async def test_a_long_previous_reply_is_quoted_by_its_first_sentence() -> None:
    said = "Sentence 1 of the story about a lighthouse, told slowly. " * 3
    text = await reply(window([turn("user", "go on"), turn("assistant", said)], ["ok"]))
    quoted = "Sentence 1 of the story about a lighthouse, told slowly…"
    assert f'Just before, I said: "{quoted}".' in text


async def test_a_first_sentence_that_quotes_keeps_its_closing_quote() -> None:
    said = 'You said "yes, loved it!". Just before, I said: "Did you finish that book?".'
    said += " (6 earlier turns in view.)"
    text = await reply(window([turn("user", "go on"), turn("assistant", said)], ["ok"]))
    assert 'Just before, I said: "You said "yes, loved it!"…".' in text


async def test_a_long_first_sentence_is_quoted_to_a_word_boundary() -> None:
    said = " ".join(f"word{i}" for i in range(40))
    text = await reply(window([turn("user", "go on"), turn("assistant", said)], ["ok"]))
    quoted = " ".join(f"word{i}" for i in range(13))  # 79 characters; with word13, 86
    assert f'Just before, I said: "{quoted}…".' in text


async def test_a_first_word_longer_than_the_quote_is_cut_inside_it() -> None:
    said = "x" * 100
    text = await reply(window([turn("user", "go on"), turn("assistant", said)], ["ok"]))
    assert f'Just before, I said: "{"x" * 80}…".' in text


async def test_the_previous_reply_is_quoted_without_its_label() -> None:
    """Its start is what it said, not the label "[rehearsal] "."""
    history = [
        turn("user", "yes, loved it!"),
        turn("assistant", '[rehearsal] You said "yes, loved it!". (6 earlier turns in view.)'),
    ]
    text = await reply(window(history, ["it was great, went hiking"]))
    assert 'Just before, I said: "You said "yes, loved it!". (6 earlier turns in view.)".' in text
    assert text.count("[rehearsal]") == 1


async def test_asked_again_after_an_echo_it_quotes_the_say_never_an_empty_quote() -> None:
    """The echo guard's second call ends with an instruction not to repeat: the say is the
    last before it, and there is no empty quote of anything."""
    history = [turn("user", "hi"), turn("assistant", "", interrupted=True)]
    messages = window(history, ["ask me: how was your weekend?"])
    messages.append(ChatMessage("system", NO_REPEAT))
    text = await reply(messages)  # the reply cut before its first word is no message
    assert (
        text == '[rehearsal] You said "ask me: how was your weekend?". (1 earlier turns in view.)'
    )
    assert '""' not in text


async def test_nothing_to_quote_leaves_the_quote_out() -> None:
    messages = window([turn("assistant", "  ")], [])
    text = await reply(messages)
    assert text == "[rehearsal] (1 earlier turns in view.)"


async def test_several_new_messages_are_counted() -> None:
    text = await reply(window([], ["one", "two", "three"]))
    assert 'You said "three".' in text
    assert "You sent 3 messages." in text
    assert "while I was writing" not in text


async def test_messages_sent_during_a_reply_are_noticed() -> None:
    history = [turn("user", "tell me"), turn("assistant", "Sure, so", interrupted=True)]
    messages = window(history, ["wait", "actually no"], during_reply=True, after_interrupt=True)
    assert any(NOTE_DURING_REPLY in m.content for m in messages if m.role == "system")
    text = await reply(messages)
    assert text == (
        '[rehearsal] You said "actually no". Just before, I said: "Sure, so". '
        "You sent 2 messages while I was writing. I know I was interrupted. "
        "(2 earlier turns in view.)"
    )


async def test_notes_are_not_imagined() -> None:
    history = [turn("user", "hi"), turn("assistant", "Hello")]
    text = await reply(window(history, ["a", "b"]))
    assert NOTE_INTERRUPTED not in text
    assert "interrupted" not in text
    assert "while I was writing" not in text


# --- tool calls ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("said", "remembered"),
    [
        ("Note that my sister is called Ada.", "my sister is called Ada"),
        ("remember that the wifi password is Tulip42!", "the wifi password is Tulip42"),
        ("Remember Ben hates coriander", "Ben hates coriander"),
        ("And note that the car is at the garage.", "the car is at the garage"),
    ],
)
async def test_remember_phrasings(said: str, remembered: str) -> None:
    call = await only_call(said)
    assert call == ToolCall("rehearsal-1", "remember", {"text": remembered, "kind": "fact"})


@pytest.mark.parametrize(
    ("said", "what", "when"),
    [
        (
            "And remind me to get the spare bed out on Thursday.",
            "get the spare bed out",
            "on Thursday",
        ),
        ("Remind me to call Mum tomorrow at 9", "call Mum", "tomorrow at 9"),
        ("remind me to take the bins out tonight!", "take the bins out", "tonight"),
        ("remind me to book the dentist next week", "book the dentist", "next week"),
        ("Remind me to pay rent by Friday.", "pay rent", "by Friday"),
        ("remind me to meet Sam at noon on Monday", "meet Sam", "at noon on Monday"),
        ("Remind me to water the plants.", "water the plants", "unspecified"),
    ],
)
async def test_reminder_phrasings(said: str, what: str, when: str) -> None:
    call = await only_call(said)
    assert call == ToolCall("rehearsal-1", "schedule_reminder", {"text": what, "when": when})


@pytest.mark.parametrize(
    ("said", "name"),
    [
        ("This is Anna speaking.", "Anna"),
        ("Ben speaking", "Ben"),
        ("It's Carla here!", "Carla"),
        ("it\u2019s Dora here", "Dora"),
        ("Hi, this is Eve.", "Eve"),
        ("It's me again.", ""),
        ("back to the owner", ""),
    ],
)
async def test_speaker_phrasings(said: str, name: str) -> None:
    call = await only_call(said)
    assert call == ToolCall("rehearsal-1", "set_speaker", {"name": name})


@pytest.mark.parametrize(
    ("said", "title"),
    [
        ("Show me a page about the Bristol weather.", "Bristol weather"),
        ("show me a page on opening hours", "Opening hours"),
        ("And show me a page about trains", "Trains"),
    ],
)
async def test_page_phrasings(said: str, title: str) -> None:
    call = await only_call(said)
    assert call.name == "show_page" and call.arguments["title"] == title
    assert call.arguments["body"].startswith("A page about ")
    confirmed = await reply(after_tools(ToolCall("id-show_page", "show_page", call.arguments)))
    assert confirmed == f"Here is a page: {title}."


@pytest.mark.parametrize(
    "said", ["this is great", "Who's speaking?", "remind me", "show me the way"]
)
async def test_lookalikes_are_not_tool_calls(said: str) -> None:
    text = await reply(window([], [said]))
    assert text.startswith(f'[rehearsal] You said "{said}".')


async def test_tool_is_called_only_when_offered() -> None:
    messages = window([], ["Note that the keys are in the drawer."])
    text = await reply(messages, tools=[])
    assert text.startswith('[rehearsal] You said "Note that the keys are in the drawer.".')
    others = [t for t in TOOLS if t.name != "remember"]
    assert not calls_of(await events(messages, others))


async def test_only_the_last_new_message_is_read_for_tools() -> None:
    evs = await events(window([], ["remind me to call Jo at 5", "how are you?"]))
    assert not calls_of(evs)
    [call] = calls_of(await events(window([], ["how are you?", "remind me to call Jo at 5"])))
    assert call.arguments == {"text": "call Jo", "when": "at 5"}


# --- the round after the tools ------------------------------------------------------------


def after_tools(*calls: ToolCall) -> list[ChatMessage]:
    """The messages of a turn's second round: the call, then one result per call."""
    messages = window([], ["do things"])
    messages.append(ChatMessage("assistant", "", tool_calls=list(calls)))
    messages.extend(ChatMessage("tool", '{"ok": true}', tool_call_id=c.id) for c in calls)
    return messages


def call(tool: str, /, **arguments: Any) -> ToolCall:
    return ToolCall(f"id-{tool}", tool, arguments)


async def test_tool_results_are_confirmed_in_order() -> None:
    messages = after_tools(
        call("remember", text="Ada likes tea", kind="fact"),
        call("schedule_reminder", text="get the spare bed out", when="on Thursday"),
        call("set_speaker", name="Anna"),
    )
    assert await reply(messages) == (
        "Noted: Ada likes tea. I'll remind you to get the spare bed out (on Thursday). "
        "Hello Anna, I'll keep in mind it's you speaking."
    )


async def test_owner_back_is_confirmed() -> None:
    assert await reply(after_tools(call("set_speaker", name=""))) == "Back to the owner."


async def test_confirmation_reads_the_last_assistant_call() -> None:
    messages = after_tools(call("remember", text="old"))
    messages.append(user("and now"))
    messages.append(ChatMessage("assistant", "", tool_calls=[call("remember", text="new")]))
    messages.append(ChatMessage("tool", "{}", tool_call_id="id-remember"))
    assert await reply(messages) == "Noted: new."


async def test_a_whole_tool_turn_round_trips() -> None:
    """Call, then confirm: the two rounds a turn runs against the model."""
    messages = window([], ["And remind me to get the spare bed out on Thursday."])
    [first] = calls_of(await events(messages))
    messages.append(ChatMessage("assistant", "", tool_calls=[first]))
    messages.append(ChatMessage("tool", '{"scheduled": true}', tool_call_id=first.id))
    assert await reply(messages) == "I'll remind you to get the spare bed out (on Thursday)."


# --- long replies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("said", "topic"),
    [
        ("Tell me a story about a lighthouse.", "a lighthouse"),
        ("tell me about Lisbon", "Lisbon"),
        ("Talk about the weather, please", "the weather"),
    ],
)
async def test_long_replies_on_request(said: str, topic: str) -> None:
    evs = await events(window([], [said]))
    text = text_of(evs)
    assert len(text.split()) >= 60
    assert len(evs) == len(text.split())
    assert text.startswith(f"Sentence 1 of the story about {topic}")


async def test_story_without_topic_is_still_long() -> None:
    assert len((await reply(window([], ["tell me a story"]))).split()) >= 60


async def test_a_long_reply_can_be_cut_off_mid_stream() -> None:
    received: list[ChatEvent] = []
    model = RehearsalModel()

    async def consume() -> None:
        async for event in model.stream(window([], ["tell me a story"]), TOOLS):
            received.append(event)

    task = asyncio.create_task(consume())
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    total = len(await events(window([], ["tell me a story"])))
    assert 0 < len(received) < total


# --- summaries ----------------------------------------------------------------------------


async def test_summary_of_a_transcript() -> None:
    lines = [
        "You: Could you help me plan Saturday? I have a lot on and little time.",
        "Me: Of course. What is fixed?",
        "the match at ten, and lunch",  # a turn's text can span several lines
        "You: Thanks",
    ]
    messages = [ChatMessage("system", SUMMARY_PROMPT), user("\n".join(lines))]
    text = await reply(messages, tools=[])
    first = "Could you help me plan Saturday…"
    assert text == f'Summary: 3 turns. It began with "{first}".'


async def test_summary_without_a_say_quotes_nothing() -> None:
    messages = [ChatMessage("system", SUMMARY_PROMPT), user("Me: Hello")]
    assert await reply(messages, tools=[]) == "Summary: 1 turns."


async def test_summary_wins_over_tool_phrasings() -> None:
    messages = [ChatMessage("system", SUMMARY_PROMPT), user("You: remember that I like tea")]
    assert await reply(messages) == 'Summary: 1 turns. It began with "remember that I like tea".'


# --- pacing -------------------------------------------------------------------------------


async def test_pacing_changes_no_events() -> None:
    messages = window([], ["what a lovely morning it is"])
    paced = await events(messages, model=RehearsalModel(latency=0.001, tokens_per_s=2000.0))
    assert paced == await events(messages)
    assert len(paced) > 5


async def _suspends(stream: Any) -> bool:
    """Whether taking the stream's next event gave the loop a turn."""
    ran: list[int] = []
    asyncio.get_running_loop().call_soon(ran.append, 1)
    await anext(stream)
    return bool(ran)


async def test_pacing_follows_the_clock_when_the_loop_is_late() -> None:
    """Words that fell due while the loop was busy come at once, as from a socket buffer;
    once caught up, the next word waits for its time again."""
    messages = window([], ["tell me a long story about the sea and the boats"])
    model = RehearsalModel(tokens_per_s=20.0)
    stream = model.stream(messages, TOOLS)
    await anext(stream)
    time.sleep(0.2)  # the loop is busy elsewhere: words 1 to 4 fall due meanwhile
    assert [await _suspends(stream) for _ in range(4)] == [False] * 4
    assert await _suspends(stream)
    await stream.aclose()


async def test_negative_pacing_is_refused() -> None:
    with pytest.raises(ValueError):
        RehearsalModel(latency=-1.0)
    with pytest.raises(ValueError):
        RehearsalModel(tokens_per_s=-1.0)


async def test_by_default_a_story_streams_slowly_enough_to_be_stopped(harness: Harness) -> None:
    """`stillhere serve` as the README runs it, with no pace given: a person who reads the
    first words and presses Stop a second later still cuts the story (at once, it had
    arrived whole before anyone could press anything)."""
    default = settings_from(_parser().parse_args(["serve"]))
    pace = {"rehearsal_latency": default.rehearsal_latency}
    await harness.start(**pace, rehearsal_rate=default.rehearsal_rate)
    phone = await harness.phone()
    await phone.say("tell me a story about the lighthouse")
    await phone.expect("reply.delta")
    await asyncio.sleep(READING_S)
    await phone.send({"type": "interrupt"})
    end = await phone.reply()
    assert end["interrupted"] is True, "the story had ended before Stop"
