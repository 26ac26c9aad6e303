"""Follow-ons end to end: a message the assistant sends on its own after a lull (PROTOCOL 1.1,
`reply.start` with `follow_on: true`), timed by the persona and the mood on the injected
clock, drawn from a seeded random, cancelled by a say, at most one, stored and replayed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from random import Random
from typing import Any

import asyncpg
import pytest

from actors.persona import DEFAULT, START_FONDNESS, Persona, PersonaError, load_persona
from cli.main import _parser, main
from providers.notes import FOLLOW_ON, LOOSE_ASSISTANT, LOOSE_ENDS
from tests.conftest import Harness, Phone, eventually
from tests.fakes.analysis_server import Answer, FakeAnalysis
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.sse_client import SseClient
from tests.test_admin import TOKEN, _get
from tests.test_reply_matching import counters, turn
from transport.config import settings_from

BOOK = "ask me: did you finish that book?"


def fondness_after(exchanges: int, persona: Persona = DEFAULT) -> float:
    fondness = START_FONDNESS
    for _ in range(exchanges):
        fondness = persona.nudged(fondness, cut_off=False)
    return fondness


async def lull(harness: Harness, phone: Phone) -> dict[str, Any]:
    """Ask for a question, answer "ok thanks": the reply to the lull, once the follow-on's
    pause has begun on the clock."""
    await turn(phone, BOOK)
    end = await turn(phone, "ok thanks")
    await eventually(lambda: harness.clock.sleepers == 1)
    return end


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """`eventually` for a check that reads the database or the metrics."""
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.01)


def follow_ons(phone: Phone) -> list[dict[str, Any]]:
    return [f for f in phone.frames if f["type"] == "reply.start" and f.get("follow_on")]


async def test_a_follow_on_comes_after_the_pause_and_picks_up_a_loose_end(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start(follow_ons="always", admin_token=TOKEN, admin_port=0)
    phone = await harness.phone()
    ended = await lull(harness, phone)
    # The book question is noted as ours, unanswered, before the pause ends.
    await until(lambda: _has_loose_end(db, "Did you finish that book?"))
    pause = DEFAULT.pause(fondness_after(2))

    harness.clock.advance(pause - 0.5)
    await asyncio.sleep(0.2)
    assert follow_ons(phone) == []
    harness.clock.advance(0.5)
    start = await phone.expect("reply.start", lambda f: f.get("follow_on"))
    end = await phone.expect("reply.end", lambda f: f["reply"] == start["reply"])

    assert start["in_reply_to"] == [] and start["seq"] > ended["seq"]
    assert end["text"] == (
        '[rehearsal] One more thing, about "Did you finish that book?": tell me more when you like.'
    )
    await harness.recorded()
    row = await db.fetchrow(
        "SELECT text, follow_on FROM turns WHERE reply_id = $1::uuid", end["reply"]
    )
    assert (row["text"], row["follow_on"]) == (end["text"], True)
    # The person's last activity is still their "ok thanks", not the follow-on.
    record = await harness.server.runtime.store.active_conversation(harness.person(phone), 40)
    assert record is not None and record.last_activity < harness.clock.now()
    # ... and the live actor counts it as the database does.
    await phone.send({"type": "ping"})
    await phone.expect("pong")
    admin = f"http://127.0.0.1:{harness.server.admin_port}"
    _, actor = await _get(harness, f"{admin}/admin/actors/{harness.person(phone)}")
    assert actor["last_activity"] == record.last_activity.isoformat()
    assert await counters(harness, "stillhere_follow_ons") == {'outcome="sent"': 1.0}

    # At most one per say: nothing more, however long the quiet.
    harness.clock.advance(3600)
    await asyncio.sleep(0.2)
    assert len(follow_ons(phone)) == 1


async def _has_loose_end(db: asyncpg.Connection, text: str) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM loose_ends WHERE text = $1", text))


async def test_the_model_is_handed_the_follow_on_note_and_the_loose_ends(
    harness: Harness, fake_llm: FakeOpenAI, db: asyncpg.Connection
) -> None:
    async with FakeAnalysis() as analysis:
        await _handed(harness, fake_llm, analysis, db)


async def _handed(
    harness: Harness, fake_llm: FakeOpenAI, analysis: FakeAnalysis, db: asyncpg.Connection
) -> None:
    await harness.start(follow_ons="always", llm_url=fake_llm.url, analysis_url=analysis.url)
    fake_llm.queue(Reply("Did you finish that book?"), Reply("Great."), Reply("By the way..."))
    phone = await harness.phone()
    await turn(phone, "Tell me something.")
    await turn(phone, "ok thanks")
    await until(lambda: _has_loose_end(db, "Did you finish that book?"))  # noted first
    await eventually(lambda: harness.clock.sleepers == 1)
    harness.clock.advance(60)
    start = await phone.expect("reply.start", lambda f: f.get("follow_on"))
    end = await phone.expect("reply.end", lambda f: f["reply"] == start["reply"])
    assert end["text"] == "By the way..."
    messages = fake_llm.requests[-1]["messages"]
    assert messages[-1] == {"role": "system", "content": FOLLOW_ON}
    # "ok thanks" left the book unanswered: the rules note it, a model configured or not.
    loose = f'{LOOSE_ENDS}\n{LOOSE_ASSISTANT} "Did you finish that book?".'
    assert messages[-2] == {"role": "system", "content": loose}
    assert messages[-3]["role"] == "assistant" and messages[-3]["content"] == "Great."


async def test_the_analysis_lull_brings_a_follow_on_too(harness: Harness) -> None:
    """No phrasing the rules know: the analysis model says the person winds down."""
    async with FakeAnalysis() as analysis:
        await harness.start(follow_ons="always", analysis_url=analysis.url)
        phone = await harness.phone()
        await turn(phone, BOOK)
        winding = {"answers": [{"message": "P1", "answers": "A1"}], "open": [], "lull": True}
        analysis.queue(Answer(winding))
        await turn(phone, "mmm, what would you say?")  # a question back: the analysis is asked
        assert len(analysis.tasks("reply-matching")) == 1
        await eventually(lambda: harness.clock.sleepers == 1)
        harness.clock.advance(60)
        start = await phone.expect("reply.start", lambda f: f.get("follow_on"))
        await phone.expect("reply.end", lambda f: f["reply"] == start["reply"])


async def test_a_say_before_the_pause_ends_cancels_the_follow_on(harness: Harness) -> None:
    await harness.start(follow_ons="always")
    phone = await harness.phone()
    await lull(harness, phone)
    await turn(phone, "actually, one more question")
    harness.clock.advance(3600)
    await asyncio.sleep(0.2)
    assert follow_ons(phone) == []
    assert harness.clock.sleepers == 0
    assert await counters(harness, "stillhere_follow_ons") == {'outcome="cancelled"': 1.0}


async def test_leaving_cancels_the_follow_on(harness: Harness) -> None:
    await harness.start(follow_ons="always")
    phone = await harness.phone()
    await lull(harness, phone)
    await phone.send({"type": "leave"})
    await phone.expect("bye")
    await eventually(lambda: harness.clock.sleepers == 0)
    assert await counters(harness, "stillhere_follow_ons") == {'outcome="cancelled"': 1.0}


async def test_parking_the_conversation_cancels_the_follow_on(harness: Harness) -> None:
    await harness.start(follow_ons="always", park_after=1.0)
    phone = await harness.phone()
    await lull(harness, phone)
    await phone.close()
    await eventually(lambda: harness.links(phone) == 0)
    harness.clock.advance(1.5)  # past --park-after, before the pause (2 s at the least)
    await harness.sweep()
    await eventually(lambda: harness.server.directory.get(harness.person(phone)) is None)
    assert harness.clock.sleepers == 0
    assert await counters(harness, "stillhere_follow_ons") == {'outcome="cancelled"': 1.0}


async def test_a_follow_on_sent_while_the_phone_was_away_is_replayed(harness: Harness) -> None:
    await harness.start(follow_ons="always")
    phone = await harness.phone()
    await lull(harness, phone)
    seen = phone.last_seq
    await phone.drop()
    harness.clock.advance(60)
    await until(lambda: _sent(harness))
    await harness.recorded()
    await eventually(lambda: _in_history(harness))  # the actor's window, not only the stream

    back = await harness.phone(
        phone.device, conversation=phone.welcome["conversation"], last_seq=seen
    )
    start = await back.expect("reply.start")
    end = await back.expect("reply.end")
    assert start["follow_on"] is True and start["seq"] > seen
    assert end["reply"] == start["reply"] and end["text"].startswith("[rehearsal] One more thing")
    # The history marks it too, from the actor and from the record read back.
    for welcome in (back.welcome, await _welcome_after_restart(harness, phone.device)):
        marked = [t["reply"] for t in welcome["history"] if t.get("follow_on")]
        assert marked == [start["reply"]]


def _in_history(harness: Harness) -> bool:
    """The follow-on is in the window a welcome hands out (the actor's latest snapshot)."""
    snapshots = [live.current_snapshot() for live in harness.server.directory.lives()]
    return any(s is not None and any(t.follow_on for t in s.history) for s in snapshots)


async def _welcome_after_restart(harness: Harness, device: str) -> dict[str, Any]:
    await harness.recorded()
    await harness.stop()
    await harness.start(follow_ons="always")
    return (await harness.phone(device)).welcome


async def _sent(harness: Harness) -> bool:
    return (await counters(harness, "stillhere_follow_ons")).get('outcome="sent"') == 1.0


async def test_a_follow_on_over_sse(harness: Harness) -> None:
    await harness.start(follow_ons="always")
    client = SseClient(harness.http, harness.url)
    stream = await client.open()
    await stream.expect("welcome")
    for text in (BOOK, "haha, true"):
        await client.say(text)
        await stream.expect("reply.end")
    await eventually(lambda: harness.clock.sleepers == 1)
    harness.clock.advance(60)
    start = await stream.expect("reply.start", lambda e: bool(e.data.get("follow_on")))
    assert start.data["in_reply_to"] == []
    await stream.expect("reply.end", lambda e: e.data["reply"] == start.data["reply"])
    await client.close()


async def test_no_follow_on_after_a_say_that_is_no_lull(harness: Harness) -> None:
    await harness.start(follow_ons="always")
    phone = await harness.phone()
    await turn(phone, BOOK)
    await turn(phone, "yes, I finished it last night")
    await asyncio.sleep(0.2)
    assert harness.clock.sleepers == 0
    assert await counters(harness, "stillhere_follow_ons") == {}


async def test_off_sends_none_and_still_moves_the_mood(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start(follow_ons="off")
    phone = await harness.phone()
    await turn(phone, BOOK)
    await turn(phone, "ok thanks")
    person = harness.person(phone)
    await until(lambda: _fondness(db, person, fondness_after(2)))
    assert harness.clock.sleepers == 0
    assert await counters(harness, "stillhere_follow_ons") == {}


async def _fondness(db: asyncpg.Connection, person: str, expected: float) -> bool:
    value = await db.fetchval("SELECT fondness FROM moods WHERE person = $1", person)
    return value is not None and value == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("seed", range(6))
async def test_auto_draws_from_the_seeded_random(
    harness: Harness, tmp_path: Path, seed: int
) -> None:
    """A cold persona (fondness stays where it starts): the chance is the formula's, and the
    outcome the seeded random's first draw against it."""
    persona_file = tmp_path / "cold.toml"
    persona_file.write_text('name = "Cold"\nenergy = 0\ncuriosity = 0\nwarmth = 0\n')
    await harness.start(follow_ons="auto", persona=load_persona(persona_file), follow_on_seed=seed)
    phone = await harness.phone()
    await turn(phone, BOOK)
    await turn(phone, "ok thanks")
    chance = load_persona(persona_file).chance(START_FONDNESS)
    expected = "sent" if Random(seed).random() < chance else "declined"
    if expected == "sent":
        await eventually(lambda: harness.clock.sleepers == 1)
        harness.clock.advance(60)
    await until(lambda: _counted(harness, expected))


async def _counted(harness: Harness, outcome: str) -> bool:
    return await counters(harness, "stillhere_follow_ons") == {f'outcome="{outcome}"': 1.0}


async def test_a_cut_off_reply_cools_the_mood(harness: Harness, db: asyncpg.Connection) -> None:
    await harness.start(rehearsal_rate=40)
    phone = await harness.phone()
    await phone.say("tell me a story about otters")
    await phone.expect("reply.delta")
    await phone.say("stop")
    await phone.reply()
    await phone.reply()
    person = harness.person(phone)
    cooled = DEFAULT.nudged(START_FONDNESS, cut_off=True)
    both = DEFAULT.nudged(cooled, cut_off=False)  # the reply to "stop" ran to its end
    await until(lambda: _fondness(db, person, both))


# -- the persona and its formula ---------------------------------------------------------------


def test_an_energetic_curious_persona_fond_of_the_person_follows_on_sooner_and_more() -> None:
    keen, shy = Persona("Keen", 1.0, 1.0, 1.0), Persona("Shy", 0.0, 0.0, 0.0)
    assert keen.chance(1.0) > DEFAULT.chance(0.5) > shy.chance(0.0)
    assert keen.pause(1.0) < DEFAULT.pause(0.5) < shy.pause(0.0)
    assert shy.chance(0.0) > 0 and keen.chance(1.0) < 1
    assert keen.nudged(0.5, cut_off=False) > shy.nudged(0.5, cut_off=False) == 0.5
    assert DEFAULT.nudged(0.5, cut_off=True) < 0.5


def test_the_documented_default_persona_is_the_built_in_one() -> None:
    assert load_persona(Path(__file__).parent.parent / "docs" / "persona.toml") == DEFAULT


def test_a_persona_file_is_read_and_a_missing_trait_is_the_default(tmp_path: Path) -> None:
    path = tmp_path / "aria.toml"
    path.write_text('name = "Aria"\nenergy = 0.9\ncuriosity = 1\n', encoding="utf-8")
    assert load_persona(path) == Persona("Aria", 0.9, 1.0, DEFAULT.warmth)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("energy = 1.5", "energy must be a number from 0 to 1"),
        ('warmth = "high"', "warmth must be a number from 0 to 1"),
        ("curiosity = true", "curiosity must be a number from 0 to 1"),
        ("mood = 1", "unknown keys ['mood']"),
        ('name = ""', "name must be a non-empty string"),
        ("energy = ", "not TOML"),
    ],
)
def test_a_bad_persona_file_is_refused_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, error: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(PersonaError, match=re.escape(error)):
        load_persona(path)
    with pytest.raises(SystemExit) as stopped:
        _parser().parse_args(["serve", "--persona", str(path)])
    assert stopped.value.code == 2
    assert error in capsys.readouterr().err


