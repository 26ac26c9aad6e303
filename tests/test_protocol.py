"""Protocol v1 over WebSocket: bad input is answered with a stable code and harms nothing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from tests.conftest import Harness, Phone
from transport.config import Limits

LIMITS = Limits(max_frame_bytes=2000, max_text_chars=50)
SAY_ID = "say-1"
TABLES = ("conversations", "turns", "events", "cards")


def say(**fields: Any) -> dict[str, Any]:
    return {"type": "say", **fields}


# (frame sent after a good hello, expected code, expected `id` on the error)
BAD_INPUT: list[tuple[str, Any, str, str | None]] = [
    ("not json", "{type: say", "bad_json", None),
    ("truncated json", '{"type": "ping"', "bad_json", None),
    ("json list", "[1, 2]", "bad_frame", None),
    ("json string", '"ping"', "bad_frame", None),
    ("json null", "null", "bad_frame", None),
    ("no type", {"id": "x", "text": "hi"}, "bad_frame", None),
    ("type not a string", {"type": 7}, "bad_frame", None),
    ("type null", {"type": None}, "bad_frame", None),
    ("unknown type", {"type": "shout"}, "unknown_type", None),
    ("server type", {"type": "welcome"}, "unknown_type", None),
    ("frame too large", say(id=SAY_ID, text="x" * 2000), "frame_too_large", None),
    ("text too long", say(id=SAY_ID, text="x" * 51), "text_too_long", SAY_ID),
    ("no id", say(text="hi"), "invalid_id", None),
    ("empty id", say(id="", text="hi"), "invalid_id", None),
    ("id too long", say(id="i" * 129, text="hi"), "invalid_id", None),
    ("id not a string", say(id=12, text="hi"), "invalid_id", None),
    ("id with NUL", say(id="a\u0000b", text="hi"), "invalid_id", None),  # PostgreSQL text
    ("no text", say(id=SAY_ID), "invalid_text", SAY_ID),
    ("empty text", say(id=SAY_ID, text=""), "invalid_text", SAY_ID),
    ("blank text", say(id=SAY_ID, text="   "), "invalid_text", SAY_ID),
    ("text not a string", say(id=SAY_ID, text=["hi"]), "invalid_text", SAY_ID),
    ("text with NUL", say(id=SAY_ID, text="a\u0000b"), "invalid_text", SAY_ID),
    ("ack without seq", {"type": "ack"}, "invalid_field", None),
    ("ack seq string", {"type": "ack", "seq": "3"}, "invalid_field", None),
    ("ack seq float", {"type": "ack", "seq": 1.5}, "invalid_field", None),
    ("ack seq bool", {"type": "ack", "seq": True}, "invalid_field", None),
    ("ack seq negative", {"type": "ack", "seq": -1}, "invalid_field", None),
    ("second hello", {"type": "hello", "v": 1, "device": "d" * 30}, "already_hello", None),
    ("hello v 2", {"type": "hello", "v": 2, "device": "d" * 30}, "unsupported_version", None),
    ("hello without v", {"type": "hello", "device": "d" * 30}, "unsupported_version", None),
    ("hello v true", {"type": "hello", "v": True, "device": "d" * 30}, "unsupported_version", None),
    (
        "hello v string",
        {"type": "hello", "v": "1", "device": "d" * 30},
        "unsupported_version",
        None,
    ),
]


async def still_usable(phone: Phone) -> None:
    """A later ping gets pong and a later valid say is acked (and answered)."""
    await phone.send({"type": "ping"})
    await phone.expect("pong")
    ack = await phone.say("are you still there?")
    assert isinstance(ack["seq"], int)
    await phone.reply()


async def bare_link(harness: Harness) -> Phone:
    """A connected phone that has not said hello yet."""
    phone = Phone(harness, "device-" + uuid.uuid4().hex)
    phone.ws = await harness.http.ws_connect(harness.url("/v1/ws"))
    phone._reader = asyncio.get_running_loop().create_task(phone._read())
    return phone


@pytest.mark.parametrize(
    ("frame", "code", "id_"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT]
)
async def test_bad_input_gets_its_code_and_the_link_stays_usable(
    harness: Harness, frame: Any, code: str, id_: str | None
) -> None:
    await harness.start(limits=LIMITS)
    phone = await harness.phone()
    await phone.send(frame)
    error = await phone.expect("error")
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    assert error.get("id") == id_
    await still_usable(phone)


async def test_frames_before_hello_get_hello_first(harness: Harness) -> None:
    await harness.start()
    phone = await bare_link(harness)
    for frame in (
        say(id=SAY_ID, text="hi"),
        {"type": "ack", "seq": 1},
        {"type": "interrupt"},
        {"type": "leave"},
    ):
        await phone.send(frame)
        error = await phone.expect("error")
        assert error["code"] == "hello_first", frame
    assert [f.get("id") for f in phone.frames] == [SAY_ID, None, None, None]
    await phone.send({"type": "hello", "v": 1, "device": phone.device})
    assert (await phone.expect("welcome"))["resumed"] is False
    await still_usable(phone)


async def test_a_failed_hello_can_be_retried(harness: Harness) -> None:
    await harness.start()
    phone = await bare_link(harness)
    await phone.send({"type": "hello", "v": 2, "device": phone.device})
    assert (await phone.expect("error"))["code"] == "unsupported_version"
    await phone.send({"type": "hello", "v": 1, "device": phone.device})
    await phone.expect("welcome")
    await still_usable(phone)


async def test_too_many_frames_too_fast_are_rate_limited(harness: Harness) -> None:
    """Frames past the burst are refused one by one; once the bucket refills the link works."""
    await harness.start(limits=Limits(frames_per_s=2, frame_burst=3))
    phone = await harness.phone()  # the hello took one of the 3 tokens
    for _ in range(12):
        await phone.send({"type": "ping"})
    answers = [await next_frame(phone) for _ in range(12)]
    kinds = [a["code"] if a["type"] == "error" else a["type"] for a in answers]
    assert kinds[:2] == ["pong", "pong"]
    assert "rate_limited" in kinds
    assert set(kinds) == {"pong", "rate_limited"}
    await asyncio.sleep(1.5)  # the bucket refills at 2 frames a second
    await still_usable(phone)


async def next_frame(phone: Phone) -> dict[str, Any]:
    async with asyncio.timeout(10):
        return await phone._inbox.get()


# -- nothing stored changes -----------------------------------------------------------------


async def snapshot(db: asyncpg.Connection) -> dict[str, list[str]]:
    return {
        t: [r[0] for r in await db.fetch(f"SELECT t::text FROM {t} t ORDER BY 1")] for t in TABLES
    }


async def settled(db: asyncpg.Connection, phone: Phone) -> None:
    """Wait until the stream's events (the acks among them) are written."""
    async with asyncio.timeout(10):
        while await db.fetchval("SELECT coalesce(max(seq), 0) FROM events") < phone.last_seq:
            await asyncio.sleep(0.02)


