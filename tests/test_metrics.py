"""`GET /metrics`: Prometheus counters move where the conversation's life says they should."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Harness, eventually
from tests.fakes.openai_server import Fail, FakeOpenAI, Reply
from tests.sse_client import SseClient

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def _scrape(harness: Harness) -> tuple[Samples, set[str]]:
    """Every sample by (name, labels), and the metric families declared."""
    async with harness.http.get(harness.url("/metrics")) as response:
        assert response.status == 200
        assert response.content_type == "text/plain"
        text = await response.text()
    samples: Samples = {}
    families = set()
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, families


def _value(samples: Samples, name: str, **labels: Any) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_every_metric_is_declared(harness: Harness) -> None:
    await harness.start()
    samples, families = await _scrape(harness)
    assert {
        "stillhere_live_actors",
        "stillhere_links",
        "stillhere_hellos",
        "stillhere_archives",
        "stillhere_turn_seconds",
        "stillhere_model_retries",
        "stillhere_context_source_failures",
        "stillhere_replayed_events",
        "stillhere_hello_seconds",
        "stillhere_loop_lag_seconds",
        "stillhere_gc_pause_seconds",
        "stillhere_resends_joined",
    } <= families
    assert _value(samples, "stillhere_hellos_total", outcome="resumed") == 0
    assert ("stillhere_hellos_total", (("outcome", "new"),)) in samples  # known labels at 0


async def test_hellos_links_and_replayed_events(harness: Harness) -> None:
    await harness.start()
    phone = await harness.phone()
    ack = await phone.say("Note that Owen arrives Friday evening")
    await phone.reply()
    samples, _ = await _scrape(harness)
    assert _value(samples, "stillhere_hellos_total", outcome="new") == 1
    assert _value(samples, "stillhere_live_actors") == 1
    assert _value(samples, "stillhere_links") == 1
    assert _value(samples, "stillhere_replayed_events_total") == 0

    await phone.drop()
    await eventually(lambda: harness.links(phone) == 0)
    samples, _ = await _scrape(harness)
    assert _value(samples, "stillhere_links") == 0

    missed = [f for f in phone.frames if f.get("seq", 0) > ack["seq"] and f["type"] != "welcome"]
    again = await harness.phone(
        phone.device, conversation=phone.welcome["conversation"], last_seq=ack["seq"]
    )
    assert again.welcome["resumed"] is True
    samples, _ = await _scrape(harness)
    assert _value(samples, "stillhere_hellos_total", outcome="new") == 1
    assert _value(samples, "stillhere_hellos_total", outcome="resumed") == 1
    assert _value(samples, "stillhere_replayed_events_total") == len(missed) > 0
    assert _value(samples, "stillhere_links") == 1
    for outcome in ("new", "resumed"):  # one per hello answered
        assert _value(samples, "stillhere_hello_seconds_count", outcome=outcome) == 1
        assert _value(samples, "stillhere_hello_seconds_bucket", le="+Inf", outcome=outcome) == 1


async def test_a_post_say_is_no_hello(harness: Harness) -> None:
    """Over SSE the event stream says hello; each POST say opens the conversation too, and
    must not count as one."""
    await harness.start()
    client = SseClient(harness.http, harness.url)
    try:
        stream = await client.open()
        assert (await stream.next()).type == "welcome"
        for text in ("one", "two"):
            await client.say(text)
            await stream.expect("reply.end")
        samples, _ = await _scrape(harness)
    finally:
        await client.close()
    assert _value(samples, "stillhere_hellos_total", outcome="new") == 1
    assert _value(samples, "stillhere_hellos_total", outcome="resumed") == 0
    assert _value(samples, "stillhere_hello_seconds_count", outcome="new") == 1
    assert _value(samples, "stillhere_hello_seconds_count", outcome="resumed") == 0


async def test_the_loop_lag_is_measured_while_the_server_runs(harness: Harness) -> None:
    """The probe feeds the histogram from start-up, with no traffic at all."""
    await harness.start()
    samples: Samples = {}
    async with asyncio.timeout(10):
        while not _value(samples, "stillhere_loop_lag_seconds_count"):
            await asyncio.sleep(0.05)
            samples, _ = await _scrape(harness)
    count = _value(samples, "stillhere_loop_lag_seconds_count")
    assert _value(samples, "stillhere_loop_lag_seconds_bucket", le="+Inf") == count > 0
    assert _value(samples, "stillhere_loop_lag_seconds_sum") >= 0


async def test_garbage_collections_are_timed_by_generation(harness: Harness) -> None:
    await harness.start()
    before, _ = await _scrape(harness)
    gc.collect(1)
    gc.collect(2)
    after, _ = await _scrape(harness)
    for generation in ("1", "2"):
        count = "stillhere_gc_pause_seconds_count"
        grew = _value(after, count, generation=generation) - _value(
            before, count, generation=generation
        )
        assert grew >= 1, generation
    assert _value(after, "stillhere_gc_pause_seconds_sum", generation="2") > 0


async def test_archives_by_reason(harness: Harness) -> None:
    await harness.start()
    leaving = await harness.phone()
    await leaving.say("hello")
    await leaving.reply()
    await leaving.send({"type": "leave"})
    await leaving.expect("bye")
    idle = await harness.phone()
    await idle.say("hello")
    await idle.reply()
    harness.clock.advance(31 * 60)
    await harness.sweep()
    samples, _ = await _scrape(harness)
    assert _value(samples, "stillhere_archives_total", reason="leave") == 1
    assert _value(samples, "stillhere_archives_total", reason="idle") == 1
    assert _value(samples, "stillhere_live_actors") == 0


async def test_turns_are_timed_and_retries_counted(harness: Harness, fake_llm: FakeOpenAI) -> None:
    await harness.start(llm_url=fake_llm.url)
    fake_llm.queue(Fail(503), Reply("Here I am."), Reply("Still here."))
    phone = await harness.phone()
    await phone.say("hello")
    await phone.reply()
    await phone.say("and again")
    await phone.reply()
    samples, _ = await _scrape(harness)
    assert _value(samples, "stillhere_turn_seconds_count") == 2
    assert _value(samples, "stillhere_turn_seconds_bucket", le="+Inf") == 2
    assert _value(samples, "stillhere_turn_seconds_sum") > 0
    assert _value(samples, "stillhere_model_retries_total") == 1


async def test_each_server_counts_for_itself(harness: Harness, tmp_path: Path) -> None:
    """Two servers in one process: each has its own registry, not the global one."""
    await harness.start()
    other = Harness(harness.dsn, harness.clock, tmp_path / "other")
    try:
        await other.start()
        await harness.phone()
        mine, _ = await _scrape(harness)
        theirs, _ = await _scrape(other)
        assert _value(mine, "stillhere_hellos_total", outcome="new") == 1
        assert _value(theirs, "stillhere_hellos_total", outcome="new") == 0
    finally:
        await other.stop()
        await other.http.close()
