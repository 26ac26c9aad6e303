"""The context sources' last answers per person, reused while nothing they read has changed.

A turn's context is read from PostgreSQL (past conversations, memories, rules: five queries),
and most turns follow one another with none of it changed. Every change to those rows bumps
the person's context generation in the database (storage/migrations/006), whoever made it:
this server, `stillhere memory consolidate` in another process, a gesture, plain SQL. A turn
reads that one number first, and the answers kept from an earlier turn are used only if they
were read at the same generation, so the cache is never stale in what it holds.

What does move without a write is the clock: "mentioned in the last 3 days" slides by
itself. Answers are therefore also kept for at most `ttl_s` seconds.

Loop-side only, like the turn pipeline that uses it; bounded by `max_persons` (least
recently used first out), and a person is dropped when their conversation leaves memory.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(slots=True)
class _Entry:
    generation: int
    read_at: datetime
    answers: dict[str, list[Any]] = field(default_factory=dict)


class ContextCache:
    def __init__(self, ttl_s: float = 60.0, max_persons: int = 4096) -> None:
        self.ttl_s = ttl_s
        self.max_persons = max_persons
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, person: str, generation: int, now: datetime) -> dict[str, list[Any]]:
        """The answers still good at `generation` and `now` (empty if none are)."""
        entry = self._entries.get(person)
        if entry is None or not self._fresh(entry, generation, now):
            return {}
        self._entries.move_to_end(person)
        return dict(entry.answers)

    def put(
        self, person: str, generation: int, now: datetime, answers: dict[str, list[Any]]
    ) -> None:
        """Keep `answers`, read after `generation` was seen, beside those of the same
        generation and age; older ones are replaced."""
        if self.ttl_s <= 0 or not answers:
            return
        entry = self._entries.get(person)
        if entry is None or not self._fresh(entry, generation, now):
            entry = self._entries[person] = _Entry(generation, now)
        entry.answers.update(answers)
        self._entries.move_to_end(person)
        while len(self._entries) > self.max_persons:
            self._entries.popitem(last=False)

    def drop(self, person: str) -> None:
        self._entries.pop(person, None)

    def _fresh(self, entry: _Entry, generation: int, now: datetime) -> bool:
        age = (now - entry.read_at).total_seconds()
        return entry.generation == generation and 0 <= age < self.ttl_s
