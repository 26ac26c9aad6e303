"""Our actors' inbox (a `queue.SimpleQueue` in place of pykka's `queue.Queue`) keeps what
pykka promises: messages handled one at a time in the order told, and a message still
waiting when the actor stops answered with `ActorDeadError`, never left hanging."""

from __future__ import annotations

import threading
from typing import Any

import pykka
import pytest

from actors.inbox import ThreadingActor


class _Recorder(ThreadingActor):
    def __init__(self, release: threading.Event | None = None) -> None:
        super().__init__()
        self.seen: list[Any] = []
        self._release = release

    def on_receive(self, message: Any) -> Any:
        if message == "block" and self._release is not None:
            self._release.wait(10)
        self.seen.append(message)
        return list(self.seen)


def test_messages_are_handled_in_the_order_told_from_several_threads() -> None:
    ref = _Recorder.start()
    try:
        senders = [
            threading.Thread(target=lambda n=n: [ref.tell((n, i)) for i in range(500)])
            for n in range(4)
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        seen = ref.ask("last", timeout=10)
    finally:
        ref.stop()
    assert seen[-1] == "last" and len(seen) == 2001
    for n in range(4):  # each sender's messages in its order, none lost or repeated
        assert [i for m, i in seen[:-1] if m == n] == list(range(500))


def test_a_message_left_when_the_actor_stops_fails_instead_of_hanging() -> None:
    release = threading.Event()
    ref = _Recorder.start(release)
    ref.tell("block")  # the actor waits inside this one
    stopping = ref.stop(block=False)
    late = ref.ask("after the stop", block=False)  # queued behind the stop
    release.set()
    stopping.get(timeout=10)
    with pytest.raises(pykka.ActorDeadError):
        late.get(timeout=10)
