"""The reference client (`client.Phone`) against the real server, through a cutting proxy.

Drops are made at the TCP level (tests/fakes/cutting_proxy.py), so the client finds out
about them the way a phone on a train does. The reconnect schedule is checked through the
phone's injectable `sleep` and `clock`, never by measuring time; elsewhere the backoff is
shortened so that reconnecting takes milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from client import Backoff, LinkState, Phone, Refused
from client.links import Credentials, EventStreamLink
from tests.conftest import Harness
from tests.fakes.cutting_proxy import CuttingProxy

FAST = Backoff(first=0.02, factor=2.0, cap=0.1)
STORY = "tell me a story about trains"
TRANSPORTS = ["ws", "sse"]

StartProxy = Callable[..., Awaitable[CuttingProxy]]


@pytest.fixture
async def proxied(harness: Harness) -> AsyncIterator[StartProxy]:
    """Start the server with the given settings and a cutting proxy in front of it."""
    proxies: list[CuttingProxy] = []

    async def start(**settings: Any) -> CuttingProxy:
        await harness.start(**settings)
        target = URL(harness.url("/"))
        assert target.host is not None and target.port is not None
        proxy = await CuttingProxy(target.host, target.port).start()
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        await proxy.stop()


@pytest.fixture
async def phones(harness: Harness) -> AsyncIterator[list[Phone]]:
    """Phones to close at the end of the test (before the server stops)."""
    made: list[Phone] = []
    yield made
    for phone in made:
        await phone.close()


class FakeTime:
    """The phone's `sleep` and `clock`: sleeps are recorded and last (almost) nothing."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0.005)  # yield, and keep a refused phone from spinning hot

    def clock(self) -> float:
        return self.now


def replies(phone: Phone) -> dict[str, dict[str, Any]]:
    """Per reply id: its start, its deltas' joined text, its end."""
    found: dict[str, dict[str, Any]] = {}
    for event in phone.events:
        if event["type"].startswith("reply."):
            reply = found.setdefault(event["reply"], {"start": None, "text": "", "end": None})
            if event["type"] == "reply.start":
                reply["start"] = event
            elif event["type"] == "reply.delta":
                reply["text"] += event["text"]
            else:
                reply["end"] = event
    return found


def answered(phone: Phone, id_: str) -> bool:
    return any(
        r["end"] is not None and r["start"] is not None and id_ in r["start"]["in_reply_to"]
        for r in replies(phone).values()
    )


def deltas(phone: Phone) -> int:
    return sum(e["type"] == "reply.delta" for e in phone.events)


@contextlib.asynccontextmanager
async def scripted_server(
    ws: Callable[[web.Request], Awaitable[web.StreamResponse]],
    *,
    leave: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None,
) -> AsyncIterator[str]:
    """A scripted server: `ws` answers `/v1/ws`, `leave` (if given) `POST /v1/leave`.
    Its base URL; it stops on the way out."""
    app = web.Application()
    app.router.add_get("/v1/ws", ws)
    if leave is not None:
        app.router.add_post("/v1/leave", leave)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("/"))
    finally:
        await server.close()


def refusals(phone: Phone) -> int:
    return [f.get("code") for f in phone.delivered].count("rate_limited")


async def stored(db: asyncpg.Connection, id_: str) -> int:
    """How many times the say with this client id is stored."""
    return int(await db.fetchval("SELECT count(*) FROM turns WHERE client_id = $1", id_))


async def answers(db: asyncpg.Connection, id_: str) -> int:
    """How many stored replies answer the say with this client id."""
    query = "SELECT count(*) FROM turns WHERE role = 'assistant' AND $1 = ANY(in_reply_to)"
    return int(await db.fetchval(query, id_))


