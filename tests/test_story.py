"""The train-tunnel story: the link dies, the conversation does not."""

from __future__ import annotations

from tests.conftest import Harness
from tests.fakes.openai_server import FakeOpenAI, Reply


async def test_rehearsal_story_over_websocket(harness: Harness) -> None:
    await harness.start()
    phone = await harness.phone()
    assert phone.welcome["resumed"] is False
    await phone.say("Note that Owen arrives Friday evening, he is staying with us.")
    card = await phone.expect("card")
    assert "Owen arrives Friday evening" in card["card"]["text"]
    await phone.reply()
    await phone.say("And remind me to get the spare bed out on Thursday.")
    reminder = await phone.expect("reminder")
    assert reminder["reminder"]["due"] == "on Thursday"
    await phone.reply()
    conversation = phone.welcome["conversation"]
    await phone.drop()
    harness.clock.advance(10)
    again = await harness.phone(phone.device, conversation=conversation, last_seq=phone.last_seq)
    assert again.welcome["resumed"] is True
    assert again.welcome["conversation"] == conversation
    assert again.welcome["age_s"] == 10
    assert [c["text"] for c in again.welcome["cards"]] == [card["card"]["text"]]
    await again.say("two")
    end = await again.reply()
    assert "remind you to get the spare bed out" in end["text"]


def _handed(request: dict) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in request["messages"]]


async def test_two_means_two_nights_after_a_tunnel(harness: Harness, fake_llm: FakeOpenAI) -> None:
    """With a real HTTP model: after the drop, the model is handed the question it asked."""
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(
        Reply("", tool_calls=[("remember", {"text": "Owen arrives Friday evening"})]),
        Reply("Noted."),
        Reply("", tool_calls=[("schedule_reminder", {"text": "spare bed", "when": "Thursday"})]),
        Reply("Reminder set. For one night or two?"),
        Reply("Two nights it is."),
    )
    phone = await harness.phone()
    await phone.say("Note that Owen arrives Friday evening, he is staying with us.")
    await phone.reply()
    await phone.say("And remind me to get the spare bed out on Thursday.")
    asked = await phone.reply()
    assert asked["text"] == "Reminder set. For one night or two?"
    await phone.drop()
    harness.clock.advance(10)
    again = await harness.phone(phone.device)
    assert again.welcome["resumed"] is True
    await again.say("two")
    assert (await again.reply())["text"] == "Two nights it is."
    handed = _handed(fake_llm.requests[-1])
    assert handed[-2:] == [
        ("assistant", "Reminder set. For one night or two?"),
        ("user", "two"),
    ]
    assert "Owen arrives Friday evening" in handed[0][1]  # the session's card


async def test_a_restart_keeps_each_card_by_its_reply_and_each_cut_marked(
    harness: Harness,
) -> None:
    """What the app places and marks after a reload, from the record alone (a new server
    process reads it back): a card names the reply it came with, a cut reply is marked."""
    await harness.start(rehearsal_rate=200.0)
    phone = await harness.phone()
    await phone.say("Note that Owen arrives Friday evening")
    start = await phone.expect("reply.start")
    card = await phone.expect("card")
    assert card["card"]["reply"] == start["reply"]
    await phone.reply()
    await phone.say("tell me a story about the sea")
    await phone.expect("reply.delta")
    await phone.send({"type": "interrupt"})
    cut = await phone.reply()
    assert cut["interrupted"] is True
    await phone.say("and after the story")
    await phone.reply()
    live = await harness.phone(phone.device)  # another link, from the actor in memory
    await harness.recorded()
    await harness.stop()

    await harness.start()
    again = await harness.phone(phone.device)
    assert again.welcome["resumed"] is True
    for welcome in (live.welcome, again.welcome):
        [shown] = welcome["cards"]
        assert shown["reply"] == start["reply"]
        marked = [t for t in welcome["history"] if t.get("interrupted")]
        assert [(t["reply"], t["text"], t["interrupted"]) for t in marked] == [
            (cut["reply"], cut["text"], True)
        ]
