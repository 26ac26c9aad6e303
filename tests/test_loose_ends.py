"""Loose ends and open threads end to end: noted after each exchange by a fake analysis
model over HTTP, handed to the next replies, listed and closed over `GET /v1/threads`.

The fake's loose-ends answer lists every line whose text the test holds open (`ends`), so
the test says what is left unaddressed as the conversation goes, and the server's closing
of what it no longer lists is what is under test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from providers.notes import LOOSE_ENDS
from tests.conftest import Harness, Phone
from tests.fakes.analysis_server import (
    AnalysisResponse,
    Answer,
    Asked,
    FakeAnalysis,
    Stall,
    neutral,
)
from tests.fakes.openai_server import FakeOpenAI, Reply

HOUR = 3600.0


class Ends:
    """What the test holds open: line text -> (by, kind)."""

    def __init__(self) -> None:
        self.open: dict[str, tuple[str, str]] = {}

    def answer(self, request: Asked) -> AnalysisResponse:
        if request.task != "loose-ends":
            return neutral(request)
        listed = []
        for line in request.lines:
            ref, _, text = line.partition(": ")
            if text in self.open:
                by, kind = self.open[text]
                listed.append({"by": by, "ref": ref, "text": text, "kind": kind})
        return Answer({"loose_ends": listed})


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
    for text in says:
        ends.open[text] = ("person", "point")
        await talk.exchange(text, "Right.")
        harness.clock.advance(60)
    ends.open["Did you sleep well?"] = ("assistant", "question")
    await talk.exchange("hmm", "Did you sleep well?")

    await talk.exchange("ok thanks")  # a lull, and still the person's come first
    assert talk.note == (
        f"{LOOSE_ENDS}\n"
        'Points of theirs you have not addressed yet: "the kids?"; "and the boiler?"; '
        '"what about the car?".'
    )
    lines = analysis.tasks("loose-ends")[-1].lines
    assert "A1: Did you sleep well?" in lines and "P1: is the dentist on Friday?" in lines

    harness.clock.advance(6 * HOUR + 60)
    await talk.exchange("ok thanks")
    assert talk.note is None  # all of them older than six hours


async def test_our_own_questions_wait_for_a_lull(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis, ends: Ends
) -> None:
    talk = await start(harness, fake_llm, analysis)
    ends.open["Did you finish that book?"] = ("assistant", "question")
    await talk.exchange("hi", "Did you finish that book?")
    await talk.exchange("my car broke down this morning", "Oh no, what happened?")
    assert talk.note is None  # mid-topic: the book does not come up
    await talk.exchange("haha, true")
    assert talk.note == (
        f"{LOOSE_ENDS}\n"
        "Your own questions still unanswered (raise one only if it fits now): "
        '"Did you finish that book?".'
    )
    del ends.open["Did you finish that book?"]  # answered at last
    await talk.exchange("yes I did, loved it")
    await talk.exchange("ok thanks")
    assert talk.note is None


async def test_open_threads_are_listed_until_taken_up(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis, ends: Ends
) -> None:
    talk = await start(harness, fake_llm, analysis)
    promise = "I'll tell you the rest of the lighthouse story later."
    ends.open[promise] = ("assistant", "thread")
    await talk.exchange("tell me about the lighthouse", promise)
    listed = await threads(harness, talk.phone)
    assert [(t["by"], t["kind"], t["text"]) for t in listed] == [("assistant", "thread", promise)]
    assert set(listed[0]) == {"id", "by", "kind", "text", "at"}

    harness.clock.advance(8 * HOUR)  # threads outlive the six hours of loose ends
    await talk.exchange("anyway")
    assert talk.note == (f'{LOOSE_ENDS}\nOpen threads you may come back to later: "{promise}".')
    other = await harness.phone()
    assert await threads(harness, other) == []  # another person's threads are not theirs

    del ends.open[promise]
    await talk.exchange("so how did it end?", "The keeper came home at last.")
    assert await threads(harness, talk.phone) == []


async def test_threads_need_credentials(harness: Harness, fake_llm: FakeOpenAI) -> None:
    await harness.start(llm_url=fake_llm.url)
    async with harness.http.get(harness.url("/v1/threads")) as response:
        assert response.status == 401
        assert (await response.json())["code"] == "unauthorized"


async def test_a_broken_answer_closes_nothing(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis, ends: Ends
) -> None:
    talk = await start(harness, fake_llm, analysis)
    promise = "I will tell you later."
    ends.open[promise] = ("assistant", "thread")
    await talk.exchange("go on", promise)
    analysis.queue(
        Answer({"loose_ends": [{"by": "person", "ref": "P9", "text": "x"}]}), task="loose-ends"
    )
    await talk.exchange("and?")
    assert [t["text"] for t in await threads(harness, talk.phone)] == [promise]


async def test_loose_ends_are_off_the_replys_path(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis
) -> None:
    """A loose-ends analysis that never answers delays no reply: each is asked once its
    reply has ended, and the next say is answered while it still hangs."""
    await harness.start(llm_url=fake_llm.url, analysis_url=analysis.url, analysis_timeout=60.0)
    analysis.queue(Stall(), Stall(), task="loose-ends")
    fake_llm.queue(Reply("How was your weekend?"), Reply("Lovely."))
    phone = await harness.phone()
    first = await phone.say("hi")
    await phone.expect("reply.end", lambda f: f["seq"] > first["seq"])
    second = await phone.say("great, we went hiking")
    end = await phone.expect("reply.end", lambda f: f["seq"] > second["seq"])
    assert end["text"] == "Lovely." and "error" not in end
    assert len(analysis.tasks("loose-ends")) >= 1  # asked, and still unanswered
