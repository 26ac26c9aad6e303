"""Loose ends: what an exchange left unaddressed, and which of them the next replies get.

After each reply, off its critical path, a `loose-ends` analysis is shown the exchange (the
assistant message the says followed, the says, the reply) and the loose ends still open,
and answers what is left unaddressed on either side. What it lists from the exchange is
noted; an open one it is shown and no longer lists was addressed, and is closed. Those of
kind `thread` are the person's open threads (`GET /v1/threads`).

Each reply gets at most three loose ends from the last six hours, the person's first:
answering what they said matters more than having our own questions answered. The
assistant's own questions come back only when the person is winding a topic down (the
analysis's `lull`, or a phrasing such as "ok thanks"), never in the middle of another one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from actors.asking import Asking, ask_shaped, line_index, numbered
from providers.analysis import Shape
from providers.notes import LOOSE_ASSISTANT, LOOSE_ENDS, LOOSE_PERSON, LOOSE_THREADS
from providers.rehearsal_analysis import asks, is_lull, promises
from storage.loose_ends import BY, KINDS, LooseEnd, Noted
from storage.records import Turn, excerpt

if TYPE_CHECKING:
    from actors.messages import TurnRequest
    from actors.replies import Matching
    from actors.runtime import Runtime

log = logging.getLogger("stillhere.loose_ends")

TASK = "loose-ends"
HORIZON_S = 6 * 3600  # a loose end older than this is not brought up again
SHOWN = 3  # loose ends a reply gets, at most
READ = 20  # open loose ends read per turn, to choose from
TEXT_CHARS = 200  # of a loose end as stored and shown
ANSWER_TOKENS = 40  # {"loose_ends": ["A1", "P2"]}, four labels at most
# Fixed, and first in every request, so that a server's cached prefix covers them.
INSTRUCTIONS = """You find what an exchange left unaddressed.
The lines come in the order they were said: A lines are the assistant's, P lines the \
person's, and the last line is the assistant's reply.
List the labels of the lines left open:
- a question of the assistant's, before the reply, that no P line answers;
- a question or request of the person's that the reply does not deal with;
- a story or a promise left to go on later ("I'll tell you later", "I'll look into it").
The reply's own new question is not left open yet. Most exchanges leave nothing open.

Examples:
A1: How was your weekend? P1: can you remind me to call Sam at 5? A2: Sure, I'll remind you at 5.
{"loose_ends": ["A1"]}
A1: How was your weekend? P1: great, we went hiking A2: Lovely! Where did you go?
{"loose_ends": []}
P1: I got the job! P2: and my car broke down A1: Congratulations on the job!
{"loose_ends": ["P2"]}
P1: tu peux trouver quand le musée rouvre ? A1: Je n'ai pas l'info, je reviens vers toi.
{"loose_ends": ["A1"]}
A1: Tu as bien dormi ? P1: oui, très bien A2: Tant mieux !
{"loose_ends": []}

Answer only the JSON: {"loose_ends": [...]}, with the labels, or an empty list."""


def shape(assistant: int, people: int) -> Shape:
    """The answer: at most four labels of the request's lines."""
    labels = [f"A{i}" for i in range(1, assistant + 1)] + [f"P{i}" for i in range(1, people + 1)]
    listed = {"type": "array", "items": {"type": "string", "enum": labels}, "maxItems": 4}
    return Shape.of(TASK, {"loose_ends": listed}, ANSWER_TOKENS)


@dataclass(frozen=True, slots=True)
class OpenEnds:
    """The open loose ends a turn read, to choose its note from."""

    recent: list[LooseEnd]  # points and questions from the last six hours, oldest first
    threads: list[LooseEnd]  # open threads, however old


NO_ENDS = OpenEnds([], [])  # with reply matching off (`--reply-matching off`)


class KeptEnds:
    """A conversation's open loose ends as last read, kept with its stream, so that a turn
    reads them from PostgreSQL only after they changed. Only `note_after` writes a person's
    loose ends, on the node that owns them, under the stream's epoch; it tells `changed`.
    A read that was under way when they changed is used by its turn, and not kept."""

    __slots__ = ("_changes", "_ends")

    def __init__(self) -> None:
        self._ends: OpenEnds | None = None
        self._changes = 0

    async def read(self, rt: Runtime, person: str) -> OpenEnds:
        since = rt.clock.now() - timedelta(seconds=HORIZON_S)
        if self._ends is None:
            changes = self._changes
            ends = OpenEnds(*await rt.store.loose_ends.open_ends(person, since, READ))
            if changes != self._changes:
                return ends
            self._ends = ends
        # The newest READ at the read stay the newest as time passes; older ones only leave.
        return OpenEnds([e for e in self._ends.recent if e.at >= since], self._ends.threads)

    def changed(self) -> None:
        self._ends = None
        self._changes += 1


async def read_open(rt: Runtime, req: TurnRequest, kept: KeptEnds) -> OpenEnds:
    """Never raises: without them the reply only lacks its note."""
    try:
        return await kept.read(rt, req.person)
    except Exception:
        log.exception("loose ends could not be read; the reply goes ahead without them")
        return OpenEnds([], [])


def winding_down(req: TurnRequest, matching: Matching) -> bool:
    """Whether the says wind a topic down: the analysis's `lull`, or phrasings that do."""
    return matching.lull or (bool(req.new) and all(is_lull(t.text) for t in req.new))


