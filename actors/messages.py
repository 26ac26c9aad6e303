"""Messages a conversation actor receives. Sent with `tell`, handled one at a time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from actors.handles import TurnHandles
from actors.runtime import Reply
from storage.records import Card, StoredSay, Turn


@dataclass(frozen=True, slots=True)
class Attach:
    """A link joins: answer with a Snapshot."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class Say:
    client_id: str
    text: str
    handles: TurnHandles
    reply: Reply  # resolved with the StoredSay once stored (the ack is already out)


@dataclass(frozen=True, slots=True)
class SayStored:
    stored: StoredSay
    handles: TurnHandles


@dataclass(frozen=True, slots=True)
class Interrupt:
    pass


@dataclass(frozen=True, slots=True)
class End:
    """End the conversation now: summarise, archive, say bye, stop."""

    reason: str  # leave | idle
    reply: Reply | None = None


@dataclass(frozen=True, slots=True)
class Park:
    """Stop early if idle (state is in the database); answers True if it will stop."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class TurnEnded:
    turn: Turn


@dataclass(frozen=True, slots=True)
class CardCreated:
    card: Card


@dataclass(frozen=True, slots=True)
class SpeakerSet:
    speaker: str | None
    at: datetime


@dataclass(frozen=True, slots=True)
class Snapshot:
    conversation: str
    last_activity: datetime
    speaker: str | None
    cards: list[Card]
    history: list[Turn]
    generating: bool
    pending: int
