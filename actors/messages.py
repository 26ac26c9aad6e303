"""Messages a conversation actor receives. Sent with `tell`, handled one at a time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from actors.follow_on import FollowOnWait
from actors.handles import TurnHandles
from actors.runtime import Reply
from storage.records import Card, StoredSay, Turn


@dataclass(frozen=True, slots=True)
class Attach:
    """A link joins, or the admin API looks in: answer with a Snapshot."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class Say:
    client_id: str
    text: str
    handles: TurnHandles
    reply: Reply  # resolved with the StoredSay once stored (the ack is already out)


@dataclass(frozen=True, slots=True)
class SayStored:
    """A say's store is over. `stored` is None if nothing new was stored (a resend, acked
    again, or a say refused with an error)."""

    stored: StoredSay | None
    handles: TurnHandles
    since: float  # time.monotonic() when stored: the turn latency metric starts here


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
    """The turn's job is over; `turn` is its reply, or None if it gave none (the
    conversation ended before it began, or its say was not stored).

    `said_stored` is False when the job stored its own say (`answer_say`) and that say turned
    out a resend or was refused: the actor takes it back out of its window. `matched` holds
    the says the analysis matched (actors/replies.py), to replace in the window. `lull`: the
    says wound a topic down, so a follow-on may come (actors/follow_on.py).
    """

    turn: Turn | None
    said_stored: bool = True
    matched: tuple[Turn, ...] = ()  # the says it answered, now with what each answers
    lull: bool = False
    follow_on: bool = False  # the turn was a follow-on, answering no say
    handles: TurnHandles | None = None  # the turn's, for a follow-on after it


@dataclass(frozen=True, slots=True)
class CardCreated:
    card: Card


@dataclass(frozen=True, slots=True)
class CardsWithdrawn:
    """Memories muted, marked erroneous or forgotten: no longer for the model's eyes."""

    ids: frozenset[UUID]


@dataclass(frozen=True, slots=True)
class SpeakerSet:
    speaker: str | None
    at: datetime


def speaker_lapsed(last_activity: datetime, now: datetime, reset_s: float) -> bool:
    """Silence long enough that a lent phone is back with its owner."""
    return (now - last_activity).total_seconds() >= reset_s


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The actor's state at one moment: for a welcome, and for the admin API."""

    conversation: str
    last_activity: datetime
    speaker: str | None
    cards: list[Card]
    history: list[Turn]
    generating: bool
    pending: int
    started_at: datetime
    speaker_at: datetime | None
    pending_turns: list[Turn]  # says stored while replying, to be answered together
    ending: bool
    during_reply: bool  # the next turn is told messages arrived while it was writing
    after_interrupt: bool  # the next turn is told its previous reply was cut off
    handled: int = 0  # messages the actor had handled when it took this snapshot
    at: datetime | None = None  # when it took it, by the runtime's clock
    storing: int = 0  # says handed to a job to store, not yet reported back
    follow_on: FollowOnWait | None = None  # the follow-on after a lull, from its draw on

    def speaker_now(self, now: datetime, reset_s: float) -> str | None:
        """The speaker the next reply will assume: the owner (None) once the silence since
        the last activity reaches `--speaker-reset`, though the actor forgets the lent
        speaker only when the next say arrives."""
        return None if speaker_lapsed(self.last_activity, now, reset_s) else self.speaker

    def quiet_since(self) -> datetime | None:
        """Since when the actor has had nothing to do, or None while it has something: a
        turn, a say being stored or waiting, its end or parking, a follow-on still to be
        drawn or sent. Read on the loop, where the follow-on's state moves."""
        busy = self.generating or self.pending or self.storing or self.ending
        wait = self.follow_on
        if busy or (wait is not None and wait.state != "declined"):
            return None
        return self.at

    @property
    def state(self) -> str:
        """The turn state as the admin API shows it: idle, replying or ending."""
        if self.ending:
            return "ending"
        return "replying" if self.generating else "idle"


@dataclass(frozen=True, slots=True)
class TurnRequest:
    conversation: UUID
    person: str
    history: list[Turn]
    new: list[Turn]
    speaker: str | None
    cards: list[Card]
    during_reply: bool
    after_interrupt: bool
    handles: TurnHandles
    follow_on: bool = False  # a message of the assistant's own after a lull: `new` is empty
