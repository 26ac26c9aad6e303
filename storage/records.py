"""Plain records read from and written to the store; shared by actors and transport."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

EXCERPT_CHARS = 80  # a `reply_to`'s excerpt of the message answered (PROTOCOL 1.1)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """The first words of `text`, at most `limit` characters, marked when cut."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0] if " " in text[: limit - 1] else text[: limit - 1]
    return cut.rstrip(" ,;:") + "\u2026"


@dataclass(frozen=True, slots=True)
class ReplyMatch:
    """Which assistant message a say answers, kept with the say (migration 010).

    Assistant messages are named by their reply id (the `reply` of their reply.start).
    `answers` None: the say starts something new (or was unclear and the reply asked).
    """

    answers: UUID | None
    latest: bool  # it answers the latest assistant message: no note, no `reply_to`
    excerpt: str = ""  # the first words of the message answered
    open: tuple[UUID, ...] = ()  # assistant questions still waiting after this say
    unclear: tuple[UUID, ...] = ()  # the questions it could answer, when unclear
    asked: bool = False  # unclear, and the reply asked which one was meant
    guessed: bool = False  # unclear again after asking: the likeliest reading

    @property
    def shown(self) -> bool:
        """The phone shows "replying to ..." (a `reply_to` event, a history field)."""
        return self.answers is not None and not self.latest

    def reply_to(self) -> dict[str, Any]:
        return {"reply": str(self.answers), "excerpt": self.excerpt, "guessed": self.guessed}

    def stored(self) -> dict[str, Any]:
        return {
            "answers": None if self.answers is None else str(self.answers),
            "latest": self.latest,
            "excerpt": self.excerpt,
            "open": [str(q) for q in self.open],
            "unclear": [str(q) for q in self.unclear],
            "asked": self.asked,
            "guessed": self.guessed,
        }

    @classmethod
    def from_stored(cls, value: dict[str, Any]) -> ReplyMatch:
        answers = value.get("answers")
        return cls(
            answers=None if answers is None else UUID(answers),
            latest=bool(value.get("latest")),
            excerpt=str(value.get("excerpt") or ""),
            open=tuple(UUID(q) for q in value.get("open") or ()),
            unclear=tuple(UUID(q) for q in value.get("unclear") or ()),
            asked=bool(value.get("asked")),
            guessed=bool(value.get("guessed")),
        )


@dataclass(frozen=True, slots=True)
class Turn:
    role: str  # user | assistant
    text: str
    at: datetime
    client_id: str | None = None
    interrupted: bool = False
    reply_id: UUID | None = None  # an assistant turn's id: its reply's
    match: ReplyMatch | None = None  # a say's: what it answers, when matched by analysis
    follow_on: bool = False  # an assistant message sent on its own after a lull

    def wire(self) -> dict[str, Any]:
        """A `welcome.history` item (PROTOCOL 1.1 adds `id`, `reply`, `reply_to`). A reply
        keeps the marks it was sent with: `interrupted: true` when it was cut off (as its
        `reply.end` had it), `follow_on: true` for a follow-on (as its `reply.start`)."""
        item: dict[str, Any] = {"role": self.role, "text": self.text, "at": self.at.isoformat()}
        if self.client_id is not None:
            item["id"] = self.client_id
        if self.reply_id is not None:
            item["reply"] = str(self.reply_id)
        if self.interrupted:
            item["interrupted"] = True
        if self.follow_on:
            item["follow_on"] = True
        if self.match is not None and self.match.shown:
            item["reply_to"] = self.match.reply_to()
        return item


# A turn's place in the talk (turns.place, migration 007), from its conversation's stream:
# a reply takes the place of its reply.start, a say the place just after the last event
# sent before it was stored. So a message sent while a reply streams comes after that
# reply, as the model and the phone had it, though the reply is written after it. Rows
# from before places have none: they come first, in the order they were written.
TALK_ORDER = "place NULLS FIRST, id"
LAST_FIRST = "place DESC NULLS LAST, id DESC"  # newest first, to cut a window at the end


def reply_place(start_seq: int) -> int:
    return 2 * start_seq


def say_place(last_seq: int) -> int:
    return 2 * last_seq + 1


@dataclass(frozen=True, slots=True)
class Card:
    id: UUID
    kind: str
    text: str
    created_at: datetime
    reply: UUID | None = None  # the reply it was shown with (the last one shown), if known

    def wire(self) -> dict[str, Any]:
        card = {
            "id": str(self.id),
            "kind": self.kind,
            "text": self.text,
            "created_at": self.created_at.isoformat(),
        }
        if self.reply is not None:
            card["reply"] = str(self.reply)
        return card


@dataclass(frozen=True, slots=True)
class Reminder:
    id: UUID
    text: str
    due: str
    created_at: datetime

    def wire(self) -> dict[str, Any]:
        return {"id": str(self.id), "text": self.text, "due": self.due}


