"""Reply matching end to end: which assistant message each say answers (PROTOCOL 1.1).

The seed's two stories over WebSocket and SSE, with the built-in rehearsal models (a first
run) and with fake models over HTTP (what the chat model is handed); the easy cases that
ask nothing; an analysis model down, slow or answering garbage; a resume.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from providers.notes import REPLY_ASK, REPLY_CONTEXT
from tests.conftest import Harness, Phone
from tests.fakes.analysis_server import (
    AnalysisResponse,
    Answer,
    Asked,
    Down,
    FakeAnalysis,
    Stall,
)
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.sse_client import EventStream, SseClient
from tests.test_restart import ServerProcess, hello

WEEKEND = "ask me: how was your weekend?"
BOOK = "ask me: did you finish that book?"


@pytest.fixture
async def analysis() -> AsyncIterator[FakeAnalysis]:
    async with FakeAnalysis() as fake:
        yield fake


def reply_note(request: dict[str, Any]) -> str | None:
    """The REPLY CONTEXT note a chat request carried, if any."""
    notes = [m["content"] for m in request["messages"] if m["content"].startswith(REPLY_CONTEXT)]
    return notes[0] if notes else None


async def counters(harness: Harness, name: str) -> dict[str, float]:
    """One counter family from `GET /metrics`, by its label values."""
    async with harness.http.get(harness.url("/metrics")) as response:
        text = await response.text()
    found = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_total{{"):
            labels, value = line[len(name) + 7 :].rsplit("} ", 1)
            found[labels] = float(value)
    return found


async def turn(phone: Phone, text: str, id_: str | None = None) -> dict[str, Any]:
    """Say `text`; the reply.end that answers it."""
    ack = await phone.say(text, id_)
    return await phone.expect("reply.end", lambda f: f["seq"] > ack["seq"])


def frames_after(phone: Phone, seq: int, type_: str) -> list[dict[str, Any]]:
    return [f for f in phone.frames if f["type"] == type_ and f.get("seq", 0) > seq]


# -- the stories, on a first run -----------------------------------------------------------


async def test_weekend_story_over_websocket_on_a_first_run(harness: Harness) -> None:
    await harness.start()
    phone = await harness.phone()
    weekend = await turn(phone, WEEKEND)
    assert weekend["text"] == "How was your weekend?"
    book = await turn(phone, BOOK)
    assert book["text"] == "Did you finish that book?"
    loved = await turn(phone, "yes, loved it!")
    assert REPLY_CONTEXT not in loved["text"] and "[" not in loved["text"].removeprefix(
        "[rehearsal]"
    )

    ack = await phone.say("it was great, went hiking", "hiking")
    reply_to = await phone.expect("reply_to")
    end = await phone.reply()
    assert reply_to == {
        "type": "reply_to",
        "seq": reply_to["seq"],
        "id": "hiking",
        "reply": weekend["reply"],
        "excerpt": "How was your weekend?",
        "guessed": False,
    }
    deltas = [f["seq"] for f in frames_after(phone, ack["seq"], "reply.delta")]
    assert ack["seq"] < reply_to["seq"] < min(deltas)
    # The rehearsal model shows the note it was handed.
    assert 'answers your earlier message "How was your weekend?"' in end["text"]
    assert [f for f in phone.frames if f["type"] == "reply_to"] == [reply_to]
    assert await counters(harness, "stillhere_analysis_failures") == {}


async def test_weekend_story_in_french_on_a_first_run(harness: Harness) -> None:
    await harness.start()
    phone = await harness.phone()
    weekend = await turn(phone, "ask me: comment s'est passé ton week-end ?")
    assert weekend["text"] == "Comment s'est passé ton week-end ?"
    book = await turn(phone, "ask me: tu as fini le livre ?")
    assert book["text"] == "Tu as fini le livre ?"
    loved = await turn(phone, "oui, adoré !", "adore")
    # "oui" answers the latest message, the book: no note for it.
    assert "[" not in loved["text"].removeprefix("[rehearsal]")

    ack = await phone.say("c'était super, on a fait de la randonnée", "rando")
    reply_to = await phone.expect("reply_to")
    end = await phone.reply()
    assert reply_to == {
        "type": "reply_to",
        "seq": reply_to["seq"],
        "id": "rando",
        "reply": weekend["reply"],
        "excerpt": "Comment s'est passé ton week-end ?",
        "guessed": False,
    }
    assert ack["seq"] < reply_to["seq"]
    # The note the rehearsal model was handed: the book is answered, nothing left waiting.
    assert (
        '[This message answers your earlier message "Comment s\'est passé ton week-end ?" '
        "(not your latest one).]"
    ) in end["text"]
    assert [f["id"] for f in phone.frames if f["type"] == "reply_to"] == ["rando"]
    assert await counters(harness, "stillhere_analysis_failures") == {}


async def test_sleep_and_dinner_asks_once_then_takes_the_likeliest(harness: Harness) -> None:
    await harness.start()
    phone = await harness.phone()
    await turn(phone, "ask me: did you sleep well?")
    dinner = await turn(phone, "ask me: are you coming to dinner?")
    asked = await turn(phone, "yes!")
    assert asked["text"] == (
        '[rehearsal] Sorry, which did you mean: "Did you sleep well?" or '
        '"Are you coming to dinner?"?'
    )
    assert not [f for f in phone.frames if f["type"] == "reply_to"]

    await phone.say("yes!", "again")
    reply_to = await phone.expect("reply_to")
    end = await phone.reply()
    assert reply_to["id"] == "again" and reply_to["guessed"] is True
    assert reply_to["reply"] == dinner["reply"]
    assert reply_to["excerpt"] == "Are you coming to dinner?"
    assert not end["text"].startswith("[rehearsal] Sorry, which did you mean")
    assert (
        'take it as the answer to "Are you coming to dinner?". '
        'Still waiting for an answer: "Did you sleep well?".]'
    ) in end["text"]


async def test_sleep_and_dinner_over_sse_on_a_first_run(harness: Harness) -> None:
    await harness.start()
    client = SseClient(harness.http, harness.url)
    stream = await client.open()
    await stream.expect("welcome")
    ends = []
    for text in ("ask me: did you sleep well?", "ask me: are you coming to dinner?", "yes!"):
        await client.say(text)
        ends.append((await stream.expect("reply.end")).data)
    assert ends[-1]["text"].startswith("[rehearsal] Sorry, which did you mean:")
    ack = await client.say("yes!", "again")
    reply_to = await stream.expect("reply_to")
    await stream.expect("reply.end")
    assert reply_to.seq is not None and reply_to.seq > ack["seq"]
    assert reply_to.data["reply"] == ends[1]["reply"] and reply_to.data["guessed"] is True
    assert [e.type for e in stream.events].count("reply_to") == 1
    await client.close()


# -- fake models: what the chat model is handed ------------------------------------------------


def matched(answers: str | None, open_: list[str], **entry: Any) -> Answer:
    """An answer in the contract's full form (entries by P line)."""
    return Answer({"answers": [{"message": "P1", "answers": answers, **entry}], "open": open_})