async def test_bad_input_changes_nothing_stored(harness: Harness, db: asyncpg.Connection) -> None:
    await harness.start(limits=LIMITS)
    phone = await harness.phone()
    await phone.say("Note that Owen arrives Friday evening.", "kept-1")
    await phone.expect("card")
    await phone.reply()
    await settled(db, phone)
    before = await snapshot(db)
    assert all(before.values()), before  # every table has something to lose

    bad = [frame for _, frame, _, _ in BAD_INPUT]
    bad += [say(id="kept-1", text="x" * 51), say(id="kept-1", text="")]  # a stored id
    for frame in bad:
        await phone.send(frame)
    errors = [await phone.expect("error") for _ in bad]
    assert [e["code"] for e in errors] == [code for *_, code, _ in BAD_INPUT] + [
        "text_too_long",
        "invalid_text",
    ]
    early = await bare_link(harness)
    await early.send(say(id="early", text="before hello"))
    assert (await early.expect("error"))["code"] == "hello_first"
    await phone.send({"type": "ping"})
    await phone.expect("pong")

    assert await snapshot(db) == before


# -- resent says and unknown fields ---------------------------------------------------------


async def test_a_resent_say_is_stored_once_and_acked_the_same(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start()
    phone = await harness.phone()
    first = await phone.say("Hello there", "resend-me")
    await phone.reply()
    again = await phone.say("Hello there", "resend-me")
    assert (again["id"], again["seq"]) == (first["id"], first["seq"])
    assert again["repeat"] is True and "repeat" not in first  # marked: not a stream event
    await phone.say("Something new", "next")
    await phone.reply()

    assert await db.fetchval("SELECT count(*) FROM turns WHERE client_id = $1", "resend-me") == 1
    starts = [f["in_reply_to"] for f in phone.frames if f["type"] == "reply.start"]
    assert starts == [["resend-me"], ["next"]]
    await harness.recorded()
    replies = await db.fetchval("SELECT count(*) FROM turns WHERE role = 'assistant'")
    assert replies == 2


async def test_a_say_resent_at_once_is_acked_the_same(
    harness: Harness, db: asyncpg.Connection
) -> None:
    """An outbox resend before the first ack arrived: still one turn, one seq."""
    await harness.start()
    phone = await harness.phone()
    frame = say(id="twice", text="Hello there")
    await phone.send(frame)
    await phone.send(frame)
    seen: list[dict[str, Any]] = []
    while (kinds := [f["type"] for f in seen]).count("ack") < 2 or "reply.end" not in kinds:
        seen.append(await next_frame(phone))  # the reply may end before the second ack
    acks = [f for f in seen if f["type"] == "ack"]
    assert acks[0] == {"type": "ack", "id": "twice", "seq": acks[0]["seq"]}
    assert acks[1] == {**acks[0], "repeat": True}
    await phone.say("Something new", "next")
    await phone.reply()

    assert await db.fetchval("SELECT count(*) FROM turns WHERE client_id = $1", "twice") == 1
    starts = [f["in_reply_to"] for f in phone.frames if f["type"] == "reply.start"]
    assert starts == [["twice"], ["next"]]


async def test_unknown_fields_are_ignored(harness: Harness, db: asyncpg.Connection) -> None:
    await harness.start()
    extra = {"colour": "blue", "nested": {"a": [1, 2]}, "v2_feature": True}
    phone = await harness.phone(**extra)
    assert phone.welcome["resumed"] is False
    await phone.send({"type": "say", "id": "u-1", "text": "Hello there", **extra})
    ack = await phone.expect("ack")
    assert ack["id"] == "u-1"
    await phone.reply()
    await phone.send({"type": "ack", "seq": ack["seq"], **extra})
    await phone.send({"type": "ping", **extra})
    await phone.expect("pong")
    assert [f for f in phone.frames if f["type"] == "error"] == []
    stored = await db.fetchval("SELECT text FROM turns WHERE client_id = 'u-1'")
    assert stored == "Hello there"