@dataclass(slots=True)
class ConversationRecord:
    """What rehydrating a conversation needs: the row plus its recent turns and cards."""

    id: UUID
    person: str
    started_at: datetime
    last_activity: datetime
    speaker: str | None
    speaker_at: datetime | None
    seq_ceiling: int
    window: list[Turn] = field(default_factory=list)
    cards: list[Card] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StoredSay:
    """The outcome of storing a say: the turn, and the ack seq if it was stored before."""

    turn: Turn
    duplicate: bool
    ack_seq: int | None
    generation: int | None = None  # the person's context generation as it was stored


MEMORY_STATUSES = ("active", "muted", "erroneous", "archived", "done")
LINK_KINDS = ("contradicts", "related", "merged_into", "corrects", "distinct")


@dataclass(frozen=True, slots=True)
class MemoryDraft:
    """A memory as the model (or a person, or the eval) states it, before recognition.

    People and themes are set by whoever states it, never guessed at comparison time: they
    are what lets a loose rewording (0.70 to 0.85) count as the same memory.
    """

    text: str
    type: str = "fact"
    people: tuple[str, ...] = ()
    themes: tuple[str, ...] = ()
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    due_at: datetime | None = None
    all_day: bool = False


@dataclass(frozen=True, slots=True)
class Memory:
    """One row of the memory table (`cards`): a card the model made is a memory."""

    id: UUID
    person: str
    conversation: UUID | None
    type: str
    text: str
    people: tuple[str, ...]
    themes: tuple[str, ...]
    status: str
    corrected_by: UUID | None
    mention_count: int
    created_at: datetime
    first_mentioned: datetime
    last_mentioned: datetime
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    due_at: datetime | None = None
    all_day: bool = False
    resolved_at: datetime | None = None
    fingerprint_model: str | None = None
    recognition: str | None = None  # why it was stored although others came near

    @property
    def draft(self) -> MemoryDraft:
        """What the memory states, to compare it with another as if it were new."""
        return MemoryDraft(
            self.text,
            self.type,
            self.people,
            self.themes,
            self.starts_at,
            self.ends_at,
            self.due_at,
            self.all_day,
        )

    def card(self, reply: UUID | None = None) -> Card:
        """The memory as the protocol's `card` shows it, shown with the reply `reply`."""
        return Card(self.id, self.type, self.text, self.created_at, reply)

    def wire(self) -> dict[str, Any]:
        """The memory as the memories API shows it (docs/memories.md): everything a person
        may see or settle; not the person key, the conversation or the fingerprint."""
        return {
            "id": str(self.id),
            "type": self.type,
            "text": self.text,
            "people": list(self.people),
            "themes": list(self.themes),
            "status": self.status,
            "corrected_by": _iso_or_str(self.corrected_by),
            "mention_count": self.mention_count,
            "created_at": self.created_at.isoformat(),
            "first_mentioned": self.first_mentioned.isoformat(),
            "last_mentioned": self.last_mentioned.isoformat(),
            "starts_at": _iso_or_str(self.starts_at),
            "ends_at": _iso_or_str(self.ends_at),
            "due_at": _iso_or_str(self.due_at),
            "all_day": self.all_day,
            "resolved_at": _iso_or_str(self.resolved_at),
            "recognition": self.recognition,
        }

    def brief(self) -> dict[str, Any]:
        """Enough to recognise a memory in a list of links or of what a sweep took."""
        return {"id": str(self.id), "type": self.type, "text": self.text, "status": self.status}


def _iso_or_str(value: datetime | UUID | None) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else str(value)


@dataclass(frozen=True, slots=True)
class MemoryLink:
    source: UUID
    target: UUID
    kind: str  # one of LINK_KINDS


@dataclass(frozen=True, slots=True)
class Reinforcement:
    """A trace row: `existing` was recognised in `new_text` (or absorbed `new_id`)."""

    id: int
    person: str
    tier: str
    score: float
    new_text: str
    existing: UUID
    new_id: UUID | None
    at: datetime
    decided_by: str | None = None  # tier or judge (None: traced before paths were)
    reason: str | None = None
    draft: MemoryDraft | None = None  # the restatement as said: what a split makes of it
    split_into: UUID | None = None  # the memory it was split out into, if it was

    def wire(self) -> dict[str, Any]:
        """A mention as the memories API shows it: what was said, when, and how it was
        recognised."""
        return {
            "id": self.id,
            "text": self.new_text,
            "at": self.at.isoformat(),
            "tier": self.tier,
            "score": round(self.score, 4),
            "decided_by": self.decided_by,
            "reason": self.reason,
            "split_into": _iso_or_str(self.split_into),
        }