def assert_exactly_once_in_order(phone: Phone, says: list[str]) -> None:
    seqs = [e["seq"] for e in phone.events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gaps or duplicates"
    for reply in replies(phone).values():
        assert reply["start"] is not None and reply["end"] is not None
        assert reply["text"] == reply["end"]["text"]
    acks = Counter(e["id"] for e in phone.events if e["type"] == "ack")
    assert acks == Counter(says)
    assert phone.outbox == {}


# -- the backoff schedule -----------------------------------------------------------------


def test_the_schedule_doubles_from_one_second_up_to_fifteen() -> None:
    rng = random.Random(1)
    assert [Backoff().delay(n, rng) for n in range(8)] == [1, 2, 4, 8, 15, 15, 15, 15]
    assert Backoff().delay(100_000, rng) == 15  # no overflow after a very long tunnel


def test_jitter_stays_within_its_bounds_and_the_cap() -> None:
    backoff = Backoff(jitter=0.5)
    rng = random.Random(7)
    for attempt, base in enumerate([1, 2, 4, 8, 15, 15]):
        seen = [backoff.delay(attempt, rng) for _ in range(500)]
        assert min(seen) >= base * 0.5
        assert max(seen) <= min(15, base * 1.5)
        assert len(set(seen)) > 100  # it does jitter
    assert max(backoff.delay(10, rng) for _ in range(500)) == pytest.approx(15, abs=0.5)


@pytest.mark.parametrize("jitter", [0.0, 0.3])
async def test_a_phone_in_a_tunnel_retries_on_the_schedule(
    proxied: StartProxy, phones: list[Phone], jitter: float
) -> None:
    proxy = await proxied()
    time = FakeTime()
    backoff = Backoff(jitter=jitter)
    phone = Phone(proxy.url(), backoff=backoff, sleep=time.sleep, clock=time.clock)
    phones.append(phone)
    await phone.start()
    proxy.tunnel()
    await phone.wait_until(lambda: len(time.sleeps) >= 8, 10)
    proxy.allow()
    await phone.wait_until(lambda: phone.reconnects == 1, 10)
    schedule = [1, 2, 4, 8, 15, 15, 15, 15]
    if not jitter:
        assert time.sleeps[:8] == schedule
    for attempt, (slept, base) in enumerate(zip(time.sleeps[:8], schedule, strict=True)):
        assert base * (1 - jitter) <= slept <= min(15, base * (1 + jitter)), attempt
    assert all(s <= 15 for s in time.sleeps)


async def test_the_schedule_starts_over_once_a_link_has_held(
    proxied: StartProxy, phones: list[Phone]
) -> None:
    proxy = await proxied()
    time = FakeTime()
    phone = Phone(proxy.url(), sleep=time.sleep, clock=time.clock)
    phones.append(phone)
    await phone.start()
    proxy.tunnel()
    await phone.wait_until(lambda: len(time.sleeps) >= 4, 10)  # 1, 2, 4, 8, ...
    proxy.allow()
    await phone.wait_until(lambda: phone.reconnects == 1, 10)
    before = len(time.sleeps)
    time.now += 1.0  # the link lasts one second: still the same bad patch
    proxy.cut()
    await phone.wait_until(lambda: phone.reconnects == 2, 10)
    assert time.sleeps[before] == Backoff().delay(before, random.Random())  # no reset
    time.now += 5.0  # held `hold` seconds: recovered
    proxy.cut()
    await phone.wait_until(lambda: phone.reconnects == 3, 10)
    assert time.sleeps[before + 1] == 1.0


async def test_a_silent_tunnel_times_out_each_attempt(
    proxied: StartProxy, phones: list[Phone]
) -> None:
    proxy = await proxied()
    time = FakeTime()
    phone = Phone(proxy.url(), sleep=time.sleep, clock=time.clock, connect_timeout=0.2)
    phones.append(phone)
    await phone.start()
    proxy.blackhole()  # connections open, then nothing: no welcome ever comes
    proxy.cut()
    await phone.wait_until(lambda: len(time.sleeps) >= 3, 10)
    assert time.sleeps[:3] == [1, 2, 4]  # each timed-out attempt counts as failed
    proxy.allow()
    await phone.wait_until(lambda: phone.state is LinkState.UP, 10)
    assert phone.reconnects == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_held_drop_leaves_the_server_a_silent_link_until_it_is_reset(
    harness: Harness, phones: list[Phone], transport: str
) -> None:
    """A tunnel as it really is: the phone lets go of its link, and the server, told
    nothing, keeps it attached beside the one the phone comes back on."""
    await harness.start()
    phone = Phone(harness.url("/"), transport=transport, backoff=FAST)
    phones.append(phone)
    await phone.start()
    held = phone.drop(hold=True)
    assert held is not None
    await phone.wait_until(lambda: phone.reconnects == 1 and phone.state is LinkState.UP, 10)
    id_ = phone.say("Note that Owen arrives Friday evening")
    await phone.wait_until(lambda: answered(phone, id_), 10)
    assert harness.links(phone) == 2, "the server never heard of the drop"
    held.reset()
    async with asyncio.timeout(10):
        while harness.links(phone) != 1:
            await asyncio.sleep(0.01)
    assert_exactly_once_in_order(phone, [id_])
    assert phone.welcome is not None and phone.welcome["resumed"] is True


# -- outbox, replay, exactly once ------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_say_made_in_a_tunnel_is_sent_when_the_link_returns(
    harness: Harness,
    proxied: StartProxy,
    phones: list[Phone],
    db: asyncpg.Connection,
    transport: str,
) -> None:
    proxy = await proxied()
    phone = Phone(proxy.url(), transport=transport, backoff=FAST)
    phones.append(phone)
    await phone.start()
    proxy.tunnel()
    await phone.wait_until(lambda: phone.state is not LinkState.UP, 10)
    id_ = phone.say("Note that Owen arrives Friday evening")
    await phone.wait_until(lambda: proxy.refused >= 2, 10)  # attempts fail; the say waits
    assert phone.outbox == {id_: "Note that Owen arrives Friday evening"}
    proxy.allow()
    await phone.wait_until(lambda: answered(phone, id_), 15)
    assert_exactly_once_in_order(phone, [id_])
    assert phone.welcome is not None and phone.welcome["resumed"] is True
    await harness.recorded()
    assert (await stored(db, id_), await answers(db, id_)) == (1, 1)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_say_stored_whose_ack_was_lost_is_resent_and_acked_once(
    harness: Harness,
    proxied: StartProxy,
    phones: list[Phone],
    db: asyncpg.Connection,
    transport: str,
) -> None:
    proxy = await proxied()
    phone = Phone(proxy.url(), transport=transport, backoff=FAST)
    phones.append(phone)
    await phone.start()
    first = phone.say("hello")
    await phone.wait_until(lambda: answered(phone, first), 10)
    proxy.mute()  # the downlink dies first: the say gets through, its ack does not
    id_ = phone.say("Note that Owen arrives Friday evening")
    async with asyncio.timeout(10):
        while not await stored(db, id_):
            await asyncio.sleep(0.01)
    assert id_ in phone.outbox
    proxy.unmute()
    proxy.cut()
    await phone.wait_until(lambda: answered(phone, id_), 15)
    assert_exactly_once_in_order(phone, [first, id_])
    assert await stored(db, id_) == 1
    await harness.recorded()
    assert await answers(db, id_) == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_reply_cut_mid_stream_is_delivered_once_and_in_order(
    proxied: StartProxy, phones: list[Phone], db: asyncpg.Connection, transport: str
) -> None:
    proxy = await proxied(rehearsal_rate=40)
    phone = Phone(proxy.url(), transport=transport, backoff=FAST)
    phones.append(phone)
    await phone.start()
    story = phone.say(STORY)
    await phone.wait_until(lambda: deltas(phone) >= 5, 10)
    assert proxy.cut() >= 1
    during = phone.say("wow, trains")  # sent into the cut, or queued: either way once
    await phone.wait_until(lambda: deltas(phone) >= 25 and phone.state is LinkState.UP, 10)
    assert proxy.cut() >= 1
    await phone.wait_until(lambda: answered(phone, story) and answered(phone, during), 20)
    after = phone.say("and then?")
    await phone.wait_until(lambda: answered(phone, after), 20)
    assert phone.reconnects >= 2
    assert len({phone.conversation}) == 1 and phone.welcome is not None
    assert phone.welcome["resumed"] is True
    assert_exactly_once_in_order(phone, [story, during, after])
    ends = [e for e in phone.events if e["type"] == "reply.end"]
    assert not any(e["interrupted"] for e in ends)
    assert "Sentence 12 of the story about trains" in ends[0]["text"]
    stored = await db.fetch("SELECT client_id, count(*) AS n FROM turns GROUP BY client_id")
    assert {r["client_id"]: r["n"] for r in stored if r["client_id"]} == {
        story: 1,
        during: 1,
        after: 1,
    }


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_every_event_reaches_the_app_once_through_many_drops(
    proxied: StartProxy, phones: list[Phone], transport: str
) -> None:
    proxy = await proxied(rehearsal_rate=40)
    seen: list[dict[str, Any]] = []
    phone = Phone(proxy.url(), transport=transport, backoff=FAST, on_event=seen.append)
    phones.append(phone)
    await phone.start()
    says = [phone.say(STORY)]
    for round_ in range(6):
        await phone.wait_until(lambda: phone.state is LinkState.UP, 10)
        target = deltas(phone) + 8
        await phone.wait_until(lambda t=target: deltas(phone) >= t or phone.outbox == {}, 10)
        if round_ % 2:
            phone.drop()  # the phone's own abort
        else:
            proxy.cut()  # the network's
        says.append(phone.say(f"still there? {round_}"))
    await phone.wait_until(lambda: all(answered(phone, id_) for id_ in says), 30)
    assert_exactly_once_in_order(phone, says)
    assert [f for f in seen if "seq" in f and f["type"] != "welcome"] == phone.events
    assert sum(f["type"] == "welcome" for f in seen) == phone.reconnects + 1


