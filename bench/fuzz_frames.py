"""Hypothesis strategies for `bench.fuzz`: protocol frames and HTTP bodies nobody planned for.

A drawn frame is a plan, not bytes: values that only exist at run time (this link's own
conversation id, its last seq, another person's conversation) are `Ref`s the driver fills in
before it sends. Then `Wire` says how the frame goes out: JSON text (ASCII-escaped or not),
the same as a binary message, or raw text that is no JSON at all. Frames mix valid fields
with wrong ones (types, sizes, NaN, numbers past 64 bits, lone surrogates, right-to-left and
zero-width characters, 4-byte emoji), drop required fields and add unknown ones, and come in
any order (a say before the hello, an ack of a seq never sent, a `last_seq` from the future,
a second hello).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

MISSING = object()  # a field left out of the frame


@dataclass(frozen=True)
class Ref:
    """A value known only while the example runs: `own` (this link's conversation id),
    `victim` (another person's conversation id), `seq` (this link's last seq, + `plus`)."""

    name: str
    plus: int = 0


@dataclass(frozen=True)
class Wire:
    frame: Any  # a JSON-able plan (with Refs), or the raw text itself when `raw`
    ascii: bool = True  # JSON with \\u escapes (lone surrogates go out escaped)
    binary: bool = False  # a binary WebSocket message (UTF-8, lone surrogates passed)
    raw: bool = False  # `frame` is text to send as is


WILD = ("\ud800", "x\udfffy", math.nan, math.inf, -math.inf)  # no JSON parser should take
EDGE_STRINGS = (
    "",
    " ",
    "\t\n ",
    "\x00",
    "a\x00b",
    "\u202eevil\u202c",  # right-to-left override
    "\u200b",  # zero-width space only
    "a\u200db\u2060c",  # zero-width joiner, word joiner
    "\ufeff",  # byte order mark
    "\U0001f600\U0001f469\u200d\U0001f4bb",  # 4-byte emoji, a ZWJ sequence
    "\u0301\u0301\u0301",  # combining marks with no base
    "\U0010ffff",
    "NaN",
    "null",
    "x" * 129,
    "é" * 4001,
)
HUGE_INTS = (2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, -1, -(2**63), -(2**64))

edge_text = st.one_of(st.sampled_from(EDGE_STRINGS), st.text(max_size=40))
numbers = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from((*HUGE_INTS, 1.5, -0.0, 1e308)),
)
wild = st.sampled_from(WILD)  # lone surrogates (escaped, or raw bytes), NaN, infinities
scalars = st.one_of(st.none(), st.booleans(), numbers, edge_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(edge_text, inner, max_size=4)
    ),
    max_leaves=12,
)


def field_or(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: a good one mostly, else left out, anything at all, or no JSON."""
    return st.one_of(*[good] * 6, st.just(MISSING), json_values, wild)


GOOD_DEVICE = "fuzz-device-good-0123456789"  # replaced by the example's own device
devices = st.one_of(st.just(GOOD_DEVICE), st.just(GOOD_DEVICE), st.just("short"), edge_text)
conversations = st.one_of(
    st.just(Ref("own")),
    st.just(Ref("victim")),
    st.uuids().map(str),
    edge_text,
)
seqs = st.one_of(
    st.builds(Ref, st.just("seq"), st.integers(min_value=-2, max_value=5)),
    st.sampled_from(HUGE_INTS),
    st.integers(min_value=0, max_value=50),
)
say_ids = st.one_of(st.uuids().map(lambda u: u.hex), st.sampled_from(("a", "dup-id")), edge_text)
say_texts = st.one_of(st.just("hello there"), edge_text, st.text(min_size=1, max_size=60))


def frame_of(kind: str, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A frame of `kind` whose fields each may be good, missing or wrong, with extra fields."""
    base = st.fixed_dictionaries(
        {"type": st.just(kind), **{k: field_or(v) for k, v in fields.items()}}
    )
    extra = st.dictionaries(
        st.sampled_from(("x", "seq", "id", "type2", "\u202e")), json_values, max_size=2
    )
    return st.builds(_merge, base, extra)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = {**extra, **base}
    return {k: v for k, v in merged.items() if v is not MISSING}


def _typed(kind: Any, rest: dict[str, Any]) -> dict[str, Any]:
    return {**rest, "type": kind}


# Good frames, mostly, so that scripts go past the checks: a say stored and answered, an
# ack of the seq just seen, an interrupt of the reply streaming.
good_frames = st.one_of(
    st.builds(
        lambda id_, text: {"type": "say", "id": id_, "text": text},
        st.uuids().map(lambda u: u.hex),
        st.one_of(st.just("hello there"), st.text(min_size=1, max_size=40).filter(str.strip)),
    ),
    st.builds(lambda plus: {"type": "ack", "seq": Ref("seq", plus)}, st.integers(-1, 3)),
    st.just({"type": "interrupt"}),
)
frames = st.one_of(
    good_frames,
    good_frames,
    frame_of("hello", v=st.just(1), device=devices, conversation=conversations, last_seq=seqs),
    frame_of("say", id=say_ids, text=say_texts),
    frame_of("interrupt"),
    frame_of("leave"),
    frame_of("ack", seq=seqs),
    frame_of("ping"),
    frame_of("hello", v=json_values, token=edge_text),
    st.builds(
        lambda t, rest: {**rest, "type": t},
        json_values,
        st.dictionaries(edge_text, json_values, max_size=3),
    ),
    json_values,
)
raw_texts = st.one_of(
    st.sampled_from(
        ('{"type": "ping"', "{type: say}", "", "NaN", '{"type":"ping"}{"type":"ping"}')
    ),
    st.text(max_size=30),
)
framed = st.builds(Wire, frames, ascii=st.booleans(), binary=st.booleans())
wires = st.one_of(framed, framed, framed, st.builds(Wire, raw_texts, raw=st.just(True)))
# A link's life: a few frames, with a good hello (or none) somewhere among them.
scripts = st.tuples(
    st.lists(wires, min_size=1, max_size=6),
    st.one_of(st.none(), *[st.integers(min_value=0, max_value=6)] * 3),  # the good hello's place
)


def resolve(plan: Any, refs: dict[str, Any]) -> Any:
    """The plan with its Refs filled in from `refs` (`own`, `victim`, `seq`)."""
    if isinstance(plan, Ref):
        value = refs.get(plan.name)
        return value + plan.plus if plan.name == "seq" and isinstance(value, int) else value
    if isinstance(plan, dict):
        return {resolve(k, refs): resolve(v, refs) for k, v in plan.items()}
    if isinstance(plan, list):
        return [resolve(v, refs) for v in plan]
    if plan == GOOD_DEVICE:
        return refs["device"]
    return plan


def encode(wire: Wire, refs: dict[str, Any]) -> str | bytes:
    """What goes on the link: text, or bytes for a binary message."""
    text = (
        wire.frame if wire.raw else json.dumps(resolve(wire.frame, refs), ensure_ascii=wire.ascii)
    )
    if wire.binary:
        return text.encode("utf-8", "surrogatepass")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate cannot be a text message: send its bytes
        return text.encode("utf-8", "surrogatepass")
    return text


# -- HTTP bodies ----------------------------------------------------------------------------

POST_PATHS = ("/v1/say", "/v1/interrupt", "/v1/leave", "/v1/rules")
http_bodies = st.one_of(
    st.builds(
        _merge,
        st.fixed_dictionaries(
            {
                "device": field_or(devices),
                "id": field_or(say_ids),
                "text": field_or(say_texts),
                "conversation": field_or(conversations),
            }
        ),
        st.dictionaries(edge_text, json_values, max_size=2),
    ),
    json_values,
)
http_requests = st.tuples(
    st.sampled_from(POST_PATHS),
    st.one_of(
        *[st.builds(Wire, http_bodies, ascii=st.booleans(), binary=st.just(True))] * 3,
        st.builds(Wire, raw_texts, raw=st.just(True), binary=st.just(True)),
    ),
    st.sampled_from(("application/json", "text/plain", "")),
)

# -- event streams (`GET /v1/events`) -------------------------------------------------------

seq_texts = st.one_of(
    st.integers(min_value=0, max_value=2**70).map(str),
    # Digits to Python's str.isdigit that are no ASCII: superscript two, fullwidth one.
    st.sampled_from(("", "-1", "1.5", "0x10", " 1", "9" * 40, "\u00b2", "1\u00b2", "\uff11")),
    st.text(alphabet="0123456789-+. abc", max_size=12),
)
stream_queries = st.builds(
    _merge,
    st.fixed_dictionaries(
        {
            "device": st.one_of(devices, st.just(MISSING)),
            "conversation": st.one_of(conversations, st.just(MISSING), st.just(MISSING)),
            "last_seq": st.one_of(seq_texts, st.just(MISSING)),
        }
    ),
    st.dictionaries(st.sampled_from(("token", "x", "type")), edge_text, max_size=1),
)
latin1 = seq_texts.filter(lambda text: all(ord(c) < 256 for c in text))  # a header's
stream_requests = st.tuples(stream_queries, st.one_of(st.none(), latin1))
