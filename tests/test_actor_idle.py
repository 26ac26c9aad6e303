"""Actors live while there is work: a quiet conversation's actor is deactivated after
`--actor-idle`, its links kept, and the next frame for it activates it from the database,
once, with its window, speaker and stream position."""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
import weakref
from typing import Any

import asyncpg
import pykka
import pytest

from actors import directory
from actors.conversation import ConversationActor, ThreadedConversation
from actors.directory import LiveConversation
from actors.messages import Attach, Snapshot
from actors.pooled import PooledActor
from storage.store import Store
from tests.conftest import Harness, Phone, eventually, loop_turns
from tests.test_admin import TOKEN, _get
from tests.test_follow_ons import lull
from tests.test_metrics import _scrape, _value

IDLE_S = 60.0


def _running() -> int:
    """Conversation actors running now, of either type, whatever server they belong to."""
    return len(pykka.ActorRegistry.get_by_class(ConversationActor))


def _actor_threads() -> int:
    """Threads of a conversation actor's own (`--actor-threads 0`)."""
    return sum(t.name.startswith(ThreadedConversation.__name__) for t in threading.enumerate())


def _live(harness: Harness, phone: Phone) -> LiveConversation:
    live = harness.server.directory.get(harness.person(phone))
    assert live is not None
    return live


async def _metric(harness: Harness, name: str) -> float:
    samples, _ = await _scrape(harness)
    return _value(samples, name)


async def _talked(harness: Harness, device: str | None = None) -> Phone:
    """A phone that named its speaker and heard the reply: a window of two turns, a speaker
    and a stream position to keep."""
    phone = await harness.phone(device)
    await phone.say("this is Owen speaking")
    await phone.reply()
    return phone


async def _deactivated(harness: Harness, phone: Phone, links: int = 1) -> LiveConversation:
    """The phone's conversation once quiet for `--actor-idle` and swept: no actor, no
    thread, its links kept."""
    live = _live(harness, phone)
    ref = live.ref
    assert ref is not None
    await harness.recorded()
    await eventually(lambda: _quiet(live))  # its follow-on drawn, say, under load
    harness.clock.advance(IDLE_S)
    assert (await harness.sweep())["deactivated"] == 1
    assert live.ref is None and harness.server.directory.get(live.person) is live
    await eventually(lambda: not ref.is_alive())
    assert harness.links(phone) == links
    return live


async def _snapshot(live: LiveConversation) -> Snapshot:
    snapshot: Snapshot = await live.ask(Attach)
    return snapshot


@pytest.mark.parametrize("actor_threads", [0, 4])
async def test_a_quiet_conversation_is_deactivated_its_thread_gone_its_link_kept(
    harness: Harness, actor_threads: int
) -> None:
    """On a thread of its own, the actor's thread ends with it; on the pool, it had none,
    and the pool's threads serve on."""
    await harness.start(actor_idle=IDLE_S, actor_threads=actor_threads)
    phone = await _talked(harness)
    other = await _talked(harness)
    running, threads = _running(), _actor_threads()
    assert threads == (2 if actor_threads == 0 else 0)
    harness.clock.advance(IDLE_S - 1)
    await other.say("hello again")  # the other phone talks: its actor is not quiet
    await other.reply()
    harness.clock.advance(1)
    report = await harness.sweep()
    assert report is not None
    assert (report["deactivated"], report["live"], report["active"]) == (1, 2, 1)
    live = _live(harness, phone)
    assert live.ref is None and _live(harness, other).ref is not None
    await eventually(lambda: _running() == running - 1)
    if actor_threads == 0:
        await eventually(lambda: _actor_threads() == threads - 1)
    else:
        pool = harness.server.runtime.actor_pool
        assert pool is not None and all(thread.is_alive() for thread in pool.threads)
    assert harness.links(phone) == 1
    assert await _metric(harness, "stillhere_live_actors") == 1
    assert await _metric(harness, "stillhere_conversations") == 2
    assert await _metric(harness, "stillhere_links") == 2
    assert await _metric(harness, "stillhere_deactivations_total") == 1
    # The link is still served while no actor runs: a ping is answered on the loop.
    await phone.send({"type": "ping"})
    await phone.expect("pong")
    assert live.ref is None
    assert (await harness.sweep())["deactivated"] == 0  # counted once, since the last sweep


