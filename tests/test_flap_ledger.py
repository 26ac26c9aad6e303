"""The flap bench's ledger counts what a phone received, before the client's own checks."""

from __future__ import annotations

from typing import Any

from bench.flap_ledger import Ledger


def _welcome(ledger: Ledger, conversation: str) -> None:
    frame = {"type": "welcome", "conversation": conversation, "resumed": False, "seq": 0}
    ledger.welcome(0, frame, 0.0, expected=None, hello_ms=None)


def _turn(ledger: Ledger, conversation: str, say: str, ack_seq: int) -> None:
    """A say, its ack and its reply, all received."""
    ledger.said(0, say, "hello", 0.0, up=True, conv=conversation)
    reply: dict[str, Any] = {"reply": f"r-{say}"}
    for frame in (
        {"type": "ack", "id": say, "seq": ack_seq},
        {"type": "reply.start", "seq": ack_seq + 1, "in_reply_to": [say], **reply},
        {"type": "reply.delta", "seq": ack_seq + 2, "text": "Hi.", **reply},
        {"type": "reply.end", "seq": ack_seq + 3, "text": "Hi.", **reply},
    ):
        ledger.frame(0, conversation, frame, 0.1)


def test_a_repeated_ack_is_outside_the_stream_whatever_its_seq() -> None:
    """Resent in the next conversation, a say's repeated ack carries the seq it had in the
    first one, here the same as the next conversation's first event: neither a second ack
    of the say nor a second event 1."""
    ledger = Ledger()
    _welcome(ledger, "first")
    _turn(ledger, "first", "kept", 1)
    _welcome(ledger, "next")
    ledger.frame(0, "next", {"type": "ack", "id": "kept", "seq": 1, "repeat": True}, 0.2)
    _turn(ledger, "next", "new", 1)

    verdict = ledger.verdict(None, None)
    assert verdict["says"] == 2
    for count in ("lost_says", "duplicated_says", "duplicated_events", "lost_events"):
        assert verdict[count] == 0, count


def test_an_unmarked_second_ack_with_another_seq_is_a_duplicated_say() -> None:
    ledger = Ledger()
    _welcome(ledger, "first")
    _turn(ledger, "first", "once", 1)
    ledger.frame(0, "first", {"type": "ack", "id": "once", "seq": 5}, 0.2)

    verdict = ledger.verdict({"once": 1}, {"once": 2})
    assert verdict["duplicated_says"] == 1
    assert verdict["answered_in_db_twice"] == 1


def test_a_say_acked_and_not_stored_is_counted_apart_from_one_never_acked() -> None:
    """Not stored: a say still unacked when the bench stopped (its phone resending it), or
    one acked that the database does not have, which is data lost, an ack's repeat too."""
    ledger = Ledger()
    _welcome(ledger, "first")
    _turn(ledger, "first", "kept", 1)
    _turn(ledger, "first", "lost", 5)
    ledger.said(0, "unacked", "still resending", 0.2, up=True, conv="first")
    ledger.said(0, "repeated", "acked again", 0.3, up=True, conv="first")
    ledger.frame(0, "first", {"type": "ack", "id": "repeated", "seq": None, "repeat": True}, 0.4)

    verdict = ledger.verdict({"kept": 1}, {"kept": 1})
    assert (verdict["not_stored"], verdict["acked_not_stored"]) == (3, 2)
    assert verdict["lost_says"] == 1
    assert sorted(verdict["examples"]["acked_not_stored"]) == [
        "phone 0 say lost: acked, no row",
        "phone 0 say repeated: acked, no row",
    ]
    assert ledger.verdict(None, None)["acked_not_stored"] is None  # no database to ask