async def test_the_phone_drops_what_it_already_has_whatever_the_server_resends(
    phones: list[Phone],
) -> None:
    """A scripted, sloppy server replays everything on every link and repeats acks: the
    app still sees each event once, in order, and a new conversation starts numbering over."""
    c1, c2 = "c1", "c2"
    reply = {"reply": "r1"}
    links: list[list[dict[str, Any]]] = [
        [
            {"type": "welcome", "conversation": c1, "resumed": False, "seq": 0},
            {"type": "ack", "id": "a", "seq": 1},
            {"type": "reply.start", "seq": 2, "in_reply_to": ["a"], **reply},
            {"type": "reply.delta", "seq": 3, "text": "Hel", **reply},
        ],
        [
            {"type": "welcome", "conversation": c1, "resumed": True, "seq": 4},
            {"type": "ack", "id": "a", "seq": 1},  # from the start again
            {"type": "reply.start", "seq": 2, "in_reply_to": ["a"], **reply},
            {"type": "reply.delta", "seq": 3, "text": "Hel", **reply},
            {"type": "reply.delta", "seq": 4, "text": "lo", **reply},
            {"type": "reply.end", "seq": 5, "text": "Hello", "interrupted": False, **reply},
            {"type": "ack", "id": "a", "seq": None, "repeat": True},  # after a crash: no seq
            {"type": "bye", "reason": "idle"},
        ],
        [
            {"type": "welcome", "conversation": c2, "resumed": False, "seq": 0},
            {"type": "ack", "id": "b", "seq": 1},
        ],
    ]
    hellos: list[dict[str, Any]] = []

    async def scripted(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        hellos.append(await ws.receive_json())
        if not links:
            async for _ in ws:  # the last link stays open
                pass
            return ws
        for frame in links.pop(0):
            await ws.send_json(frame)
        await ws.close()
        return ws

    async with scripted_server(scripted) as url:
        phone = Phone(url, backoff=FAST)
        phones.append(phone)
        phone.say("hi", id="a")
        phone.say("and you?", id="b")  # acked only in the next conversation
        await phone.start()
        await phone.wait_until(lambda: len(hellos) == 4 and not phone.outbox, 10)
        await phone.close()
    assert [(e["type"], e["seq"]) for e in phone.events] == [
        ("ack", 1),
        ("reply.start", 2),
        ("reply.delta", 3),
        ("reply.delta", 4),
        ("reply.end", 5),
        ("ack", 1),
    ]
    assert [(h.get("conversation"), h.get("last_seq")) for h in hellos] == [
        (None, None),
        (c1, 3),
        (c1, 5),
        (c2, 1),
    ]
    kinds = [f["type"] for f in phone.delivered]
    assert kinds.count("welcome") == 3 and kinds.count("bye") == 1


async def test_a_repeated_ack_from_an_ended_conversation_is_not_an_event_of_the_next(
    harness: Harness, phones: list[Phone]
) -> None:
    """A say stored as event 1 of a conversation that has ended since, resent in the next
    one: its repeated ack carries that old seq 1, which is also the new conversation's
    first. The app gets the new conversation's event 1, and the say leaves the outbox."""
    await harness.start()
    device = "device-" + uuid.uuid4().hex
    earlier = await harness.phone(device)
    assert (await earlier.say("Note that Owen arrives Friday", "kept"))["seq"] == 1
    await earlier.reply()
    await earlier.send({"type": "leave"})
    await earlier.expect("bye")
    phone = Phone(harness.url("/"), device=device, backoff=FAST)
    phones.append(phone)
    phone.say("Note that Owen arrives Friday", id="kept")  # its ack never reached this phone
    await phone.start()
    await phone.wait_until(lambda: not phone.outbox, 10)
    new = phone.say("and Mia comes on Sunday")
    await phone.wait_until(lambda: answered(phone, new), 10)
    assert [(e["id"], e["seq"]) for e in phone.events if e["type"] == "ack"] == [(new, 1)]
    assert_exactly_once_in_order(phone, [new])


# -- link state, leave, close, bye ---------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_dot_goes_red_amber_green_across_a_drop(
    proxied: StartProxy, phones: list[Phone], transport: str
) -> None:
    proxy = await proxied()
    states: list[LinkState] = []
    phone = Phone(proxy.url(), transport=transport, backoff=FAST, on_state=states.append)
    phones.append(phone)
    await phone.start()
    assert states == [LinkState.CONNECTING, LinkState.UP]
    phone.drop()
    await phone.wait_until(lambda: phone.reconnects == 1 and phone.state is LinkState.UP, 10)
    assert states == [
        LinkState.CONNECTING,
        LinkState.UP,
        LinkState.DOWN,
        LinkState.CONNECTING,
        LinkState.UP,
    ]
    proxy.tunnel()
    await phone.wait_until(lambda: proxy.refused >= 2, 10)
    proxy.allow()
    await phone.wait_until(lambda: phone.reconnects == 2 and phone.state is LinkState.UP, 10)
    tail = states[5:]
    assert tail[0] is LinkState.DOWN and tail[-1] is LinkState.UP
    assert tail[:-1] == [LinkState.DOWN, LinkState.CONNECTING] * (len(tail) // 2)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_close_keeps_the_conversation_and_leave_ends_it(
    harness: Harness, phones: list[Phone], db: asyncpg.Connection, transport: str
) -> None:
    await harness.start()
    device = "device-" + "x" * 30
    first = Phone(harness.url("/"), device=device, transport=transport)
    phones.append(first)
    await first.start()
    said = first.say("Note that Owen arrives Friday evening")
    await first.wait_until(lambda: answered(first, said), 10)
    await first.close()  # the app was killed
    assert first.state is LinkState.DOWN

    again = Phone(harness.url("/"), device=device, transport=transport)
    phones.append(again)
    await again.start()
    assert again.welcome is not None and again.welcome["resumed"] is True
    assert again.conversation == first.conversation
    assert [t["role"] for t in again.welcome["history"]] == ["user", "assistant"]
    await again.leave()
    assert again.state is LinkState.DOWN
    byes = [f for f in again.delivered if f["type"] == "bye"]
    assert byes == [{"type": "bye", "reason": "leave"}]
    status = await db.fetchrow(
        "SELECT status, archive_reason FROM conversations WHERE id = $1::uuid",
        again.conversation,
    )
    assert tuple(status) == ("archived", "leave")
    await asyncio.sleep(0.2)  # leaving is not a drop: no hello may follow it
    assert await db.fetchval("SELECT count(*) FROM conversations WHERE status = 'active'") == 0
    assert again.reconnects == 0

    fresh = Phone(harness.url("/"), device=device, transport=transport)
    phones.append(fresh)
    await fresh.start()
    assert fresh.welcome is not None and fresh.welcome["resumed"] is False
    assert fresh.conversation != first.conversation


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_after_an_idle_bye_the_phone_comes_back_to_a_new_conversation(
    harness: Harness, phones: list[Phone], transport: str
) -> None:
    await harness.start()
    phone = Phone(harness.url("/"), transport=transport, backoff=FAST)
    phones.append(phone)
    await phone.start()
    said = phone.say("hello")
    await phone.wait_until(lambda: answered(phone, said), 10)
    old, seen = phone.conversation, phone.last_seq
    harness.clock.advance(31 * 60)
    report = await harness.sweep()
    assert report is not None and report["archived"] == 1
    await phone.wait_until(lambda: phone.conversation != old and phone.reconnects == 1, 10)
    assert {"type": "bye", "reason": "idle"} in phone.delivered
    assert phone.welcome is not None and phone.welcome["resumed"] is False
    assert phone.last_seq == phone.welcome["seq"] < seen  # numbering starts over
    later = phone.say("hello again")
    await phone.wait_until(lambda: answered(phone, later), 10)
    assert phone.events[-1]["seq"] == phone.last_seq


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_account_phone_interrupts_a_story(
    harness: Harness, phones: list[Phone], transport: str
) -> None:
    await harness.start(rehearsal_rate=40)
    token = harness.server.identity.issue("hannah")
    phone = Phone(harness.url("/"), token=token, transport=transport)
    phones.append(phone)
    await phone.start()
    assert phone.device is None
    story = phone.say(STORY)
    await phone.wait_until(lambda: deltas(phone) >= 3, 10)
    await phone.interrupt()
    await phone.wait_until(lambda: answered(phone, story), 10)
    (reply,) = replies(phone).values()
    assert reply["end"]["interrupted"] is True
    assert reply["end"]["text"] == reply["text"]  # what was sent, and nothing more
    assert_exactly_once_in_order(phone, [story])


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_refused_credentials_fail_the_start(harness: Harness, transport: str) -> None:
    await harness.start()
    phone = Phone(harness.url("/"), device="too-short", transport=transport)
    with pytest.raises(Refused):
        await phone.start()
    assert phone.state is LinkState.DOWN
    assert phone.delivered[-1]["code"] == "unauthorized"


