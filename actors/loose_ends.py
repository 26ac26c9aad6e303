"""Loose ends: what an exchange left unaddressed, and which of them the next replies get.

After each reply, off its critical path, the exchange (the loose ends still open, the
assistant message the says followed, the says, the reply) is read for what it leaves
unaddressed on either side: by the rules (`providers.rehearsal_analysis.loose_reading`),
and where they are unsure whether a say answers one of our questions, by the analysis
model's `reply-matching` question about that say, the one a turn asks (docs/context.md,
"How loose ends are noted"). What is left open from the exchange is noted; an open one no
longer left open was addressed, and is closed. Those of kind `thread` are the person's open
threads (`GET /v1/threads`).

Each reply gets at most three loose ends from the last six hours, the person's first:
answering what they said matters more than having our own questions answered. The
assistant's own questions come back only when the person is winding a topic down (the
analysis's `lull`, or a phrasing such as "ok thanks"), never in the middle of another one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from actors import replies
from actors.asking import Asking, numbered
from providers.notes import LOOSE_ASSISTANT, LOOSE_ENDS, LOOSE_PERSON, LOOSE_THREADS
from providers.rehearsal_analysis import LooseRead, is_holding, is_lull, loose_reading
from storage.loose_ends import LooseEnd, Noted
from storage.records import Turn, excerpt

if TYPE_CHECKING:
    from actors.messages import TurnRequest
    from actors.replies import Matching
    from actors.runtime import Runtime

log = logging.getLogger("stillhere.loose_ends")

HORIZON_S = 6 * 3600  # a loose end older than this is not brought up again
SHOWN = 3  # loose ends a reply gets, at most
READ = 20  # open loose ends read per turn, to choose from
TEXT_CHARS = 200  # of a loose end as stored and shown


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
    rt: Runtime,
    req: TurnRequest,
    epoch: int,
    reply: Turn,
    ends: OpenEnds,
    matching: Matching,
    read: KeptEnds,
) -> None:
    """After a reply: note what the exchange left unaddressed, close what it addressed,
    as the person's owner under `epoch`, and tell `read`. `ends` are those the turn read
    as it began (no other turn of the conversation ran since); where the rules are unsure
    whether a say answers one of our questions, the turn's `matching` decides if the
    analysis read the says: no analysis is asked again."""
    shown = ends.recent + ends.threads
    before = next((t for t in reversed(req.history) if t.role == "assistant"), None)
    a_open = [e for e in shown if e.by == "assistant"]
    p_open = [e for e in shown if e.by == "person"]
    a_lines = _once([e.text for e in a_open], [t.text for t in (before, reply) if t is not None])
    p_lines = _once([e.text for e in p_open], [t.text for t in req.new])
    reading = loose_reading(in_order(a_lines, p_lines))
    listed = settled(reading, a_lines, turn_answered(req, matching))
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
) -> list[tuple[str, int, Noted]]:
    """What is left unaddressed in an exchange on its own (`stillhere eval loose-ends`): the
    rules' reading, and where they are unsure whether a say answers one of our questions,
    the turn's reading of the says as a turn comes to it (`_answered`)."""
    reading = loose_reading(in_order(a_lines, p_lines))
    return settled(reading, a_lines, await _answered(rt, a_lines[:-1], p_lines))


def settled(
    reading: list[LooseRead], a_lines: list[str], answered: set[str] | None
) -> list[tuple[str, int, Noted]]:
    """Each line left open as (side, 0-based line index, what to note): the rules' reading,
    but for our questions they are unsure of, open unless a say was read as answering them
    (`answered`: the texts of the A lines a say answers, as `excerpt` cuts them at
    TEXT_CHARS, as stored; None: no reading, the rules')."""
    return [
        (r.ref[0], int(r.ref[1:]) - 1, Noted(r.by, r.kind, excerpt(r.text, TEXT_CHARS)))
        for r in reading
        if (
            r.open
            if r.sure or r.by != "assistant" or answered is None
            else excerpt(a_lines[int(r.ref[1:]) - 1], TEXT_CHARS) not in answered
        )
    ]


async def _answered(rt: Asking, before: list[str], says: list[str]) -> set[str] | None:
    """The texts of the lines before the reply that a turn would read the says as answering
    (`turn_answered`), the candidates those lines: None where it would ask the model
    nothing (no candidate, one just before, says that answer nothing, the rules sure of
    every say) or get no usable answer."""
    says = [say for say in says if not is_holding(say)]
    if not before or not says or (len(before) == 1 and not replies.asks_back(before[0], says)):
        return None
    read = await replies.read_says(rt, before, says)
    if not read.asked or read.failed:
        return None
    return {
        excerpt(before[to], TEXT_CHARS)
        for to, unclear in read.entries.values()
        if to is not None and len(unclear) < 2
    }


def turn_answered(req: TurnRequest, matching: Matching) -> set[str] | None:
    """The texts of the messages the turn's says were read as answering, when the analysis
    read them (`asked`, with an answer); None otherwise: the rules' reading stands."""
    if matching.how != "asked" or matching.failed:
        return None
    texts = {t.reply_id: t.text for t in req.history if t.role == "assistant"}
    read = [texts[m.answers] for m in matching.matches.values() if m.answers in texts]
    return {excerpt(text, TEXT_CHARS) for text in read}


def in_order(a_lines: list[str], p_lines: list[str]) -> list[str]:
    """The exchange's lines, labelled A1..., P1..., in the order they were said: the reply,
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