async def test_the_quiet_actors_pass_lets_the_loop_run_between_slices(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 10,000 conversations the pass took 5 ms, and deactivating 3,000 of them 70 to
    100 ms with every frame waiting: it yields to the loop after every `SCAN_SLICE`."""
    await harness.start(actor_idle=IDLE_S)
    monkeypatch.setattr(directory, "SCAN_SLICE", 1, raising=False)
    phones = [await _talked(harness) for _ in range(3)]
    await harness.recorded()
    lives = [_live(harness, phone) for phone in phones]
    await eventually(lambda: all(_quiet(live) for live in lives))
    harness.clock.advance(IDLE_S)
    seen: list[int] = []  # the loop's turns at each deactivation
    deactivate = LiveConversation.deactivate
    async with loop_turns() as turns:

        def counted(live: LiveConversation) -> None:
            seen.append(turns())
            deactivate(live)

        monkeypatch.setattr(LiveConversation, "deactivate", counted)
        assert (await harness.sweep())["deactivated"] == 3
    assert len(set(seen)) == 3, f"three actors deactivated in one go: {seen}"
    assert all(live.ref is None for live in lives)


def _actor_of(ref: pykka.ActorRef[Any]) -> weakref.ref[PooledActor]:
    """The actor behind `ref` (a ref holds it weakly), found among every object tracked."""
    for found in gc.get_objects():
        if isinstance(found, PooledActor) and found.actor_urn == ref.actor_urn:
            return weakref.ref(found)
    raise AssertionError(f"no actor for {ref}")


async def test_a_deactivated_actor_is_freed_without_the_collector(harness: Harness) -> None:
    """A deactivated actor and its inbox referred to each other (the inbox serves the
    actor's method): every deactivation waited for the next full collection, some 19
    objects each, 180,000 after a ramp's 9,500 deactivations. With the collector off
    (CPython's and the server's pacing), the actor is freed once it has stopped."""
    await harness.start(actor_idle=IDLE_S, actor_threads=4, gc_young_every=0)
    phone = await _talked(harness)
    ref = _live(harness, phone).ref
    assert ref is not None
    gc.disable()
    try:
        actor = _actor_of(ref)
        await _deactivated(harness, phone)
        await eventually(lambda: actor() is None)
    finally:
        gc.enable()


async def test_a_turn_under_way_keeps_the_actor_past_the_idle_time(harness: Harness) -> None:
    await harness.start(actor_idle=IDLE_S, rehearsal_latency=1.0)
    phone = await harness.phone()
    await phone.say("hello")
    harness.clock.advance(2 * IDLE_S)  # the turn is still waiting for its first word
    assert (await harness.sweep())["deactivated"] == 0
    await phone.reply()
    assert _live(harness, phone).ref is not None


async def _bring_back(harness: Harness, phone: Phone, how: str) -> dict[str, Any]:
    """Send the frame `how` names to the deactivated conversation; what came of it."""
    if how == "say":
        ack = await phone.say("and what did I just tell you?")
        return {"ack": ack, "end": await phone.reply()}
    if how == "interrupt":
        await phone.send({"type": "interrupt"})
        live = _live(harness, phone)
        await eventually(lambda: live.ref is not None)
        return {}
    if how == "hello":
        again = await harness.phone(
            phone.device, conversation=phone.welcome["conversation"], last_seq=phone.last_seq
        )
        return {"welcome": again.welcome}
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["say", "interrupt", "hello"])
async def test_a_frame_activates_the_conversation_once_as_it_was(
    harness: Harness, how: str
) -> None:
    await harness.start(actor_idle=IDLE_S)
    phone = await _talked(harness)
    seen = phone.last_seq
    live = await _deactivated(harness, phone)
    running = _running()

    came = await _bring_back(harness, phone, how)

    assert await _metric(harness, "stillhere_activations_total") == 1
    assert live.ref is not None and _running() == running + 1
    assert harness.server.directory.get(live.person) is live  # the same stream, the same links
    snapshot = await _snapshot(live)
    roles = [t.role for t in snapshot.history]
    assert roles[:2] == ["user", "assistant"]
    assert snapshot.history[0].text == "this is Owen speaking"
    assert snapshot.speaker == "Owen"
    if how == "say":
        assert came["ack"]["seq"] == seen + 1  # the stream goes on where it was
        assert "Just before, I said" in came["end"]["text"]  # the window came back with it
        assert roles == ["user", "assistant", "user", "assistant"]
    if how == "hello":
        welcome = came["welcome"]
        assert welcome["resumed"] is True and welcome["seq"] == seen
        assert welcome["speaker"] == "Owen"
        assert [t["role"] for t in welcome["history"]] == ["user", "assistant"]
        assert live.stream.last_seq == seen
    assert await _metric(harness, "stillhere_activations_total") == 1


async def test_frames_racing_at_activation_make_one_actor(harness: Harness) -> None:
    await harness.start(actor_idle=IDLE_S)
    device = "device-racing-" + uuid.uuid4().hex
    phone = await _talked(harness, device)
    second = await harness.phone(device)
    live = await _deactivated(harness, phone, links=2)
    running = _running()

    acks = await asyncio.gather(
        phone.say("first of two"),
        second.say("second of two"),
        harness.phone(device),
    )

    assert await _metric(harness, "stillhere_activations_total") == 1
    assert _running() == running + 1
    assert acks[0]["seq"] != acks[1]["seq"]
    await phone.reply()
    snapshot = await _snapshot(live)
    texts = [t.text for t in snapshot.history if t.role == "user"]
    assert sorted(texts[1:]) == ["first of two", "second of two"]


async def test_a_follow_on_due_keeps_its_time_and_the_actor_goes_quiet_after(
    harness: Harness,
) -> None:
    """The one timer a conversation has on the server, a follow-on's pause after a lull,
    holds its actor active until it is sent: it comes on time, then the actor goes."""
    await harness.start(actor_idle=1.0, follow_ons="always")
    phone = await harness.phone()
    await lull(harness, phone)
    harness.clock.advance(1.5)  # past --actor-idle, before the pause (2 s at the least)
    assert (await harness.sweep())["deactivated"] == 0
    harness.clock.advance(10)
    start = await phone.expect("reply.start", lambda f: f.get("follow_on"))
    await phone.expect("reply.end", lambda f: f["reply"] == start["reply"])
    live = _live(harness, phone)
    await eventually(lambda: _quiet(live))
    harness.clock.advance(1.5)
    assert (await harness.sweep())["deactivated"] == 1


def _quiet(live: LiveConversation) -> bool:
    snapshot = live.current_snapshot()
    return snapshot is not None and snapshot.quiet_since() is not None


async def test_the_admin_list_leaves_it_inactive_and_its_page_activates_it(
    harness: Harness,
) -> None:
    await harness.start(actor_idle=IDLE_S, admin_token=TOKEN, admin_port=0)
    url = f"http://127.0.0.1:{harness.server.admin_port}"
    phone = await _talked(harness)
    live = await _deactivated(harness, phone)
    _, page = await _get(harness, url + "/admin/actors")
    assert [row["state"] for row in page["actors"]] == ["inactive"]
    assert live.ref is None
    _, detail = await _get(harness, f"{url}/admin/actors/{live.person}")
    assert detail["state"] == "idle" and detail["speaker"] == "Owen"
    assert [t["role"] for t in detail["window"]] == ["user", "assistant"]
    assert await _metric(harness, "stillhere_activations_total") == 1


async def test_nothing_acked_is_lost_across_deactivations(
    harness: Harness, db: asyncpg.Connection
) -> None:
    """A ledger over a phone that says, and is deactivated between says; every other time
    its link drops having kept only the say's ack, and the reply is replayed after the
    deactivation: every acked say stored once, every event seen once, seqs increasing."""
    await harness.start(actor_idle=IDLE_S)
    phone = await harness.phone()
    acked: list[str] = []
    seqs: list[int] = []
    for n in range(6):
        ack = await phone.say(f"tell me about number {n}", f"ledger-{n}")
        acked.append(ack["id"])
        end = await phone.reply()
        await harness.recorded()
        live = _live(harness, phone)
        await eventually(lambda: _quiet(live))  # noqa: B023 (awaited in this round)
        harness.clock.advance(IDLE_S)
        assert (await harness.sweep())["deactivated"] == 1
        if n % 2 == 0:
            await phone.send({"type": "ack", "seq": end["seq"]})
            continue
        seqs += [seq for seq in _numbered(phone) if seq <= ack["seq"]]
        await phone.drop()
        phone = await harness.phone(
            phone.device, conversation=phone.welcome["conversation"], last_seq=ack["seq"]
        )
        assert (await phone.reply())["text"] == end["text"]  # replayed, whole
    seqs += _numbered(phone)
    assert seqs == list(range(seqs[0], seqs[-1] + 1)), "every event once, in order"
    stored = await db.fetch("SELECT client_id FROM turns WHERE role = 'user' ORDER BY client_id")
    assert [r["client_id"] for r in stored] == sorted(acked)
    replies = await db.fetchval("SELECT count(*) FROM turns WHERE role = 'assistant'")
    assert replies == len(acked)


def _numbered(phone: Phone) -> list[int]:
    return [f["seq"] for f in phone.frames if "seq" in f and f["type"] != "welcome"]


async def test_a_memory_withdrawn_while_deactivated_stays_withdrawn(harness: Harness) -> None:
    await harness.start(actor_idle=IDLE_S)
    phone = await harness.phone()
    await phone.say("Note that Owen arrives Friday evening")
    await phone.reply()
    await phone.say("Note that Owen arrives Saturday morning")
    await phone.reply()
    wrong, right = (card["id"] for card in await _cards(harness, phone))
    await _deactivated(harness, phone)
    memory = harness.server.runtime.memory
    assert memory is not None
    await memory.mark_erroneous(harness.person(phone), uuid.UUID(wrong), uuid.UUID(right))
    again = await harness.phone(phone.device)
    assert [card["id"] for card in again.welcome["cards"]] == [right]


async def _cards(harness: Harness, phone: Phone) -> list[dict[str, Any]]:
    snapshot = await _snapshot(_live(harness, phone))
    return [card.wire() for card in snapshot.cards]


async def test_an_idle_conversation_deactivated_is_archived_without_its_actor(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start(actor_idle=IDLE_S)
    phone = await _talked(harness)
    await _deactivated(harness, phone)
    harness.clock.advance(30 * 60)
    assert (await harness.sweep())["archived"] == 1
    assert (await phone.expect("bye"))["reason"] == "idle"
    assert await _metric(harness, "stillhere_activations_total") == 0
    assert await db.fetchval("SELECT status FROM conversations") == "archived"


async def test_a_leave_ends_a_deactivated_conversation_without_activating_it(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start(actor_idle=IDLE_S)
    phone = await _talked(harness)
    await _deactivated(harness, phone)
    await phone.send({"type": "leave"})
    assert (await phone.expect("bye"))["reason"] == "leave"
    assert await db.fetchval("SELECT archive_reason FROM conversations") == "leave"
    assert await _metric(harness, "stillhere_activations_total") == 0
    again = await harness.phone(phone.device)
    assert again.welcome["resumed"] is False and again.welcome["history"] == []


async def test_an_activation_that_cannot_read_the_record_is_tried_again_by_the_resend(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await harness.start(actor_idle=IDLE_S)
    phone = await _talked(harness)
    live = await _deactivated(harness, phone)
    real = Store.active_conversation

    async def unreachable_once(store: Store, person: str, window: int) -> Any:
        monkeypatch.setattr(Store, "active_conversation", real)
        raise ConnectionRefusedError("PostgreSQL out of reach")

    monkeypatch.setattr(Store, "active_conversation", unreachable_once)
    await phone.send({"type": "say", "id": "r1", "text": "are you there?"})
    error = await phone.expect("error")
    assert (error["code"], error["id"]) == ("internal_error", "r1")
    assert live.ref is None and not live.active
    await phone.say("are you there?", "r1")  # the phone resends it, with its id
    assert "Just before, I said" in (await phone.reply())["text"]
    assert await _metric(harness, "stillhere_activations_total") == 1


@pytest.mark.parametrize("actor_threads", [0, 4])
async def test_conversations_all_talking_run_on_the_pools_threads(
    harness: Harness, actor_threads: int
) -> None:
    """Forty conversations with a link each, all talking at once and never deactivated:
    on the pool they add no thread (a couple at most, the loop's own helpers); with a
    thread each, forty."""
    await harness.start(actor_threads=actor_threads, actor_idle=0)
    await _talked(harness)  # whatever threads the server makes for a first turn, made
    before = threading.active_count()
    phones = [await harness.phone() for _ in range(40)]
    peak = threading.active_count()

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, threading.active_count())
            await asyncio.sleep(0.005)

    async def talk(phone: Phone) -> None:
        await phone.say("all of us at once")
        await phone.reply()

    sampler = asyncio.ensure_future(sample())
    try:
        await asyncio.gather(*(talk(phone) for phone in phones))
    finally:
        sampler.cancel()
    assert _running() == 41
    assert await _metric(harness, "stillhere_actor_threads") == (actor_threads or 41)
    if actor_threads:
        assert peak <= before + 2
    else:
        assert peak >= before + 40
