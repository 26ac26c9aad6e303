"""The tools a model may call during a turn.

Each executes on the loop (it writes to PostgreSQL), shows its effect through the turn's
handles, and tells the actor what changed in the conversation's state.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, time
from typing import Any
from uuid import UUID

import orjson

from actors.handles import Page, TurnHandles
from actors.inbox import Mailbox
from actors.memory.search import BadQuery, Found, query_limit, query_text
from actors.messages import CardCreated, SpeakerSet
from actors.runtime import Runtime
from actors.trace import tool_line
from providers.chat import ToolCall, ToolSpec
from providers.embedding import EmbeddingError
from storage.records import MemoryDraft

log = logging.getLogger("stillhere.turn")


@dataclass(frozen=True, slots=True)
class ToolContext:
    runtime: Runtime
    conversation: UUID
    person: str
    epoch: int  # the person's owner epoch: every write a tool makes goes under it
    handles: TurnHandles
    mailbox: Mailbox
    calls: list[str] = field(default_factory=list)  # a line per call, for the turn's trace
    reply: UUID | None = None  # the turn's reply: what a card it shows is shown with


def _text(name: str) -> dict[str, Any]:
    return {"type": "string", "description": name}


def _list(name: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}, "description": name}


UNSPECIFIED = "unspecified"  # a reminder's time, when it was not said
MEMORY_TYPES = ("fact", "appointment", "reminder", "task", "memo", "preference")
# A page's title is read at a glance on a phone: a few words, never a sentence.
PAGE_TITLE_WORDS = 3
PAGE_TITLE_CHARS = 60
PAGE_BODY_CHARS = 4000
SEARCH_LIMIT = 5  # a few memories the model reads in full, not a page to scroll
SEARCH_MAX = 20
_TITLE_WORD = re.compile(r"[^\W_]+(?:['\u2019-][^\W_]+)*")


TOOLS = [
    ToolSpec(
        "remember",
        "Store a memory about the person (a fact, an appointment, a task, a memo...). If it "
        "is already known, the existing memory is reinforced instead and the result says so.",
        {
            "type": "object",
            "properties": {
                "text": _text("what to remember, as one self-contained sentence"),
                "type": {"type": "string", "enum": list(MEMORY_TYPES)},
                "people": _list("the people it is about, lowercase names"),
                "themes": _list("a few lowercase theme words"),
                "starts_at": _text("for an appointment: ISO 8601 start time"),
                "ends_at": _text("for an appointment: ISO 8601 end time"),
                "due_at": _text("for a task or reminder: ISO 8601 due time"),
                "all_day": {
                    "type": "boolean",
                    "description": "the calendar item is all day (give its times as dates)",
                },
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
        "show_page",
        "Show the person something to read now that should NOT be remembered: weather, "
        "opening hours, traffic, search results. It appears on the phone as a page and is "
        "never stored as a memory; use `remember` for what is about the person.",
        {
            "type": "object",
            "properties": {
                "title": _text("two or three words, e.g. 'Bristol weather'"),
                "body": _text("the page's text"),
            },
            "required": ["title", "body"],
        },
    ),
    ToolSpec(
        "search_memories",
        "Search the person's long-term memory by meaning, by the people and themes named, "
        "and along links between memories. Use it when they ask what you know or remember "
        "about someone or something and the context does not already hold it. Each result "
        "gives the memory's type, status, people, themes, dates, why it was found, and the "
        "link it came through; an erroneous memory is an outdated one, shown with the "
        "memory that corrects it. The closest memories always come back: one found by "
        "meaning alone under about 0.3 is likely unrelated.",
        {
            "type": "object",
            "properties": {
                "query": _text("what to look for: a name, a topic or a question"),
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": SEARCH_MAX,
                    "description": f"how many memories at most (default {SEARCH_LIMIT})",
                },
            },
            "required": ["query"],
        },
    ),
    ToolSpec(
        "set_speaker",
        "The phone is lent: note who is talking now. An empty name means the owner is back.",
        {"type": "object", "properties": {"name": _text("who is speaking")}, "required": ["name"]},
    ),
]


class BadArgument(ValueError):
    """A tool argument the model got wrong; the model hears why and may call again."""


def _time(args: dict[str, Any], name: str) -> datetime | None:
    value = args.get(name)
    if value in (None, ""):
        return None
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        raise BadArgument(f"{name} is not an ISO 8601 time: {value!r}") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _day(when: datetime | None) -> datetime | None:
    """An all-day item's time is its date, stored as midnight UTC of that date (the date
    as written, whatever offset came with it), so the clean-up sweep can tell when its day
    is over in any time zone."""
    return None if when is None else datetime.combine(when.date(), time(), UTC)


def _names(args: dict[str, Any], name: str) -> tuple[str, ...]:
    value = args.get(name) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise BadArgument(f"{name} must be a list of strings")
    return tuple(dict.fromkeys(str(v).strip() for v in value if str(v).strip()))


def memory_draft(args: dict[str, Any]) -> MemoryDraft:
    """The memory the model asked for. `kind` is the first version's name for `type`."""
    text = str(args["text"]).strip()
    if not text:
        raise BadArgument("text is empty")
    all_day = bool(args.get("all_day", False))
    times = [_time(args, name) for name in ("starts_at", "ends_at", "due_at")]
    if all_day:
        times = [_day(when) for when in times]
    return MemoryDraft(
        text=text,
        type=str(args.get("type") or args.get("kind") or "fact").strip().lower(),
        people=_names(args, "people"),
        themes=_names(args, "themes"),
        starts_at=times[0],
        ends_at=times[1],
        due_at=times[2],
        all_day=all_day,
    )


