"""Plain records read from and written to the store; shared by actors and transport."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID


@dataclass(frozen=True, slots=True)
class Turn:
    role: str  # user | assistant
    text: str
    at: datetime
    client_id: str | None = None
    interrupted: bool = False

    def wire(self) -> dict[str, Any]:
        return {"role": self.role, "text": self.text, "at": self.at.isoformat()}


@dataclass(frozen=True, slots=True)
class Card:
    id: UUID
    kind: str
    text: str
    created_at: datetime

    def wire(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "kind": self.kind,
            "text": self.text,
            "created_at": self.created_at.isoformat(),
        }


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
