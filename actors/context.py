"""Context assembly: what the model is handed about the past before every turn.

The sources that read the database (recent conversations, memories mentioned in recent
days, a sample of the rest, the person's rules) are queried at the same time, each awaited
with its own timeout; this conversation's memories come with the turn, from the actor.
One that fails or is late is logged, counted (`stillhere_context_source_failures`) and
replaced by an empty list: whatever answers is kept, because a context missing one source
is far better than none at all.
The database's answers are reused from turn to turn while the person's context generation
stands (actors/context_cache.py).

The whole context then fits a budget in characters, filled in a fixed order of priority
(`PRIORITY`), so the same data always gives the same context. See docs/context.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from storage.context import ContextMemory, PastConversation
from storage.records import Turn

if TYPE_CHECKING:
    from actors.messages import TurnRequest
    from actors.runtime import ContextSettings, Runtime

log = logging.getLogger("stillhere.context")

RECALL_INSTRUCTION = (
    "When the person asks what we were talking about, whether you remember, or says they "
    "forgot what we were saying, answer from this section first, before searching memories."
)


@dataclass(frozen=True, slots=True)
class Recalled:
    """A past conversation, with its last turns if it is the most recent one."""

    conversation: PastConversation
    last_turns: list[Turn] = field(default_factory=list)


# -- sources ----------------------------------------------------------------------------------
#
# Each takes the runtime, the turn's request and the clock's now, and answers a list.
# They are looked up in SOURCES or LOCAL_SOURCES at every turn, so a test can replace one.


async def recent_conversations(rt: Runtime, req: TurnRequest, now: datetime) -> list[Recalled]:
    """Read from the conversation record itself, not from memories: the transcript is the
    raw material, the summary only an index of it."""
    settings = rt.settings.context
    past = await rt.store.context.past_conversations(req.person, settings.conversations)
    if not past:
        return []
    turns = await rt.store.context.last_turns(past[0].id, settings.exchange_turns)
    return [Recalled(past[0], turns)] + [Recalled(c) for c in past[1:]]


def working_memories(rt: Runtime, req: TurnRequest, now: datetime) -> list[ContextMemory]:
    """This conversation's cards, as the actor holds them (a muted one is withdrawn from
    the actor at once, so it is already gone)."""
    return [
        ContextMemory(c.id, c.kind, c.text, 1, c.created_at)
        for c in req.cards
        if c.kind != "summary"
    ]


async def recent_memories(rt: Runtime, req: TurnRequest, now: datetime) -> list[ContextMemory]:
    settings = rt.settings.context
    since = now - timedelta(days=settings.recent_days)
    return await rt.store.context.mentioned_since(req.person, since, settings.per_layer)


async def sampled_memories(rt: Runtime, req: TurnRequest, now: datetime) -> list[ContextMemory]:
    """The rest (not mentioned in recent days), most mentioned first."""
    settings = rt.settings.context
    before = now - timedelta(days=settings.recent_days)
    return await rt.store.context.most_mentioned_before(req.person, before, settings.per_layer)


async def personal_rules(rt: Runtime, req: TurnRequest, now: datetime) -> list[str]:
    return [r.text for r in await rt.store.rules.of(req.person)]


# The sources that read the database, each a task with its own timeout. Their answers are
# kept per person while the person's context generation stands (actors/context_cache.py).
Source = Callable[["Runtime", "TurnRequest", datetime], Awaitable[list[Any]]]
SOURCES: dict[str, Source] = {
    "conversations": recent_conversations,
    "recent": recent_memories,
    "sample": sampled_memories,
    "rules": personal_rules,
}

# The sources the turn carries (the actor's state), read in line: a task would cost the
# turn a pass or two of the loop, milliseconds under load, with nothing to wait for.
LocalSource = Callable[["Runtime", "TurnRequest", datetime], list[Any]]
LOCAL_SOURCES: dict[str, LocalSource] = {"working": working_memories}


@dataclass(frozen=True, slots=True)
class Gathered:
    """Every source's answer (None: failed or late), how long each read took in ms (None:
    kept from an earlier turn), and what went wrong, in words."""

    answers: dict[str, list[Any] | None]
    timings: dict[str, float | None]
    problems: tuple[str, ...]


async def _gather(rt: Runtime, req: TurnRequest, now: datetime, generation: int | None) -> Gathered:
    """Every source at once, or its answer kept from an earlier turn at the same context
    `generation` (None: read it first); None for one that failed or was late. Failures make
    one log line."""
    timeout = rt.settings.context.source_timeout_s
    problem = None
    if generation is None:
        generation, problem = await _attempt(rt.store.context.generation(req.person), timeout)
    problems = [f"none kept from earlier turns (generation {problem})"] if problem else []
    kept = {} if generation is None else rt.context_cache.get(req.person, generation, now)
    names = [name for name in SOURCES if name not in kept]
    attempts = await asyncio.gather(  # with all kept, a future already done: no loop pass
        *(_timed(SOURCES[name](rt, req, now), timeout) for name in names)
    )
    read = list(zip(names, attempts, strict=True))
    read += [(name, _attempt_here(local, rt, req, now)) for name, local in LOCAL_SOURCES.items()]
    answers: dict[str, list[Any] | None] = dict(kept)
    timings: dict[str, float | None] = dict.fromkeys(kept)
    for name, (answer, why, *took) in read:
        answers[name] = answer
        timings[name] = round(took[0], 3) if took else 0.0
        if why is not None:
            problems.append(f"{name} {why}")
            rt.metrics.context_source_failures.labels(source=name).inc()
    if problems:
        log.warning("context sources left out: %s", "; ".join(problems))
    if generation is not None:
        good = {n: a for n, a in answers.items() if n in SOURCES and a is not None}
        rt.context_cache.put(req.person, generation, now, good)
    names = (*SOURCES, *LOCAL_SOURCES)
    return Gathered({n: answers[n] for n in names}, {n: timings[n] for n in names}, tuple(problems))


Answer = tuple[Any, str | None]


async def _timed(read: Awaitable[Any], timeout: float) -> tuple[Any, str | None, float]:
    """`_attempt`, and how long it took in milliseconds (for the turn's trace)."""
    started = time.perf_counter()
    answer, why = await _attempt(read, timeout)
    return answer, why, (time.perf_counter() - started) * 1000


async def _attempt(read: Awaitable[Any], timeout: float) -> Answer:
    """(answer, None), or (None, why) if `read` failed or took longer than `timeout`."""
    try:
        async with asyncio.timeout(timeout):
            return await read, None
    except TimeoutError:
        return None, f"late (over {timeout:g} s)"
    except Exception as error:  # any failure of one read: the others still go through
        return None, _failed(error)


def _attempt_here(read: LocalSource, rt: Runtime, req: TurnRequest, now: datetime) -> Answer:
    """A local source's (answer, None), or (None, why) if it failed."""
    try:
        return read(rt, req, now), None
    except Exception as error:
        return None, _failed(error)


def _failed(error: Exception) -> str:
    return f"failed ({error!r})"


# -- the context ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Context:
    """What was actually handed to the model (after the budget), and what failed."""

    text: str
    conversations: int = 0
    exchanges: int = 0
    working: int = 0
    recent: int = 0
    sample: int = 0
    rules: int = 0
    failed: tuple[str, ...] = ()
    # For the turn's trace: the ids of what was handed over, by section; each source's read
    # time in ms (None: kept from an earlier turn); what went wrong with the sources.
    handed: dict[str, tuple[UUID, ...]] = field(default_factory=dict)
    timings: dict[str, float | None] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def __str__(self) -> str:
        return (
            f"{self.conversations} recent conversations ({self.exchanges} turns word for "
            f"word), memories {self.working} working / {self.recent} recent / {self.sample} "
            f"sampled, {self.rules} rules, failed sources: {','.join(self.failed) or 'none'}, "
            f"context {len(self.text)} chars"
        )


@dataclass(slots=True)
class _Section:
    """A titled list of lines; `newest_last` sections keep their last lines when cut."""

    title: str
    lines: list[str]
    newest_last: bool = False
    kept: list[str] = field(default_factory=list)
    placeholder: bool = False  # its line says there is nothing ("none: ..."), counts 0
    ids: list[UUID] = field(default_factory=list)  # what each line shows, when it has an id

    @property
    def kept_ids(self) -> tuple[UUID, ...]:
        return tuple(self.ids[: self.count])

    @property
    def count(self) -> int:
        return 0 if self.placeholder else len(self.kept)


# Order of priority for the budget; the display order is DISPLAY (recent conversations top).
PRIORITY = ("rules", "conversations", "exchanges", "working", "recent", "sample")
HANDED = ("conversations", "working", "recent", "sample")  # the sections whose lines have ids
DISPLAY = ("conversations", "exchanges", "rules", "working", "recent", "sample")


async def assemble(rt: Runtime, req: TurnRequest, generation: int | None = None) -> Context:
    """Gather every source at once and render what fits the budget. `generation` is the
    person's context generation if just read (with the turn's say), else None."""
    now = rt.clock.now()
    gathered = await _gather(rt, req, now, generation)
    answers = gathered.answers
    failed = tuple(name for name, answer in answers.items() if answer is None)
    sections = _sections(rt.settings.context, answers, now)
    _fit(sections, rt.settings.context.budget_chars)
    text = "\n".join(
        line for key in DISPLAY if sections[key].kept for line in _rendered(sections[key])
    )
    return Context(
        text,
        conversations=sections["conversations"].count,
        exchanges=sections["exchanges"].count,
        working=sections["working"].count,
        recent=sections["recent"].count,
        sample=sections["sample"].count,
        rules=sections["rules"].count,
        failed=failed,
        handed={key: sections[key].kept_ids for key in HANDED},
        timings=gathered.timings,
        problems=gathered.problems,
    )


def _rendered(section: _Section) -> list[str]:
    return [section.title, *section.kept]


def _fit(sections: dict[str, _Section], budget: int) -> None:
    """Fill sections in PRIORITY order. A section's title counts once it keeps a line; a
    section stops at its first line that does not fit (its oldest turns, for the
    exchanges), and the next section is tried with what is left."""
    left = budget + 1  # n lines joined by newlines take sum(len) + n - 1 characters
    for key in PRIORITY:
        section = sections[key]
        lines = list(reversed(section.lines)) if section.newest_last else section.lines
        cost = len(section.title) + 1
        kept: list[str] = []
        for line in lines:
            if cost + len(line) + 1 > left:
                break
            cost += len(line) + 1
            kept.append(line)
        if kept:
            left -= cost
            section.kept = list(reversed(kept)) if section.newest_last else kept


def _sections(
    settings: ContextSettings, answers: dict[str, list[Any] | None], now: datetime
) -> dict[str, _Section]:
    recalled: list[Recalled] | None = answers["conversations"]
    summaries = {_same(r.conversation.summary) for r in recalled or [] if r.conversation.summary}
    seen: set[UUID] = set()
    layers = {
        key: _facts(answers[key] or [], seen, summaries) for key in ("working", "recent", "sample")
    }
    chars = settings.memory_chars
    return {
        "conversations": _conversations(recalled, now),
        "exchanges": _exchanges(recalled or [], now, settings.turn_chars),
        "rules": _Section(
            "The person's rules (always follow them):",
            [f"- {_shorten(r, chars)}" for r in answers["rules"] or []],
        ),
        "working": _Section(
            "Memories made or recalled in this conversation:",
            [f"- [{m.kind}] {_shorten(m.text, chars)}" for m in layers["working"]],
            ids=[m.id for m in layers["working"]],
        ),
        "recent": _Section(
            f"Memories mentioned in the last {settings.recent_days:g} days:",
            [
                f"- [{m.kind}] {_shorten(m.text, chars)} "
                f"(mentioned {relative_age(m.last_mentioned, now)})"
                for m in layers["recent"]
            ],
            ids=[m.id for m in layers["recent"]],
        ),
        "sample": _Section(
            "Other memories, most mentioned first:",
            [
                f"- [{m.kind}] {_shorten(m.text, chars)} (mentioned {_times(m.mention_count)})"
                for m in layers["sample"]
            ],
            ids=[m.id for m in layers["sample"]],
        ),
    }


def _facts(
    memories: list[ContextMemory], seen: set[UUID], summaries: set[str]
) -> list[ContextMemory]:
    """A layer less what an earlier layer holds, and less any conversation summary: the
    summaries have their own section, and a summary shown as a fact is a record in
    disguise (the model cannot tell it describes a conversation)."""
    kept = []
    for memory in memories:
        if memory.id in seen or _same(memory.text) in summaries:
            continue
        seen.add(memory.id)
        kept.append(memory)
    return kept


def _conversations(recalled: list[Recalled] | None, now: datetime) -> _Section:
    title = (
        "Recent conversations with this person, newest first, read from the conversation "
        f"record. {RECALL_INSTRUCTION}"
    )
    if recalled is None:  # the source failed: say nothing rather than "no conversation"
        return _Section(title, [])
    if not recalled:
        return _Section(title, ["- none: this is our first conversation."], placeholder=True)
    lines = [
        f"- {relative_age(r.conversation.last_activity, now)}, {_turns(r.conversation.turns)}: "
        f"{_one_line(r.conversation.summary or 'no summary yet.')}"
        for r in recalled
    ]
    return _Section(title, lines, ids=[r.conversation.id for r in recalled])


def _exchanges(recalled: list[Recalled], now: datetime, chars: int) -> _Section:
    turns = recalled[0].last_turns if recalled else []
    age = relative_age(recalled[0].conversation.last_activity, now) if recalled else ""
    title = f"How the most recent conversation ({age}) ended, word for word:"
    lines = [f"{'You' if t.role == 'user' else 'Me'}: {_shorten(t.text, chars)}" for t in turns]
    return _Section(title, lines, newest_last=True)


# -- words ------------------------------------------------------------------------------------


def relative_age(then: datetime, now: datetime) -> str:
    """ "just now", "12 min ago", "3 hours ago", "yesterday", "3 days ago", "2 weeks ago"...
    by elapsed time on the injected clock (the person's time zone is not known here)."""
    seconds = max(0.0, (now - then).total_seconds())
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return _ago(int(seconds // 3600), "hour")
    days = int(seconds // 86400)
    if days == 1:
        return "yesterday"
    if days < 14:
        return f"{days} days ago"
    if days < 60:
        return _ago(days // 7, "week")
    if days < 730:
        return _ago(days // 30, "month")
    return _ago(days // 365, "year")


def _ago(count: int, unit: str) -> str:
    return f"{count} {unit}{'' if count == 1 else 's'} ago"


def _turns(count: int) -> str:
    return f"{count} turn{'' if count == 1 else 's'}"


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _shorten(text: str, chars: int) -> str:
    """One line of at most `chars` characters, cut with an ellipsis."""
    flat = _one_line(text)
    return flat if len(flat) <= chars else flat[: chars - 1].rstrip() + "…"


def _same(text: str | None) -> str:
    """The form two texts are compared in: case and spacing do not make them different."""
    return _one_line(text or "").casefold()