WEEKEND_LINES = ["A1: How was your weekend?", "A2: Did you finish that book?"]
HIKING = "went hiking with Sam"  # shares no word with either question: the rules cannot say
NEW = Answer({"answers": "none"})


async def weekend_over_sse(
    harness: Harness,
    fake_llm: FakeOpenAI,
    analysis: FakeAnalysis,
    hiking: AnalysisResponse,
    brb: AnalysisResponse = NEW,
) -> tuple[SseClient, EventStream, list[dict[str, Any]]]:
    """The weekend story over SSE: the weekend asked, "brb, coffee?" (a question back that
    shares no word with it: the analysis reads it as something new), the book asked, then
    HIKING, which the analysis reads as `hiking` says; the reply.ends."""
    await harness.start(llm_url=fake_llm.url, analysis_url=analysis.url)
    fake_llm.queue(
        Reply("How was your weekend?"), Reply("Did you finish that book?"), Reply("Lovely.")
    )
    client = SseClient(harness.http, harness.url)
    stream = await client.open()
    await stream.expect("welcome")
    analysis.queue(brb, hiking)
    ends = []
    for text in ("hi", "brb, coffee?", HIKING):
        await client.say(text, text[:4])
        ends.append((await stream.expect("reply.end")).data)
    return client, stream, ends


