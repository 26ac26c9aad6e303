"""The admin API's actor list, one page of it: filtered, sorted and cut on the server.

A server with 5,000 live actors would otherwise send all 5,000 rows to whoever looks (the
live view asks every two seconds): `?q=&state=&sort=&limit=&offset=` choose which rows
travel. The rows are built for every actor either way (a sort by idle time needs them all),
from snapshots the actors have already published, so a page costs the loop a sort, not
5,000 messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from multidict import MultiDictProxy

from transport.query import InvalidField, query_integer

STATES = ("idle", "replying", "ending", "inactive", "stopped", "unresponsive")
# The sortable columns; `-` in front sorts the other way. Rows where the column is null (an
# actor that did not answer) come first whichever way: they are the ones to look at.
SORTS = ("idle", "age", "links", "pending", "window", "state", "person", "conversation")
_COLUMN = {"idle": "idle_s", "age": "age_s"}
MAX_LIMIT = 1000
MAX_OFFSET = 1_000_000_000
MAX_QUERY_CHARS = 200


class Row(Protocol):
    """A live actor's row: a column per sort key (None: the actor did not answer)."""

    person: str
    state: str

    @property
    def conversation(self) -> str: ...

    def wire(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class ActorQuery:
    text: str  # lower case; empty matches every row
    states: tuple[str, ...]  # empty: every state
    sort: str
    descending: bool
    limit: int | None  # None: every matching row (the API as it was before paging)
    offset: int

    def page(self, rows: Sequence[Row]) -> dict[str, Any]:
        """The answer's paging fields and rows: `count` matched, `actors` this page."""
        matched = [row for row in rows if self._matches(row)]
        value = self._value()
        if self.descending:  # largest first, nulls still first (see SORTS)
            matched.sort(key=lambda row: (value(row) is None, value(row) or 0), reverse=True)
        else:
            matched.sort(key=lambda row: (value(row) is not None, value(row) or 0))
        end = None if self.limit is None else self.offset + self.limit
        return {
            "total": len(rows),
            "count": len(matched),
            "offset": self.offset,
            "limit": self.limit,
            "states": _tally(rows),
            "actors": [row.wire() for row in matched[self.offset : end]],
        }

    def _matches(self, row: Row) -> bool:
        if self.states and row.state not in self.states:
            return False
        return not self.text or self.text in row.person or self.text in row.conversation

    def _value(self) -> Callable[[Row], Any]:
        column = _COLUMN.get(self.sort, self.sort)
        return lambda row: getattr(row, column)


def _tally(rows: Sequence[Row]) -> dict[str, int]:
    """How many actors are in each state, over all of them (the filter aside)."""
    counts = dict.fromkeys(STATES, 0)
    for row in rows:
        counts[row.state] += 1
    return counts


def actor_query(query: MultiDictProxy[str]) -> ActorQuery:
    """The list's filter, order and page from the query string; InvalidField if off."""
    text = query.get("q", "").strip().lower()
    if len(text) > MAX_QUERY_CHARS:
        raise InvalidField(f"q must be at most {MAX_QUERY_CHARS} characters")
    states = tuple(
        dict.fromkeys(w.strip() for v in query.getall("state", []) for w in v.split(",") if w)
    )
    if any(state not in STATES for state in states):
        raise InvalidField(f"state must be among {', '.join(STATES)}")
    sort = query.get("sort", "idle")
    if sort.removeprefix("-") not in SORTS:
        raise InvalidField(f"sort must be one of {', '.join(SORTS)}, with - to reverse")
    limit = query_integer(query, "limit", 1, MAX_LIMIT)
    offset = query_integer(query, "offset", 0, MAX_OFFSET) or 0
    return ActorQuery(text, states, sort.removeprefix("-"), sort.startswith("-"), limit, offset)
