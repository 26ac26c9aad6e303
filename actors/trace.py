"""The trace of a turn: what the model was handed and what its tools did, kept to look at.

The turn's log line says how much was handed over; the trace says which: the recent
conversations and the memories of each layer by id, the rules, the sources that failed or
were late and how long each read took, the size of the whole, the notes beside it (which
message a say answers, the loose ends and open threads), and each tool called with what it
returned, in a line. A live conversation keeps its last `TRACED_TURNS` on its
stream (loop side, written by the turn, read by the admin API), so "it forgot" can be told
apart from "it was never handed": both go when the conversation leaves memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson

from actors.context import Context
from providers.chat import ToolCall

TRACED_TURNS = 20
TOOL_LINE_CHARS = 300
_FOUND_TEXT_CHARS = 40


class Traces:
    """A conversation's last `TRACED_TURNS` traces, oldest first, each kept as the JSON
    the admin API serves: one string of a few hundred bytes, where the trace itself is
    dozens of objects (its ids, times and tuples), some 1 KB a turn, which a quiet
    conversation would hold for each of its last turns for as long as its phone is
    connected. A string, not orjson's bytes, which keep the 4 KB its encoder started
    with. A list trimmed as it grows rather than a bounded deque: an empty deque holds a
    0.5 KB block, which every conversation, quiet or not, would pay."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: list[str] = []

    def append(self, trace: TurnTrace) -> None:
        self._kept.append(orjson.dumps(trace.wire()).decode())
        if len(self._kept) > TRACED_TURNS:
            del self._kept[0]

    def wire(self) -> list[dict[str, Any]]:
        """The traces as the admin API shows them, oldest first."""
        return [orjson.loads(kept) for kept in self._kept]


@dataclass(frozen=True, slots=True)
class TurnTrace:
    reply: UUID
    at: datetime
    answering: tuple[str, ...]  # the client ids of the says it answered
    context: Context
    notes: tuple[str, ...]  # the notes handed beside the context: reply context, loose ends
    loose_ends: tuple[UUID, ...]  # the points and questions among those notes
    threads: tuple[UUID, ...]  # the open threads among them
    tools: tuple[str, ...]  # one line per tool call, in order
    error: str | None

    def wire(self) -> dict[str, Any]:
        c = self.context
        return {
            "reply": str(self.reply),
            "at": self.at.isoformat(),
            "answering": list(self.answering),
            "conversations": [str(i) for i in c.handed.get("conversations", ())],
            "exchanges": c.exchanges,
            "memories": {
                layer: [str(i) for i in c.handed.get(layer, ())]
                for layer in ("working", "recent", "sample")
            },
            "rules": c.rules,
            "failed": list(c.failed),
            "problems": list(c.problems),
            "timings_ms": c.timings,
            "context_chars": len(c.text),  # only its size: the text is not kept
            "notes": list(self.notes),
            "loose_ends": [str(i) for i in self.loose_ends],
            "threads": [str(i) for i in self.threads],
            "tools": list(self.tools),
            "error": self.error,
        }


def tool_line(call: ToolCall, result: dict[str, Any]) -> str:
    """`search_memories {"query":"Owen"} -> 2 found: 0b7a… Owen works in a lab; …`."""
    arguments = orjson.dumps(call.arguments).decode()
    if "error" in result:
        returned = f"error: {result['error']}"
    elif isinstance(result.get("results"), list):
        found = [f"{r['id']} {r['text'][:_FOUND_TEXT_CHARS]}" for r in result["results"]]
        returned = f"{len(found)} found" + (": " + "; ".join(found) if found else "")
    else:
        returned = orjson.dumps(result).decode()
    line = f"{call.name} {arguments} -> {returned}"
    return line if len(line) <= TOOL_LINE_CHARS else line[: TOOL_LINE_CHARS - 1] + "…"