async def test_a_say_the_server_can_never_take_leaves_the_outbox(
    harness: Harness, phones: list[Phone]
) -> None:
    await harness.start()
    for transport in TRANSPORTS:
        phone = Phone(harness.url("/"), transport=transport)
        phones.append(phone)
        await phone.start()
        id_ = phone.say("   ")
        await phone.wait_until(lambda p=phone: p.outbox == {}, 10)
        errors = [f for f in phone.delivered if f["type"] == "error"]
        assert [(e["code"], e["id"]) for e in errors] == [("invalid_text", id_)]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_whole_reply_is_confirmed_so_the_server_lets_it_go(
    harness: Harness, phones: list[Phone], transport: str
) -> None:
    await harness.start(rehearsal_rate=0)
    phone = Phone(harness.url("/"), transport=transport, backoff=FAST)
    phones.append(phone)
    await phone.start()
    said = phone.say("one night or two?")
    await phone.wait_until(lambda: answered(phone, said), 10)
    live = harness.server.directory.get(harness.server.identity.person(device=phone.device))
    assert live is not None
    if transport == "ws":  # an ack frame after the reply's end
        await phone.wait_until(lambda: live.stream.buffered == 0, 10)
    else:  # no frame for it over SSE: the buffer is kept until the next hello
        assert live.stream.buffered > 0