def test_a_persona_file_is_read_once_as_the_options_are(tmp_path: Path) -> None:
    path = tmp_path / "ada.toml"
    path.write_text('name = "Ada"\nwarmth = 0.25\n', encoding="utf-8")
    args = _parser().parse_args(["serve", "--persona", str(path)])
    path.unlink()  # nothing reads it again: the settings hold the persona itself
    assert settings_from(args).persona == Persona("Ada", warmth=0.25)


def test_follow_ons_takes_only_its_three_modes(capsys: pytest.CaptureFixture[str]) -> None:
    assert _parser().parse_args(["serve", "--follow-ons", "always"]).follow_ons == "always"
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--follow-ons", "sometimes"])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


async def test_inspect_shows_the_mood(
    harness: Harness, db: asyncpg.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    await harness.start(admin_token=TOKEN, admin_port=0, follow_ons="off")
    url = f"http://127.0.0.1:{harness.server.admin_port}"
    phone = await harness.phone()
    person = harness.person(phone)
    options = ["--admin-url", url, "--admin-token", TOKEN]
    assert await asyncio.to_thread(main, ["inspect", person[:12], *options]) == 0
    assert "fondness not set yet" in capsys.readouterr().out
    await turn(phone, "hello there")
    await until(lambda: _fondness(db, person, fondness_after(1)))
    assert await asyncio.to_thread(main, ["inspect", person[:12], *options]) == 0
    assert f"mood           fondness {fondness_after(1):.2f}" in capsys.readouterr().out
