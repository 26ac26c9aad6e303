"""Loose ends and open threads end to end: noted after each exchange by the rules, and by
a fake analysis model over HTTP where the rules are unsure whether a say answers one of our
questions; handed to the next replies, listed and closed over `GET /v1/threads`.

The fake answers each `reply-matching` request about a say with the A line whose text the
test gives for it (`answers`), or "none", as a model reading it would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from actors.loose_ends import TEXT_CHARS, in_order, settled
from providers.notes import LOOSE_ASSISTANT, LOOSE_ENDS, LOOSE_PERSON, LOOSE_THREADS
from providers.rehearsal_analysis import loose_reading
from storage.records import excerpt
from tests.conftest import Harness, Phone
from tests.fakes.analysis_server import (
    AnalysisResponse,
    Answer,
    Asked,
    FakeAnalysis,
    neutral,
)
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.test_reply_matching import counters

HOUR = 3600.0
BOOK = "Did you finish that book?"


class Ends:
    """What the fake model reads each say as answering: say text -> A line text."""

    def __init__(self) -> None:
        self.answers: dict[str, str] = {}

    def answer(self, request: Asked) -> AnalysisResponse:
        if request.task != "reply-matching":
            return neutral(request)
        said = dict(line.split(": ", 1) for line in request.lines)
        label = {text: ref for ref, text in said.items() if ref.startswith("A")}
        return Answer({"answers": label.get(self.answers.get(said["P1"], ""), "none")})


@pytest.fixture
def ends() -> Ends:
    return Ends()


@pytest.fixture
async def analysis(ends: Ends) -> AsyncIterator[FakeAnalysis]:
    async with FakeAnalysis(default=ends.answer) as fake:
        yield fake


class Talk:
    """A phone talking to a server whose chat model is `fake_llm`."""

    def __init__(self, harness: Harness, fake_llm: FakeOpenAI, phone: Phone) -> None:
        self.harness, self.fake_llm, self.phone = harness, fake_llm, phone

    async def exchange(self, text: str, reply: str = "I see.") -> None:
        """Say `text`, get `reply`, and let the loose ends of the exchange be noted."""
        self.fake_llm.queue(Reply(reply))
        ack = await self.phone.say(text)
        await self.phone.expect("reply.end", lambda f: f["seq"] > ack["seq"])
        await self.harness.server.runtime.settle(5.0)

    @property
    def note(self) -> str | None:
        return loose_note(self.fake_llm)


async def start(harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis) -> Talk:
    await harness.start(llm_url=fake_llm.url, analysis_url=analysis.url)
    return Talk(harness, fake_llm, await harness.phone())


def loose_note(fake_llm: FakeOpenAI) -> str | None:
    """The LOOSE ENDS note the last chat request carried, if any."""
    messages: list[dict[str, Any]] = fake_llm.requests[-1]["messages"]
    return next((m["content"] for m in messages if m["content"].startswith(LOOSE_ENDS)), None)


async def threads(harness: Harness, phone: Phone) -> list[dict[str, Any]]:
    async with harness.http.get(
        harness.url("/v1/threads"), headers={"X-Stillhere-Device": phone.device}
    ) as response:
        assert response.status == 200
        return (await response.json())["threads"]


async def test_at_most_three_the_persons_first_from_the_last_six_hours(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis, ends: Ends
) -> None:
    talk = await start(harness, fake_llm, analysis)
    says = ["is the dentist on Friday?", "what about the car?", "and the boiler?", "the kids?"]
    for text in says:  # questions the reply shares no word with: left open
        await talk.exchange(text, "Right.")
        harness.clock.advance(60)
    await talk.exchange("hmm", "Did you sleep well?")

    await talk.exchange("ok thanks")  # a lull, and still the person's come first
    assert talk.note == (
        f"{LOOSE_ENDS}\n"
        'Points of theirs you have not addressed yet: "the kids?"; "and the boiler?"; '
        '"what about the car?".'
    )

    harness.clock.advance(6 * HOUR + 60)
    await talk.exchange("ok thanks")
    assert talk.note is None  # all of them older than six hours


async def test_our_own_questions_wait_for_a_lull(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis, ends: Ends
) -> None:
    talk = await start(harness, fake_llm, analysis)
    await talk.exchange("hi", BOOK)
    # The rules cannot tell whether this answers the book; the model reads it as new.
    await talk.exchange("my car broke down this morning", "Oh no, poor you.")
    assert talk.note is None  # mid-topic: the book does not come up
    await talk.exchange("haha, true")
    assert talk.note == (f'{LOOSE_ENDS}\n{LOOSE_ASSISTANT} "{BOOK}".')
    await talk.exchange("yes I did, loved it")  # answered at last
    await talk.exchange("ok thanks")
    assert talk.note is None


async def test_open_threads_are_listed_until_taken_up(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis, ends: Ends
) -> None:
    talk = await start(harness, fake_llm, analysis)
    promise = "I'll tell you the rest of the lighthouse story later."
    await talk.exchange("tell me about the lighthouse", promise)
    listed = await threads(harness, talk.phone)
    assert [(t["by"], t["kind"], t["text"]) for t in listed] == [("assistant", "thread", promise)]
    assert set(listed[0]) == {"id", "by", "kind", "text", "at"}

    harness.clock.advance(8 * HOUR)  # threads outlive the six hours of loose ends
    await talk.exchange("anyway")
    assert talk.note == (f'{LOOSE_ENDS}\nOpen threads you may come back to later: "{promise}".')
    other = await harness.phone()
    assert await threads(harness, other) == []  # another person's threads are not theirs

    await talk.exchange("so how did it end?", "The lighthouse keeper came home at last.")
    assert await threads(harness, talk.phone) == []


async def test_their_promise_is_a_thread_until_they_tell_it(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis
) -> None:
    """The reply right after their promise cannot take it up, though it speaks of it."""
    talk = await start(harness, fake_llm, analysis)
    promise = "long story about the airport, I'll tell you tonight"
    await talk.exchange(promise, "The airport? I can't wait!")
    listed = await threads(harness, talk.phone)
    assert [(t["by"], t["kind"], t["text"]) for t in listed] == [("person", "thread", promise)]
    await talk.exchange("so, at the airport they lost my bag", "Oh no, your bag!")
    assert await threads(harness, talk.phone) == []


async def test_a_point_passed_over_comes_back_a_question_put_off_does_not(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis
) -> None:
    """A point they add that the reply passes over is theirs to hear about; a question the
    reply puts off ("I'll get back to you") is its thread, not a point of theirs too."""
    talk = await start(harness, fake_llm, analysis)
    later = "I'll look into it and get back to you."
    await talk.exchange("is the pool open on bank holidays?", later)
    said = "the meeting went well. oh and my car broke down"
    await talk.exchange(said, "Glad the meeting went well!")
    await talk.exchange("ok thanks")
    assert talk.note == f'{LOOSE_ENDS}\n{LOOSE_PERSON} "{said}".\n{LOOSE_THREADS} "{later}".'


async def test_threads_need_credentials(harness: Harness, fake_llm: FakeOpenAI) -> None:
    await harness.start(llm_url=fake_llm.url)
    async with harness.http.get(harness.url("/v1/threads")) as response:
        assert response.status == 401
        assert (await response.json())["code"] == "unauthorized"


async def two_candidates(talk: Talk, say: str) -> None:
    """The book asked; "hold on" answers nothing, so the book waits beside the next
    message; then `say`, which the rules cannot place: the turn asks the analysis."""
    await talk.exchange("hi", BOOK)
    await talk.exchange("hold on", "Sure, take your time.")
    await talk.exchange(say, "Wow, a late night!")


async def test_the_turns_reading_of_a_say_decides_what_the_rules_cannot(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis, ends: Ends
) -> None:
    """Whether this answers the book, no rule can tell; the turn's analysis reads it as the
    answer, so the question is not left open, and nothing more is asked for loose ends."""
    talk = await start(harness, fake_llm, analysis)
    ends.answers["got to the last page at midnight"] = BOOK
    await two_candidates(talk, "got to the last page at midnight")
    await talk.exchange("ok thanks")
    assert talk.note is None
    assert [a.lines for a in analysis.asked] == [
        [f"A1: {BOOK}", "A2: Sure, take your time.", "P1: got to the last page at midnight"]
    ]


async def test_without_a_usable_reading_the_rules_reading_stands(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis
) -> None:
    talk = await start(harness, fake_llm, analysis)
    analysis.queue(Answer({"answers": "A7"}), task="reply-matching")
    await two_candidates(talk, "got to the last page at midnight")
    await talk.exchange("haha, true")
    assert talk.note == f'{LOOSE_ENDS}\n{LOOSE_ASSISTANT} "{BOOK}".'
    failures = await counters(harness, "stillhere_analysis_failures")
    assert failures == {'reason="bad_shape",task="reply-matching"': 1.0}


def test_a_long_question_read_as_answered_is_closed_as_stored() -> None:
    """A question is stored cut to its first characters, and read whole as the message the
    says followed: a reading of either is compared as stored."""
    question = "Did you finish that book? " + "It was a very long one, I remember. " * 8
    a_lines = [question, "Wow."]
    reading = loose_reading(in_order(a_lines, ["my car broke down this morning"]))
    assert [r.ref for r in reading if not r.sure] == ["A1"]
    assert settled(reading, a_lines, None)[0][:2] == ("A", 0)  # the rules: left open
    assert settled(reading, a_lines, {excerpt(question, TEXT_CHARS)}) == []
