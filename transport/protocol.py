"""Protocol v1 frames from clients: decoding, validation, limits, error codes.

Every kind of bad input maps to one stable `code` (see docs/protocol.md); the link stays
usable and nothing stored changes.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from storage.text import text_fault
from transport.config import Limits

CLIENT_TYPES = frozenset({"hello", "say", "interrupt", "leave", "ack", "ping"})

# WebSocket close codes of our own (RFC 6455 leaves 4000-4999 to applications), one per
# reason a server ends a link; docs/protocol.md lists them.
CLOSE_REVOKED = 4403  # the person was revoked (error `revoked` first)
CLOSE_HELLO_TIMEOUT = 4408  # no successful hello in time (error `hello_timeout` first)
CLOSE_TOO_MANY_LINKS = 4429  # over a per-person link limit (error `too_many_links` first)
CLOSE_SLOW_READER = 4503  # the phone stopped reading: its link buffer overflowed


class ProtocolError(Exception):
    def __init__(self, code: str, message: str, id_: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = id_

    def frame(self) -> dict[str, Any]:
        return error_frame(self.code, self.message, self.id)


def error_frame(code: str, message: str, id_: str | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if id_ is not None:
        frame["id"] = id_
    return frame


def decode(raw: str | bytes, limits: Limits) -> dict[str, Any]:
    """A validated client frame, or ProtocolError."""
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > limits.max_frame_bytes:
        raise ProtocolError(
            "frame_too_large", f"frames are limited to {limits.max_frame_bytes} bytes"
        )
    try:
        frame = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ProtocolError("bad_json", "a frame must be one JSON object") from None
    return validate(frame, limits)


def validate(frame: object, limits: Limits) -> dict[str, Any]:
    if not isinstance(frame, dict):
        raise ProtocolError("bad_frame", "a frame must be a JSON object")
    kind = frame.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("bad_frame", "a frame needs a string `type`")
    if kind not in CLIENT_TYPES:
        raise ProtocolError("unknown_type", f"unknown frame type {kind[:40]!r}")
    if kind == "hello":
        _check_hello(frame)
    elif kind == "say":
        _check_say(frame, limits)
    elif kind == "ack" and not _is_seq(frame.get("seq")):
        raise ProtocolError("invalid_field", "`ack` needs an integer `seq`")
    return frame


def _is_seq(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_hello(frame: dict[str, Any]) -> None:
    version = frame.get("v")
    if type(version) is not int or version != 1:
        raise ProtocolError("unsupported_version", "this server speaks protocol v 1")
    check_conversation(frame)
    last_seq = frame.get("last_seq")
    if last_seq is not None and not _is_seq(last_seq):
        raise ProtocolError("invalid_field", "`last_seq` must be a non-negative integer")


def check_conversation(frame: dict[str, Any]) -> None:
    """A hello's, or a POSTed say's: the conversation the client is in, if it names one."""
    conversation = frame.get("conversation")
    if conversation is not None and not isinstance(conversation, str):
        raise ProtocolError("invalid_field", "`conversation` must be a string")


def _check_say(frame: dict[str, Any], limits: Limits) -> None:
    id_ = frame.get("id")
    fault = text_fault(id_, "a say's `id`", blank_ok=True)
    if fault is not None:
        raise ProtocolError("invalid_id", fault)
    if len(id_) > limits.max_id_chars:
        raise ProtocolError(
            "invalid_id", f"a say's `id` is limited to {limits.max_id_chars} characters"
        )
    fault = text_fault(frame.get("text"), "a say's `text`")
    if fault is not None:
        raise ProtocolError("invalid_text", fault, id_)
    text = frame["text"]
    if len(text) > limits.max_text_chars:
        raise ProtocolError(
            "text_too_long", f"a say's text is limited to {limits.max_text_chars} characters", id_
        )


class TokenBucket:
    """`rate` sustained, `burst` at once."""

    __slots__ = ("_at", "_burst", "_rate", "_tokens")  # one per held link: no dict

    def __init__(self, rate: float, burst: float) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._tokens = self._burst
        self._at = time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class RateLimiter(TokenBucket):
    """A token bucket per link: `frames_per_s` sustained, `frame_burst` at once."""

    __slots__ = ()

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits.frames_per_s, limits.frame_burst)


class KeyedRates:
    """One token bucket per key (a person, an address), `rate` sustained, `burst` at once.

    Bounded: the least recently seen keys are forgotten past `keep` (one forgotten starts
    again with a whole burst)."""

    def __init__(self, rate: float, burst: float, keep: int = 10_000) -> None:
        self._rate = rate
        self._burst = burst
        self._keep = keep
        self._buckets: dict[str, TokenBucket] = {}

    def allow(self, key: str) -> bool:
        bucket = self._buckets.pop(key, None) or TokenBucket(self._rate, self._burst)
        self._buckets[key] = bucket  # most recent last
        if len(self._buckets) > self._keep:
            del self._buckets[next(iter(self._buckets))]
        return bucket.allow()


def rate_limited() -> ProtocolError:
    return ProtocolError("rate_limited", "too many frames; slow down")
