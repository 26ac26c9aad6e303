"""`bench.fuzz`'s Hypothesis properties: link scripts, POST bodies and event streams.

Each property is a Hypothesis test bound to a `Probe` (bench/fuzz_probe.py), to be called
in a thread other than the probe's loop. The `stillhere-ci` profile is the CI's: a few
dozen examples, the same on every run. Kept apart from `bench.fuzz`, the command, so that
`stillhere` runs without Hypothesis installed (it comes with the test extras).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisWarning

from bench.fuzz_frames import GOOD_DEVICE, Ref, Wire, http_requests, scripts, stream_requests
from bench.fuzz_probe import PERSONS, Probe

CI = "stillhere-ci"
# Explicit examples, run first whatever is drawn: each property sees an accepted request
# and a refused one on every run, however few examples it draws.
GOOD_SAY = Wire({"type": "say", "id": "example-say", "text": "hello there"})
GOOD_ACK = Wire({"type": "ack", "seq": Ref("seq")})
NO_TEXT = Wire({"device": GOOD_DEVICE, "id": "example-post"}, binary=True)  # 400 invalid_text
settings.register_profile(
    CI,
    max_examples=50,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every CI run; the bench draws fresh ones
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
persons = st.integers(min_value=0, max_value=PERSONS - 1)


def frame_property(probe: Probe, profile: settings) -> Callable[[], None]:
    """The link scripts' property, as a Hypothesis test bound to `probe` (call it in a
    thread other than the probe's loop)."""

    @profile
    @given(scripts, persons)
    @example(script=([GOOD_SAY, GOOD_ACK], 0), person=0)  # a say stored and answered, always
    def fuzz_frames(script: tuple[list[Any], int | None], person: int) -> None:
        wires, hello_at = script
        probe.script(wires, hello_at, person)

    return fuzz_frames


def body_property(probe: Probe, profile: settings) -> Callable[[], None]:
    """The POST bodies' property, bound to `probe` like `frame_property`."""

    @profile
    @given(http_requests, persons)
    @example(
        request=("/v1/say", Wire({"device": GOOD_DEVICE, "id": "x"}), "application/json"), person=0
    )
    def fuzz_bodies(request: tuple[str, Any, str], person: int) -> None:
        path, wire, content_type = request
        probe.request(path, wire, content_type, person)

    return fuzz_bodies


def stream_property(probe: Probe, profile: settings) -> Callable[[], None]:
    """Event streams' property: `GET /v1/events` with drawn queries and `Last-Event-ID`."""

    @profile
    @given(stream_requests, persons)
    @example(request=({"device": GOOD_DEVICE}, None), person=0)
    @example(request=({"device": GOOD_DEVICE}, "x"), person=0)
    def fuzz_streams(request: tuple[dict[str, Any], str | None], person: int) -> None:
        query, last_event_id = request
        probe.stream(query, last_event_id, person)

    return fuzz_streams


def each_failure(failed: Exception) -> list[Exception]:
    """The failures Hypothesis found: one, or a group of distinct ones."""
    if isinstance(failed, ExceptionGroup):
        return [one for inner in failed.exceptions for one in each_failure(inner)]
    return [failed]


def run_property(test: Callable[[], None]) -> None:
    """Run a property (in a thread of its own). Hypothesis, started outside the main thread,
    warns that it cannot manage that thread's PRNG (nothing here draws from it), and that a
    frame over the size limit makes a long repr (it is meant to)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "It looks like `register_random`", HypothesisWarning)
        warnings.filterwarnings("ignore", "Generating overly large repr", HypothesisWarning)
        test()


PROPERTIES = (frame_property, body_property, stream_property)