@pytest.mark.parametrize(
    "hiking",
    [
        Answer({"answers": "A1"}),  # the shape asked for
        Answer({"answers": ["A1"]}),  # labels where objects were meant: read all the same
        matched("A1", ["A2"]),  # the contract's full form
    ],
)
async def test_weekend_story_over_sse_hands_the_model_the_note(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis, hiking: Answer
) -> None:
    client, stream, ends = await weekend_over_sse(harness, fake_llm, analysis, hiking)
    weekend, book, _ = ends
    # "hi" had no candidate; "brb, coffee?" one, but a question back; HIKING two.
    brb, asked = analysis.tasks("reply-matching")
    assert brb.lines == ["A1: How was your weekend?", "P1: brb, coffee?"]
    assert asked.lines == [*WEEKEND_LINES, f"P1: {HIKING}"]
    assert asked.body["response_format"]["type"] == "json_schema"
    schema = asked.body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["answers"]["enum"] == ["A1", "A2", "none"]
    assert asked.body["max_tokens"] <= 16
    reply_to = next(e for e in stream.events if e.type == "reply_to")
    assert reply_to.data == {
        "type": "reply_to",
        "seq": int(reply_to.id or 0),
        "id": "went",
        "reply": weekend["reply"],
        "excerpt": "How was your weekend?",
        "guessed": False,
    }
    assert reply_note(fake_llm.requests[-1]) == (
        f"{REPLY_CONTEXT}\n"
        'This message answers your earlier message "How was your weekend?" '
        "(not your latest one).\n"
        'Still waiting for an answer: "Did you finish that book?".'
    )
    assert await counters(harness, "stillhere_analysis_failures") == {}

    # The book still waits, and a yes is for it: the rules are sure, nothing is asked.
    fake_llm.queue(Reply("Glad you liked it."))
    await client.say("yes, loved it!", "loved")
    reply_to = (await stream.expect("reply_to")).data
    await stream.expect("reply.end")
    assert reply_to["id"] == "loved" and reply_to["reply"] == book["reply"]
    assert len(analysis.tasks("reply-matching")) == 2
    await client.close()


@pytest.mark.parametrize(
    ("chances", "reading"),
    [
        ({"A1": 0.40, "A2": 0.35, "none": 0.25}, "latest"),  # A1 not twice as likely as A2
        ({"A1": 0.37, "A2": 0.15, "none": 0.48}, "new"),  # `A` (0.52) was written over none
        ({"A1": 0.75, "A2": 0.05, "none": 0.20}, "earlier"),
    ],
)
async def test_the_models_chances_weigh_the_latest_message(
    harness: Harness,
    fake_llm: FakeOpenAI,
    analysis: FakeAnalysis,
    chances: dict[str, float],
    reading: str,
) -> None:
    """The model wrote A1 each time; its chances, asked for, decide: an earlier message
    must be twice as likely as the latest, and no label likelier than `none`."""
    hiking = Answer({"answers": "A1"}, chances=chances)
    client, stream, _ = await weekend_over_sse(harness, fake_llm, analysis, hiking)
    asked = analysis.tasks("reply-matching")[-1]
    assert (asked.body["logprobs"], asked.body["top_logprobs"]) == (True, 10)
    replied_to = [e.data["id"] for e in stream.events if e.type == "reply_to"]
    assert replied_to == (["went"] if reading == "earlier" else [])
    note = reply_note(fake_llm.requests[-1])
    if reading == "latest":
        assert note is None
    else:
        expected = "answers your earlier message" if reading == "earlier" else "starts something"
        assert note is not None and expected in note
    await client.close()


async def test_a_lone_candidate_is_not_weighed_against_none(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis
) -> None:
    """ "brb, coffee?" asks back: the weekend is its one candidate, and the latest's weight
    is for telling it from an older message, not from none. The model's likelier `none`
    stands, so the weekend still waits when HIKING comes."""
    brb = Answer({"answers": "none"}, chances={"A1": 0.4, "none": 0.6})
    client, _, _ = await weekend_over_sse(
        harness, fake_llm, analysis, Answer({"answers": "A1"}), brb
    )
    assert [r.lines[:-1] for r in analysis.tasks("reply-matching")] == [
        ["A1: How was your weekend?"],
        WEEKEND_LINES,
    ]
    await client.close()


