"""The replay buffer of a conversation's stream: the last events, kept small.

It holds the last `limit` events, every seq from its oldest to the newest, deltas
included, as protocol v1 promises ("every event with a greater seq is sent again"). What it
does not do is keep a dict per delta forever: once a reply has ended, its deltas are folded
into `DeltaRun`s, slices of the text its `reply.end` already holds, and rebuilt frame by
frame only when a link replays them. A conversation's memory then grows by a few bytes per
streamed word instead of a few hundred; the deltas of the reply in progress stay as they
were sent.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from typing import Any

Frame = dict[str, Any]

DELTA = "reply.delta"
DELTA_FIELDS = frozenset({"type", "seq", "reply", "text"})


class DeltaRun:
    """Deltas of one ended reply with consecutive seqs, held as slices of one text.

    Delta `i` is `text[bounds[i]:bounds[i + 1]]` with seq `first + i`; the first `skip` of
    them were evicted. `text` is usually the very string object the `reply.end` frame holds,
    so a delta costs 4 bytes here instead of a dict, an int and a string.
    """

    __slots__ = ("bounds", "first", "reply", "skip", "text")

    def __init__(self, first: int, reply: object, text: str, start: int) -> None:
        self.first = first
        self.skip = 0
        self.reply = reply
        self.text = text
        self.bounds = array("I", [start])

    def __len__(self) -> int:
        return len(self.bounds) - 1 - self.skip

    @property
    def oldest(self) -> int:
        return self.first + self.skip

    def frames(self, after: int) -> Iterator[Frame]:
        """The deltas with a seq above `after`, rebuilt as they were sent."""
        bounds, text = self.bounds, self.text
        for i in range(max(self.skip, after + 1 - self.first), len(bounds) - 1):
            yield {
                "type": DELTA,
                "seq": self.first + i,
                "reply": self.reply,
                "text": text[bounds[i] : bounds[i + 1]],
            }


def _is_delta_of(entry: Frame | DeltaRun, reply: object) -> bool:
    """A delta frame of this reply, exactly as `DeltaRun.frames` would rebuild it."""
    return (
        isinstance(entry, dict)
        and entry.get("type") == DELTA
        and entry.get("reply") == reply
        and entry.keys() == DELTA_FIELDS
        and isinstance(entry["text"], str)
    )


def _is_start_of(entry: Frame | DeltaRun, reply: object) -> bool:
    return (
        isinstance(entry, dict)
        and entry.get("type") == "reply.start"
        and entry.get("reply") == reply
    )


class ReplayBuffer:
    """The last `limit` events of a stream, every seq from `oldest()` up, none missing.

    Entries are frames, or `DeltaRun`s standing for several deltas of an ended reply; they
    are in seq order and their seqs follow each other without a hole, so "is seq n still
    here?" is `n >= oldest()`. `len()` counts events (each delta of a run is one), which is
    what the frame bound and the admin API's `buffered` mean.
    """

    __slots__ = ("_entries", "_held", "_limit")  # one for every conversation held

    def __init__(self, limit: int) -> None:
        # No deque while empty (most of a quiet conversation's life: its phone acked it
        # all): an empty deque holds a 0.5 KB block.
        self._entries: deque[Frame | DeltaRun] | tuple[()] = ()
        self._held = 0
        self._limit = limit

    def __len__(self) -> int:
        return self._held

    def oldest(self, default: int) -> int:
        """The oldest seq held; `default` (the next seq to come) when empty."""
        if not self._entries:
            return default
        first = self._entries[0]
        return first.oldest if isinstance(first, DeltaRun) else int(first["seq"])

    def _deque(self) -> deque[Frame | DeltaRun]:
        """The entries, as a deque to change (made if there was none)."""
        if not isinstance(self._entries, deque):
            self._entries = deque()
        return self._entries

    def append(self, frame: Frame) -> None:
        if frame["type"] == "reply.end":
            self._fold(frame)
        self._deque().append(frame)
        self._held += 1
        while self._held > self._limit:
            self._evict_oldest()

    def trim(self, through: int) -> None:
        """Drop every event with a seq up to `through`: a client has them all (its `ack`,
        or the `last_seq` of its hello). Dropped turn-level events stay in the events
        table; a later replay from further back gets them, each reply whole in its end."""
        entries = self._entries
        while entries:
            first = entries[0]
            if isinstance(first, DeltaRun):
                newest = first.oldest + len(first) - 1
                if newest > through:  # only part of the run goes
                    gone = max(0, through + 1 - first.oldest)
                    first.skip += gone
                    self._held -= gone
                    return
                self._held -= len(first)
            elif first["seq"] > through:
                return
            else:
                self._held -= 1
            self._deque().popleft()
        self._entries = ()

    def after(self, seq: int) -> list[Frame]:
        """Every held event with a greater seq, in order, deltas rebuilt."""
        out: list[Frame] = []
        for entry in self._entries:
            if isinstance(entry, DeltaRun):
                out.extend(entry.frames(seq))
            elif entry["seq"] > seq:
                out.append(entry)
        return out

    def _evict_oldest(self) -> None:
        entries = self._deque()
        first = entries[0]
        if isinstance(first, DeltaRun):
            first.skip += 1
            if len(first) == 0:
                entries.popleft()
        else:
            entries.popleft()
        self._held -= 1

    def _fold(self, end: Frame) -> None:
        """Fold the ending reply's deltas into runs over its text, just before its end.

        Walks back to the reply's `reply.start` (or the oldest entry, if the start was
        evicted): only that tail changes, in place, with the same seqs in the same order.
        If the deltas held do not join to the end's text (a start evicted mid-reply), the
        runs slice their own joined text instead; replay is exact either way.
        """
        reply = end.get("reply")
        entries = self._deque()
        tail: list[Frame | DeltaRun] = []
        while entries and not _is_start_of(entries[-1], reply):
            tail.append(entries.pop())
        tail.reverse()
        is_delta = [_is_delta_of(e, reply) for e in tail]
        if not any(is_delta):
            entries.extend(tail)
            return
        deltas = [e for e, d in zip(tail, is_delta, strict=True) if d and isinstance(e, dict)]
        joined = "".join(str(d["text"]) for d in deltas)
        text = end["text"] if end.get("text") == joined else joined
        offset, run = 0, None
        for entry, delta in zip(tail, is_delta, strict=True):
            if not delta:
                run = None
                entries.append(entry)
                continue
            assert isinstance(entry, dict)
            if run is None:
                run = DeltaRun(entry["seq"], reply, text, offset)
                entries.append(run)
            offset += len(entry["text"])
            run.bounds.append(offset)