async def test_a_say_the_server_could_never_read_is_refused_by_say(
    harness: Harness, phones: list[Phone]
) -> None:
    """Over the server's limits a say gets an error that cannot name it (or the link is
    closed), so it would stay in the outbox for ever: `say` refuses it at once."""
    await harness.start()
    phone = Phone(harness.url("/"))
    phones.append(phone)
    await phone.start()
    limits = harness.server.settings.limits  # the server's defaults are the client's
    assert phone.max_text_chars == limits.max_text_chars
    assert phone.max_id_chars == limits.max_id_chars
    for text, id_ in [("x" * 4001, None), ("fine", ""), ("fine", "i" * 129), ("fine", "a\x00b")]:
        with pytest.raises(ValueError):
            phone.say(text, id=id_)
    assert phone.outbox == {}
    at_limits = phone.say("x" * 4000, id="i" * 128)
    await phone.wait_until(lambda: answered(phone, at_limits), 10)
    roomy = Phone(harness.url("/"), max_text_chars=10_000)  # for a server configured so
    assert roomy.say("x" * 10_000) in roomy.outbox


async def test_an_sse_say_is_not_stored_past_the_end_of_its_stream_s_conversation(
    harness: Harness, db: asyncpg.Connection
) -> None:
    """Ended by the idle sweep while the stream has not yet read its bye, the conversation
    gets no say from the link: the POST names it, and the answer tells the link to go."""
    await harness.start()
    link = EventStreamLink(harness.http, harness.url("/"), Credentials(device="d" * 32))
    try:
        welcome = await link.open(None, 0)
        harness.clock.advance(31 * 60)
        report = await harness.sweep()
        assert report is not None and report["archived"] == 1
        answer = await link.say("late-1", "two")
        assert answer is not None and (answer["code"], answer["id"]) == (
            "conversation_ended",
            "late-1",
        )
    finally:
        link.abort()
    assert welcome["conversation"]
    assert await db.fetchval("SELECT count(*) FROM conversations WHERE status = 'active'") == 0
    assert await db.fetchval("SELECT count(*) FROM turns") == 0