async def test_the_note_lists_the_questions_still_waiting(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis
) -> None:
    hiking = Answer({"answers": "none"})  # HIKING taken as something new
    client, _, _ = await weekend_over_sse(harness, fake_llm, analysis, hiking)
    note = reply_note(fake_llm.requests[2])
    assert note == (
        f"{REPLY_CONTEXT}\n"
        "This message starts something new: it answers none of your messages.\n"
        'Still waiting for an answer: "How was your weekend?"; "Did you finish that book?".'
    )
    await client.close()


async def test_a_server_refusing_json_schema_is_asked_for_json_object(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    async with FakeAnalysis(refuse_schema=True) as analysis:
        client, stream, ends = await weekend_over_sse(
            harness, fake_llm, analysis, Answer({"answers": "A1"})
        )
        await client.close()
    formats = [r["response_format"]["type"] for r in analysis.requests]
    # Refused once, asked again at once; loose ends asked for json_object from then on.
    assert formats[:2] == ["json_schema", "json_object"] and set(formats[2:]) == {"json_object"}
    assert [e.data["reply"] for e in stream.events if e.type == "reply_to"] == [ends[0]["reply"]]
    assert await counters(harness, "stillhere_analysis_failures") == {}


async def test_easy_cases_make_no_analysis_request(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis, caplog: pytest.LogCaptureFixture
) -> None:
    await harness.start(llm_url=fake_llm.url, analysis_url=analysis.url)
    fake_llm.queue(Reply("Hello! How are you?"), Reply("Glad to hear it."), Reply("Sure."))
    phone = await harness.phone()
    for text in ("hi", "fine, thanks", "ok"):
        await turn(phone, text)
    assert analysis.tasks("reply-matching") == []
    assert await counters(harness, "stillhere_reply_matching") == {
        'how="no_candidate"': 1.0,
        'how="just_before"': 2.0,
        'how="holding"': 0.0,
        'how="rules"': 0.0,
        'how="asked"': 0.0,
    }
    lines = [r.getMessage() for r in caplog.records if "handing the model" in r.getMessage()]
    assert "replies matched without the model (no candidate)" in lines[0]
    assert all("replies matched without the model (just before)" in line for line in lines[1:])


async def test_reply_matching_off_asks_nothing_and_notes_nothing(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis
) -> None:
    await harness.start(llm_url=fake_llm.url, analysis_url=analysis.url, reply_matching=False)
    fake_llm.queue(
        Reply("How was your weekend?"), Reply("Did you finish that book?"), Reply("Lovely.")
    )
    phone = await harness.phone()
    for text in ("hi", "brb, coffee?", "it was great, went hiking"):
        await turn(phone, text)
    await harness.recorded()
    assert analysis.asked == []  # neither reply matching nor loose ends
    assert not [f for f in phone.frames if f["type"] == "reply_to"]
    assert not any(
        m["role"] == "system" and REPLY_CONTEXT in m["content"]
        for m in fake_llm.requests[-1]["messages"]
    )
    assert set((await counters(harness, "stillhere_reply_matching")).values()) == {0.0}


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (Down(503), "http"),
        (Stall(), "timeout"),
        (Answer({"answers": "A1"}, delay=1.0), "timeout"),
        (Answer("the weekend, probably"), "not_json"),
        (Answer({"answers": [{"message": "P7", "answers": "A9"}], "open": []}), "bad_shape"),
        (Answer({"answers": "the weekend"}), "bad_shape"),
    ],
)
async def test_analysis_down_slow_or_garbage_the_reply_comes_with_the_rules_reading(
    harness: Harness,
    fake_llm: FakeOpenAI,
    analysis: FakeAnalysis,
    response: Any,
    reason: str,
) -> None:
    await harness.start(llm_url=fake_llm.url, analysis_url=analysis.url, analysis_timeout=0.3)
    fake_llm.queue(Reply("How was your weekend?"), Reply("Did you finish that book?"))
    phone = await harness.phone()
    await turn(phone, "hi")
    analysis.queue(Answer({"answers": "none"}), response)
    await turn(phone, "coffee first?")  # something new: the weekend still waiting
    fake_llm.queue(Reply("Good to hear."))
    end = await turn(phone, HIKING)
    assert end["text"] == "Good to hear." and "error" not in end
    assert not [f for f in phone.frames if f["type"] == "reply_to"]
    # The rules' reading, as without a model: nothing claims it, so something new.
    assert reply_note(fake_llm.requests[-1]) == (
        f"{REPLY_CONTEXT}\n"
        "This message starts something new: it answers none of your messages.\n"
        'Still waiting for an answer: "How was your weekend?"; "Did you finish that book?".'
    )
    failures = await counters(harness, "stillhere_analysis_failures")
    assert failures == {f'reason="{reason}",task="reply-matching"': 1.0}


