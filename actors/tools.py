"""The tools a model may call during a turn.

Each executes on the loop (it writes to PostgreSQL), shows its effect through the turn's
handles, and tells the actor what changed in the conversation's state.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

import orjson

from actors.handles import TurnHandles
from actors.messages import CardCreated, SpeakerSet
from actors.runtime import Runtime
from providers.chat import ToolCall, ToolSpec

log = logging.getLogger("stillhere.turn")


class Mailbox(Protocol):
    """Anything that delivers a message to a conversation's current actor."""

    def tell(self, message: object) -> bool: ...


@dataclass(frozen=True, slots=True)
class ToolContext:
    runtime: Runtime
    conversation: UUID
    person: str
    handles: TurnHandles
    mailbox: Mailbox


def _text(name: str) -> dict[str, Any]:
    return {"type": "string", "description": name}


TOOLS = [
    ToolSpec(
        "remember",
        "Store a memory card about the person (a fact, an appointment, a task, a memo).",
        {
            "type": "object",
            "properties": {
                "text": _text("what to remember"),
                "kind": _text("fact, appointment, task or memo"),
            },
            "required": ["text"],
        },
    ),
    ToolSpec(
        "schedule_reminder",
        "Schedule a reminder on the person's phone.",
        {
            "type": "object",
            "properties": {"text": _text("what to remind"), "when": _text("when, in words")},
            "required": ["text", "when"],
        },
    ),
    ToolSpec(
        "set_speaker",
        "The phone is lent: note who is talking now. An empty name means the owner is back.",
        {"type": "object", "properties": {"name": _text("who is speaking")}, "required": ["name"]},
    ),
]


async def _remember(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    rt = ctx.runtime
    kind = str(args.get("kind") or "fact")
    card = await rt.store.add_card(
        ctx.conversation, ctx.person, kind, str(args["text"]), rt.clock.now()
    )
    ctx.handles.screen.show_card(card)
    ctx.mailbox.tell(CardCreated(card))
    return {"stored": True, "card": str(card.id)}


async def _schedule_reminder(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    rt = ctx.runtime
    reminder = await rt.store.add_reminder(
        ctx.conversation, ctx.person, str(args["text"]), str(args["when"]), rt.clock.now()
    )
    ctx.handles.reminders.schedule(reminder)
    return {"scheduled": True, "reminder": str(reminder.id)}


async def _set_speaker(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    rt = ctx.runtime
    name = str(args.get("name") or "").strip() or None
    now = rt.clock.now()
    await rt.store.set_speaker(ctx.conversation, name, now if name else None)
    ctx.mailbox.tell(SpeakerSet(name, now))
    return {"speaker": name or "owner"}


_EXECUTORS: dict[str, Callable[[ToolContext, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "remember": _remember,
    "schedule_reminder": _schedule_reminder,
    "set_speaker": _set_speaker,
}


async def execute(call: ToolCall, ctx: ToolContext) -> str:
    """Run one tool call; its result (or why it failed) goes back to the model as JSON."""
    executor = _EXECUTORS.get(call.name)
    if executor is None:
        result: dict[str, Any] = {"error": f"unknown tool {call.name!r}"}
    else:
        try:
            result = await executor(ctx, call.arguments)
        except KeyError as missing:
            result = {"error": f"missing argument {missing}"}
    log.info("tool %s: %s", call.name, "failed" if "error" in result else "done")
    return orjson.dumps(result).decode()