def page(args: dict[str, Any]) -> Page:
    """The page the model asked for. A title over three words is refused rather than cut:
    cut, "Opening hours of the" says nothing, and the model, told why, picks a short one."""
    title = " ".join(str(args["title"]).split())
    body = str(args["body"]).strip()
    words = len(_TITLE_WORD.findall(title))
    if words == 0:
        raise BadArgument("the title is empty: give two or three words")
    if words > PAGE_TITLE_WORDS or len(title) > PAGE_TITLE_CHARS:
        raise BadArgument(
            f"the title {title!r} is too long: give two or three words, e.g. 'Bristol weather'"
        )
    if not body:
        raise BadArgument("the body is empty")
    if len(body) > PAGE_BODY_CHARS:
        raise BadArgument(f"the body is over {PAGE_BODY_CHARS} characters")
    return Page(title, body)


async def _remember(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Store a memory through recognition: the card shown is the memory created, or the
    one it reinforced; the model is told which, and of any possible contradiction."""
    rt = ctx.runtime
    draft = memory_draft(args)
    keeper = rt.memory
    if keeper is None:
        return {"error": "this server keeps no memories"}
    outcome = await keeper.remember(
        ctx.person, draft, conversation=ctx.conversation, epoch=ctx.epoch
    )
    card = outcome.memory.card(ctx.reply)
    ctx.handles.screen.show_card(card)
    ctx.mailbox.tell(CardCreated(card))
    result: dict[str, Any] = {
        "stored": True,
        "card": str(card.id),
        "created": outcome.created,
    }
    if not outcome.created:
        result["reinforced"] = {
            "text": outcome.memory.text,
            "mentions": outcome.memory.mention_count,
            "tier": outcome.tier,
        }
        result["note"] = "Already known: the existing memory was reinforced, nothing new stored."
    if outcome.contradicts:
        result["possible_contradiction"] = [
            {"card": str(m.id), "text": m.text} for m in outcome.contradicts
        ]
        result["note"] = (
            "This disagrees with what was stored before; both are kept. Ask the person "
            "which is right."
        )
    return result


async def _search_memories(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Search the person's memories (`actors.memory.search`) and hand the model each one
    found with what it needs to answer from it."""
    keeper = ctx.runtime.memory
    if keeper is None:
        return {"error": "this server keeps no memories"}
    try:
        query = query_text(args.get("query"))
        limit = query_limit(args.get("limit", SEARCH_LIMIT), SEARCH_MAX)
    except BadQuery as wrong:
        raise BadArgument(str(wrong)) from None
    try:
        found = await keeper.search(ctx.person, query, limit)
    except EmbeddingError as failure:
        return {"error": f"memory search is unavailable right now ({failure.code})"}
    if not found:
        return {"results": [], "note": "Nothing in memory matches; say so rather than guess."}
    return {"results": [_found(f) for f in found]}


def _found(found: Found) -> dict[str, Any]:
    memory = found.memory
    dates = {
        name: value.isoformat()
        for name, value in (
            ("first_mentioned", memory.first_mentioned),
            ("last_mentioned", memory.last_mentioned),
            ("starts_at", memory.starts_at),
            ("ends_at", memory.ends_at),
            ("due_at", memory.due_at),
        )
        if value is not None
    }
    result: dict[str, Any] = {
        "id": str(memory.id),
        "type": memory.type,
        "text": memory.text,
        "status": memory.status,
        "people": list(memory.people),
        "themes": list(memory.themes),
        "dates": dates,
        "mentions": memory.mention_count,
        "why": found.why,
    }
    if found.via is not None:
        result["linked"] = {"kind": found.via.link.kind, "to": str(found.via.through)}
    if memory.corrected_by is not None:
        result["corrected_by"] = str(memory.corrected_by)
    return result


async def _show_page(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Put a page on the phone; nothing is stored as a memory (the stream keeps the event
    for replay, like any other)."""
    ctx.handles.screen.show_page(page(args))
    return {"shown": True, "note": "Shown on the phone as a page; not stored as a memory."}


async def _schedule_reminder(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Schedule the reminder on the phone, and keep it as a memory of type `reminder`, which
    the person lists, mutes and forgets like any other (the clean-up sheet counts it)."""
    rt = ctx.runtime
    text, when = str(args["text"]), str(args["when"])
    reminder = await rt.store.add_reminder(
        ctx.conversation, ctx.person, ctx.epoch, text, when, rt.clock.now()
    )
    ctx.handles.reminders.schedule(reminder)
    result: dict[str, Any] = {"scheduled": True, "reminder": str(reminder.id)}
    if rt.memory is not None:
        draft = reminder_draft(text, when)
        kept = await rt.memory.remember(
            ctx.person, draft, conversation=ctx.conversation, epoch=ctx.epoch
        )
        result["memory"] = str(kept.memory.id)
    return result


def reminder_draft(text: str, when: str) -> MemoryDraft:
    """A reminder as a memory: its text with its time in words, due then if that is an
    ISO 8601 time."""
    try:
        due = _time({"when": when}, "when")
    except BadArgument:
        due = None
    said = text if when in ("", UNSPECIFIED) or due is not None else f"{text} ({when})"
    return MemoryDraft(text=said.strip(), type="reminder", due_at=due)


async def _set_speaker(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    rt = ctx.runtime
    name = str(args.get("name") or "").strip() or None
    now = rt.clock.now()
    await rt.store.set_speaker(ctx.conversation, name, now if name else None, ctx.person, ctx.epoch)
    ctx.mailbox.tell(SpeakerSet(name, now))
    return {"speaker": name or "owner"}


_EXECUTORS: dict[str, Callable[[ToolContext, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "remember": _remember,
    "schedule_reminder": _schedule_reminder,
    "show_page": _show_page,
    "search_memories": _search_memories,
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
        except BadArgument as wrong:
            result = {"error": str(wrong), "code": "invalid_argument"}
    log.info("tool %s: %s", call.name, "failed" if "error" in result else "done")
    ctx.calls.append(tool_line(call, result))
    return orjson.dumps(result).decode()