# -- says that answer nothing, and the questions waiting ------------------------------------


class Reader:
    """Answers as a real model would: each say answers the A line whose text `answers`
    gives for it (a list: unclear between them; absent: something new), and the
    assistant's questions no say answers are open."""

    def __init__(self, answers: dict[str, str | list[str]]) -> None:
        self.answers = answers

    def __call__(self, request: Asked) -> AnalysisResponse:
        said = dict(line.split(": ", 1) for line in request.lines)
        label = {text: ref for ref, text in said.items() if ref.startswith("A")}
        people = [(ref, text) for ref, text in said.items() if ref.startswith("P")]
        read = {ref: self.answers.get(text) for ref, text in people}
        answered = {a for a in read.values() if isinstance(a, str)}
        waiting = [ref for text, ref in label.items() if "?" in text and text not in answered]
        entries = []
        for ref, answer in read.items():
            entry: dict[str, Any] = {"message": ref, "answers": None}
            if isinstance(answer, list):
                entry |= {"answers": label[answer[-1]], "unclear": [label[a] for a in answer]}
            elif answer is not None:
                entry["answers"] = label[answer]
            entries.append(entry)
        return Answer({"answers": entries, "open": waiting, "lull": False})


def asked_once(
    analysis: FakeAnalysis, fake_llm: FakeOpenAI, asked: list[list[str]], note: str
) -> None:
    """The analysis was asked about the last say alone, with `asked` (or not at all), and
    the chat model handed `note` beside it."""
    assert [a.lines for a in analysis.tasks("reply-matching")] == asked
    assert reply_note(fake_llm.requests[-1]) == f"{REPLY_CONTEXT}\n{note}"


CONCERT = "How was the concert?"
PLUMBER = "Take your time. Did you call the plumber?"