async def test_a_leave_while_a_hello_is_unanswered_ends_the_conversation_it_reaches(
    phones: list[Phone],
) -> None:
    """A hello on the wire cannot be taken back, so a leave waits for its answer and ends
    the conversation it reached; sent before, it would find none and the hello would then
    start one that nobody ends."""
    seen: list[str] = []
    answer_second = asyncio.Event()

    async def scripted(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.receive_json()
        n = sum(1 for s in seen if s.startswith("hello")) + 1
        seen.append(f"hello {n}")
        if n == 2:
            await answer_second.wait()
        await ws.send_json({"type": "welcome", "conversation": f"c{n}", "resumed": False, "seq": 0})
        seen.append(f"welcome {n}")
        async for message in ws:
            if message.json().get("type") == "leave":
                seen.append(f"leave on {n}")
                await ws.send_json({"type": "bye", "reason": "leave"})
                await ws.close()
        return ws

    async def post_leave(request: web.Request) -> web.Response:
        seen.append("POST leave")
        return web.json_response({"type": "bye", "reason": "leave"})

    async with scripted_server(scripted, leave=post_leave) as url:
        phone = Phone(url, backoff=FAST)
        phones.append(phone)
        await phone.start()
        phone.drop()
        await phone.wait_until(lambda: "hello 2" in seen, 10)
        assert phone.state is LinkState.CONNECTING
        leaving = asyncio.get_running_loop().create_task(phone.leave())
        await asyncio.sleep(0.1)  # the leave is under way, the hello still unanswered
        answer_second.set()
        await leaving
    assert seen == ["hello 1", "welcome 1", "hello 2", "welcome 2", "leave on 2"]
    assert phone.conversation == "c2" and phone.state is LinkState.DOWN


async def test_a_say_rate_limited_on_two_links_is_resent_on_the_second(
    phones: list[Phone],
) -> None:
    """Refused for its rate on one link, then on the next before the first link's resend
    woke: the resend is the second link's, and the say gets there."""
    got: list[tuple[int, str]] = []
    links = 0

    async def scripted(request: web.Request) -> web.WebSocketResponse:
        nonlocal links
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.receive_json()
        links += 1
        n = links
        await ws.send_json({"type": "welcome", "conversation": "c1", "resumed": n > 1, "seq": 0})
        async for message in ws:
            frame = message.json()
            if frame.get("type") != "say":
                continue
            got.append((n, frame["id"]))
            if n == 1 or got.count((2, frame["id"])) == 1:
                await ws.send_json({"type": "error", "code": "rate_limited", "message": "slow"})
                if n == 1:
                    await ws.close()
            else:
                await ws.send_json({"type": "ack", "id": frame["id"], "seq": 1})
        return ws

    waking = asyncio.Event()

    async def sleep(seconds: float) -> None:
        task = asyncio.current_task()
        if task is None or task.get_name() != "phone":  # a resend waits for the test
            await waking.wait()

    async with scripted_server(scripted) as url:
        phone = Phone(url, backoff=FAST, sleep=sleep)
        phones.append(phone)
        await phone.start()
        phone.say("one night or two?", id="a")
        await phone.wait_until(lambda: refusals(phone) == 2, 10)
        waking.set()
        await phone.wait_until(lambda: not phone.outbox, 10)
        await phone.close()
    assert got == [(1, "a"), (2, "a"), (2, "a")]
