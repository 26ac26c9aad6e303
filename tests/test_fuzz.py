"""Property-based fuzzing of the real server (bench/fuzz_properties.py, CI-sized).

Hypothesis draws link scripts, POST bodies and event-stream requests (bench/fuzz_frames.py);
the probe
(bench/fuzz_probe.py) sends them to a real app on real PostgreSQL and checks every answer,
every close and, for every refused frame, every table's rows. The `stillhere-ci` profile
keeps it to a few dozen examples per property, the same ones on every run; `stillhere
bench fuzz --examples N` runs more. The last tests show the probe's checks do fail on a
server that breaks them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings

from bench import fuzz
from bench.fuzz_frames import Wire
from bench.fuzz_probe import FuzzFailure, Probe
from bench.fuzz_properties import (
    CI,
    body_property,
    frame_property,
    run_property,
    stream_property,
)
from tests.conftest import Harness
from transport import websocket
from transport.config import Limits
from transport.protocol import ProtocolError

# As `stillhere-bench fuzz` runs its server (bench/fuzz.py, SERVER_OPTIONS).
LIMITS = Limits(max_frame_bytes=fuzz.MAX_FRAME_BYTES, frames_per_s=100_000, frame_burst=100_000)


async def probe_of(harness: Harness) -> Probe:
    await harness.start(limits=LIMITS)
    url, loop = harness.url("/").rstrip("/"), asyncio.get_running_loop()
    probe = Probe(url, harness.dsn, loop, LIMITS.max_frame_bytes)
    await probe.open()
    return probe


async def ci_run(harness: Harness, prop: Callable[[Probe, settings], Callable[[], None]]) -> Probe:
    """Run one of bench.fuzz's properties with the CI profile; the probe, with its counts."""
    probe = await probe_of(harness)
    try:
        await asyncio.to_thread(run_property, prop(probe, settings.get_profile(CI)))
    finally:
        await probe.close()
    return probe


@pytest.mark.timeout(180)
async def test_every_drawn_frame_is_answered_and_refusals_store_nothing(harness: Harness) -> None:
    counts = (await ci_run(harness, frame_property)).counts
    assert counts.examples >= settings.get_profile(CI).max_examples
    assert counts.frames > counts.examples, "scripts hold several frames"
    for kind in ("welcome", "ack", "reply.end", "error"):  # accepted and refused frames both
        assert counts.answers.get(kind, 0) > 0, (kind, counts.answers)
    assert len(counts.errors) >= 5, f"refused in several ways: {counts.errors}"


@pytest.mark.timeout(180)
async def test_every_drawn_post_body_gets_json_and_refusals_store_nothing(
    harness: Harness,
) -> None:
    probe = await ci_run(harness, body_property)
    statuses = probe.counts.statuses
    assert probe.counts.requests >= settings.get_profile(CI).max_examples
    assert statuses.get(400, 0) > 0 and sum(statuses.values()) == probe.counts.requests


@pytest.mark.timeout(180)
async def test_every_drawn_event_stream_opens_or_is_refused_with_a_code(harness: Harness) -> None:
    statuses = (await ci_run(harness, stream_property)).counts.statuses
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses


def leaky_says(monkeypatch: pytest.MonkeyPatch, harness: Harness) -> None:
    """A server that refuses a say of "leak", but writes to the database first."""
    dispatch = websocket._dispatch

    async def leaky(session: Any, link: Any, frame: dict[str, Any]) -> bool:
        if frame["type"] == "say" and frame["text"] == "leak":
            await harness.server.runtime.store._pool.execute(
                "UPDATE conversations SET summary = 'leaked'"
            )
            raise ProtocolError("invalid_text", "refused, but too late", frame["id"])
        return await dispatch(session, link, frame)

    monkeypatch.setattr(websocket, "_dispatch", leaky)


async def test_the_probe_finds_a_refusal_that_changed_stored_rows(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaky_says(monkeypatch, harness)
    probe = await probe_of(harness)
    try:
        script = [Wire({"type": "say", "id": "s1", "text": "leak"})]
        with pytest.raises(FuzzFailure, match=r"changed tables \[.*'conversations'"):
            await asyncio.to_thread(probe.script, script, 0, 0)
    finally:
        await probe.close()


async def test_the_probe_finds_a_link_closed_for_a_bad_frame(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_frame = websocket._on_frame

    async def closing(*args: Any) -> bool:
        await on_frame(*args)
        return False  # every frame ends the link

    probe = await probe_of(harness)
    monkeypatch.setattr(websocket, "_on_frame", closing)
    try:
        with pytest.raises(FuzzFailure, match="closed, not after"):
            await asyncio.to_thread(probe.script, [Wire("not json", raw=True)], None, 0)
    finally:
        await probe.close()