async def test_a_say_that_answers_nothing_leaves_the_question_waiting(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    """The concert is asked; "hold on, thinking" answers nothing; the plumber is asked; the
    answer about the concert is matched to it, both questions being candidates."""
    reader = Reader({"the band played for three hours": CONCERT})
    async with FakeAnalysis(default=reader) as analysis:
        await harness.start(llm_url=fake_llm.url, analysis_url=analysis.url)
        fake_llm.queue(Reply(CONCERT), Reply(PLUMBER), Reply("Three hours!"))
        phone = await harness.phone()
        concert = await turn(phone, "hi")
        await turn(phone, "hold on, thinking")
        await harness.server.runtime.settle(5.0)
        await phone.say("the band played for three hours", "band")
        reply_to = await phone.expect("reply_to")
        await phone.reply()
        await harness.server.runtime.settle(5.0)
    assert reply_to["id"] == "band" and reply_to["reply"] == concert["reply"]
    asked_once(
        analysis,
        fake_llm,
        [[f"A1: {CONCERT}", f"A2: {PLUMBER}", "P1: the band played for three hours"]],
        f'This message answers your earlier message "{CONCERT}" (not your latest one).\n'
        f'Still waiting for an answer: "{PLUMBER}".',
    )
    assert await counters(harness, "stillhere_reply_matching") == {
        'how="no_candidate"': 1.0,
        'how="just_before"': 0.0,
        'how="holding"': 1.0,
        'how="rules"': 0.0,
        'how="asked"': 1.0,
    }
    assert analysis.tasks("loose-ends") == []  # loose ends take the turn's reading


async def test_an_unclear_yes_after_a_say_in_between_asks_the_person(
    harness: Harness, fake_llm: FakeOpenAI
) -> None:
    sleep, dinner = "Did you sleep well?", "Are you coming to dinner tonight?"
    reader = Reader({"yes!": [sleep, dinner]})
    async with FakeAnalysis(default=reader) as analysis:
        await harness.start(llm_url=fake_llm.url, analysis_url=analysis.url)
        fake_llm.queue(Reply(sleep), Reply(dinner), Reply("Which one?"))
        phone = await harness.phone()
        await turn(phone, "morning")
        await turn(phone, "ok, back in a sec")
        await turn(phone, "yes!")
    asked_once(
        analysis,
        fake_llm,
        [],  # two yes/no questions and a yes: the rules are sure it is unclear
        f'This message could answer "{sleep}" or "{dinner}". {REPLY_ASK}\n'
        f'Still waiting for an answer: "{sleep}"; "{dinner}".',
    )
    assert not [f for f in phone.frames if f["type"] == "reply_to"]


# -- resume ---------------------------------------------------------------------------------


async def test_reply_to_is_in_the_history_and_the_replay_of_a_resume(harness: Harness) -> None:
    await harness.start()
    phone = await harness.phone()
    weekend = await turn(phone, WEEKEND)
    book = await turn(phone, BOOK)
    await turn(phone, "yes, loved it!", "loved")
    before = phone.last_seq
    await phone.say("it was great, went hiking", "hiking")
    reply_to = await phone.expect("reply_to")
    await phone.reply()
    await phone.drop()

    conversation = phone.welcome["conversation"]
    again = await harness.phone(phone.device, conversation=conversation, last_seq=before)
    assert again.welcome["resumed"] is True
    replayed = await again.expect("reply_to")
    assert replayed == reply_to
    history = again.welcome["history"]
    says = [h for h in history if h["role"] == "user"]
    assert [h.get("id") for h in says][-2:] == ["loved", "hiking"]
    assert "reply_to" not in says[-2]
    assert says[-1]["reply_to"] == {
        "reply": weekend["reply"],
        "excerpt": "How was your weekend?",
        "guessed": False,
    }
    replies = [h["reply"] for h in history if h["role"] == "assistant"]
    assert replies[:2] == [weekend["reply"], book["reply"]]
    await again.close()


async def matches_stored(db: asyncpg.Connection, conversation: str, count: int) -> None:
    """Wait until `count` says of the conversation have their match in the record."""
    stored = "SELECT count(*) FROM turns WHERE conversation = $1 AND reply_match IS NOT NULL"
    async with asyncio.timeout(10):
        while await db.fetchval(stored, uuid.UUID(conversation)) < count:
            await asyncio.sleep(0.01)


async def test_the_reply_graph_survives_kill_9(
    dsn: str, tmp_path: Path, db: asyncpg.Connection
) -> None:
    """The questions still waiting, and a reply_to, are read back by a new process."""
    device = "device-" + uuid.uuid4().hex
    first = ServerProcess(dsn, tmp_path / "data", tmp_path / "first.log")
    second = ServerProcess(dsn, tmp_path / "data", tmp_path / "second.log")
    async with aiohttp.ClientSession() as http:
        try:
            await first.start(http)
            before, welcome = await hello(http, first, device=device)
            conversation = welcome["conversation"]
            weekend = (await before.say(WEEKEND))[1]
            await before.say(BOOK)
            await before.say("yes, loved it!")  # leaves the weekend waiting, in its row
            await matches_stored(db, conversation, 2)
            await first.kill()
            await before.ws.close()

            await second.start(http)
            after, again = await hello(http, second, device=device, conversation=conversation)
            assert again["resumed"] is True
            ack, _ = await after.say("it was great, went hiking")
            reply_to = next(f for f in after.frames if f["type"] == "reply_to")
            assert reply_to["reply"] == weekend["reply"] and reply_to["seq"] > ack["seq"]
            # Its match is written with its reply, after the reply_to event.
            await matches_stored(db, conversation, 3)
            await second.kill()
            await after.ws.close()

            await first.start(http)
            last, resumed = await hello(
                http, first, device=device, conversation=conversation, last_seq=ack["seq"]
            )
            assert await last.expect("reply_to") == reply_to
            said = resumed["history"][-2]
            assert said["text"] == "it was great, went hiking"
            assert said["reply_to"] == {
                "reply": weekend["reply"],
                "excerpt": "How was your weekend?",
                "guessed": False,
            }
            await last.ws.close()
        finally:
            await first.kill()
            await second.kill()
