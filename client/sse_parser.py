"""An incremental server-sent-events parser, fed with whatever bytes arrive.

Why not `StreamReader.readline()`: aiohttp refuses lines over its buffer limit (128 KiB),
and a `welcome` with a long history is one `data:` line that can be larger than that.
Parsing our own buffer has no such limit and handles CRLF split across two chunks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: `event:` name, last `id:` seen, joined `data:` lines."""

    event: str
    id: str | None
    data: str


class SseParser:
    """Turns chunks of an event stream into events, as an EventSource does.

    Lines end with CRLF, LF or CR; a blank line dispatches the event; lines starting with
    `:` are comments (the server's keep-alive ping); the last `id:` persists across events.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []
        self.last_id: str | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        self._buffer += chunk
        events: list[SseEvent] = []
        while True:
            line = self._next_line()
            if line is None:
                return events
            event = self._on_line(line)
            if event is not None:
                events.append(event)

    def _next_line(self) -> str | None:
        buffer = self._buffer
        cr, lf = buffer.find(b"\r"), buffer.find(b"\n")
        ends = [i for i in (cr, lf) if i >= 0]
        if not ends:
            return None
        end = min(ends)
        if end == cr:
            if end + 1 == len(buffer):
                return None  # a CR at the end of the chunk may be half of a CRLF
            skip = 2 if buffer[end + 1 : end + 2] == b"\n" else 1
        else:
            skip = 1
        line, self._buffer = buffer[:end], buffer[end + skip :]
        return line.decode("utf-8", errors="replace")

    def _on_line(self, line: str) -> SseEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_id = value
        return None

    def _dispatch(self) -> SseEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SseEvent(event or "message", self.last_id, "\n".join(data))
