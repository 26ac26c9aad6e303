"""What a turn hands the model: the window of recent turns, the speaker, the session's cards,
and notes about the messy space between replies (messages sent mid-reply, interruptions,
which message a say answers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from actors.context import Context
from providers.chat import ChatMessage
from providers.notes import (
    CUT_MARK,
    NOTE_CUT_BEFORE_WORDS,
    NOTE_DURING_REPLY,
    NOTE_INTERRUPTED,
)
from storage.records import Card, Turn

SYSTEM = (
    "You are stillhere, a voice and chat assistant on the person's phone. Answer briefly and "
    "naturally. Use your tools to remember facts, schedule reminders, and note who is "
    "speaking when the phone is lent to someone else."
)


@dataclass(frozen=True, slots=True)
class PromptStats:
    """One line of the log per turn: enough to tell "it forgot" from "it misread"."""

    history_turns: int
    cards: int
    speaker: str | None
    chars: int
    context: Context | None = None

    def __str__(self) -> str:
        handed = f"{self.cards} cards" if self.context is None else str(self.context)
        return (
            f"{self.history_turns} turns of history, {handed}, "
            f"speaker {self.speaker or 'owner'}, {self.chars} chars in all"
        )


def build_messages(
    history: list[Turn],
    new: list[Turn],
    *,
    speaker: str | None,
    cards: list[Card],
    during_reply: bool,
    after_interrupt: bool,
    context: Context | None = None,
    data_notes: Sequence[str | None] = (),
) -> tuple[list[ChatMessage], PromptStats]:
    """The messages of one model call. With a `context` (every real turn), it ends the
    first system message, and the session's cards are in it (working memories) rather than
    listed here a second time."""
    system = [SYSTEM]
    if speaker:
        system.append(f"The phone is lent: the person speaking now is {speaker}, not the owner.")
    if cards:
        system.append("Cards created in this conversation:")
        system.extend(f"- [{c.kind}] {c.text}" for c in cards)
    if context is not None and context.text:
        system.append("\n" + context.text)  # after a blank line, in the one system message
    messages = [ChatMessage("system", "\n".join(system))]
    messages.extend(_as_message(t) for t in history)
    notes = [
        n
        for n, on in ((NOTE_INTERRUPTED, after_interrupt), (NOTE_DURING_REPLY, during_reply))
        if on
    ]
    if notes:
        messages.append(ChatMessage("system", " ".join(notes)))
    # Next to the says they are about: which message they answer, what is left open.
    messages.extend(ChatMessage("system", note) for note in data_notes if note)
    messages.extend(_as_message(t) for t in new)
    chars = sum(len(m.content) for m in messages)
    return messages, PromptStats(len(history), len(cards), speaker, chars, context)


def _as_message(turn: Turn) -> ChatMessage:
    if turn.interrupted and not turn.text.strip():
        return ChatMessage("system", NOTE_CUT_BEFORE_WORDS)
    text = turn.text + CUT_MARK if turn.interrupted else turn.text
    return ChatMessage(turn.role, text)