@dataclass(frozen=True, slots=True)
class Handed:
    """The loose ends a reply is handed: its LOOSE ENDS note, and their ids for the trace."""

    chosen: list[LooseEnd]  # points and questions, the person's first
    threads: list[LooseEnd]

    def note(self) -> str | None:
        lines = [LOOSE_ENDS]
        for title, group in (
            (LOOSE_PERSON, [e for e in self.chosen if e.by == "person"]),
            (LOOSE_ASSISTANT, [e for e in self.chosen if e.by == "assistant"]),
            (LOOSE_THREADS, self.threads),
        ):
            if group:
                lines.append(title + " " + "; ".join(f'"{e.text}"' for e in group) + ".")
        return "\n".join(lines) if len(lines) > 1 else None


def choose(ends: OpenEnds, lull: bool) -> Handed:
    """At most three loose ends, the person's first; the assistant's own questions only
    while the person winds a topic down (`lull`: so does a follow-on, sent then); the three
    newest open threads."""
    person = [e for e in reversed(ends.recent) if e.by == "person"]
    ours = [e for e in reversed(ends.recent) if e.by == "assistant"]
    return Handed((person + (ours if lull else []))[:SHOWN], ends.threads[-SHOWN:])


async def note_after(
    rt: Runtime, req: TurnRequest, epoch: int, reply: Turn, ends: OpenEnds, read: KeptEnds
) -> None:
    """After a reply: note what the exchange left unaddressed, close what it addressed,
    as the person's owner under `epoch`, and tell `read`. `ends` are those the turn read
    as it began (no other turn of the conversation ran since)."""
    shown = ends.recent + ends.threads
    before = next((t for t in reversed(req.history) if t.role == "assistant"), None)
    a_open = [e for e in shown if e.by == "assistant"]
    p_open = [e for e in shown if e.by == "person"]
    listed = await listed_ends(
        rt,
        _once([e.text for e in a_open], [t.text for t in (before, reply) if t is not None]),
        _once([e.text for e in p_open], [t.text for t in req.new]),
    )
    if listed is None:
        return  # nothing learnt: nothing closed either
    kept = {a_open[i].id for side, i, _ in listed if side == "A" and i < len(a_open)}
    kept |= {p_open[i].id for side, i, _ in listed if side == "P" and i < len(p_open)}
    noted = [
        n
        for side, i, n in listed
        if (side == "A" and i >= len(a_open)) or (side == "P" and i >= len(p_open))
    ]
    closed = [e.id for e in shown if e.id not in kept]
    if not closed and not noted:
        return  # nothing changed: no write, no log line
    now = rt.clock.now()
    try:
        await rt.store.loose_ends.settle(req.person, req.conversation, epoch, now, closed, noted)
    finally:
        read.changed()  # written, or perhaps written: read again
    log.info(
        "loose ends in conversation %s: %d noted, %d closed, %d still open",
        str(req.conversation)[:8],
        len(noted),
        len(closed),
        len(kept),
    )


async def listed_ends(
    rt: Asking, a_lines: list[str], p_lines: list[str]
) -> list[tuple[str, int, Noted]] | None:
    """What the analysis lists as left unaddressed among the assistant's lines (its open
    loose ends, then the exchange's messages) and the person's; None without an answer."""
    listed = await ask_shaped(
        rt,
        TASK,
        in_order(a_lines, p_lines),
        INSTRUCTIONS,
        lambda answer: _read(answer, a_lines, p_lines),
        shape(len(a_lines), len(p_lines)),
    )
    if listed is None:
        return None
    reply = len(a_lines) - 1  # its own new question is not left open yet
    return [e for e in listed if (e[0], e[1]) != ("A", reply) or e[2].kind == "thread"]


def in_order(a_lines: list[str], p_lines: list[str]) -> list[str]:
    """The request's lines, labelled A1..., P1..., in the order they were said: the reply,
    the last A line, comes after the says."""
    lines = numbered(a_lines, p_lines, TEXT_CHARS)
    reply = len(a_lines) - 1
    return lines[:reply] + lines[reply + 1 :] + lines[reply : reply + 1]


def _once(still_open: list[str], exchange: list[str]) -> list[str]:
    """One side's lines: its open loose ends, then the exchange's messages that are not
    one of them already (a question left open is the message the says followed)."""
    shown = {excerpt(text, TEXT_CHARS) for text in still_open}
    fresh = [t for t in exchange if t and excerpt(t, TEXT_CHARS) not in shown]
    return still_open + fresh


def _kind(text: str) -> str:
    """What a line left open is, read from its words."""
    if promises(text):
        return "thread"
    return "question" if asks(text) else "point"


def _read(
    answer: dict[str, Any], assistant: list[str], people: list[str]
) -> list[tuple[str, int, Noted]] | None:
    """Each loose end as (side, 0-based line index, what to note); None if not the shape.
    A bare label ("A1") is read as that line left open, in its own words."""
    items = answer.get("loose_ends")
    if not isinstance(items, list):
        return None
    listed = []
    for item in items:
        if isinstance(item, str) and item[:1] in ("A", "P"):
            texts = assistant if item[0] == "A" else people
            index = line_index(item, item[0], len(texts))
            if index is None:
                return None
            by = "assistant" if item[0] == "A" else "person"
            listed.append(
                (item[0], index, Noted(by, _kind(texts[index]), excerpt(texts[index], TEXT_CHARS)))
            )
            continue
        if not isinstance(item, dict):
            return None
        by, ref, text, kind = (item.get(k) for k in ("by", "ref", "text", "kind"))
        side = "P" if by == "person" else "A"
        count = len(people) if side == "P" else len(assistant)
        if by not in BY or kind not in KINDS or not isinstance(text, str) or not text.strip():
            return None
        index = line_index(ref, side, count)
        if index is None:
            return None
        listed.append((side, index, Noted(str(by), str(kind), excerpt(text, TEXT_CHARS))))
    return listed
