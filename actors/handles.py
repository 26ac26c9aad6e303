"""Per-turn handles: what a turn may do on the device that asked.

The link that carried a say builds these and hands them over with it; the actor passes them
to the turn and forgets them. Nothing of a link is ever sealed into an actor, so a drop in
the middle of a turn costs nothing: the handles still reach the conversation's stream.
Handles are called on the loop, from the turn pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from storage.records import Card, Reminder


@dataclass(frozen=True, slots=True)
class Page:
    """Something to read now and not to remember (weather, opening hours, traffic): shown
    on the phone as a `page` event, never stored as a memory."""

    title: str  # one to three words
    body: str

    def wire(self) -> dict[str, Any]:
        return {"title": self.title, "body": self.body}


class Screen(Protocol):
    def show_card(self, card: Card) -> None: ...

    def show_page(self, page: Page) -> None: ...


class ReminderSink(Protocol):
    def schedule(self, reminder: Reminder) -> None: ...


@dataclass(frozen=True, slots=True)
class TurnHandles:
    screen: Screen
    reminders: ReminderSink
