"""The turn pipeline: coroutines an actor starts on the loop.

`store_say` makes a say durable and acks it; `run_turn` calls the model with the window,
streams the reply, runs tools, stores the reply and tells the actor it ended; `answer_say`
does the one and then the other, for a say the actor was idle for. Each reports back to the
actor by message, so the actor keeps every decision and never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from uuid import UUID, uuid4

from actors.context import Context, assemble
from actors.echo import NO_REPEAT, EchoGuard, sources_for
from actors.inbox import Mailbox
from actors.loose_ends import (
    NO_ENDS,
    KeptEnds,
    OpenEnds,
    choose,
    note_after,
    read_open,
    winding_down,
)
from actors.messages import Say, SayStored, TurnEnded, TurnRequest
from actors.persona import START_FONDNESS
from actors.prompt import build_messages
from actors.replies import UNMATCHED, Matching, match_replies
from actors.runtime import Runtime
from actors.stream import ConversationStream
from actors.tools import TOOLS, ToolContext, execute
from actors.trace import TurnTrace
from providers.chat import ChatMessage, ModelError, TextDelta, ToolCall
from providers.notes import FOLLOW_ON
from storage.event_log import ReplyRow
from storage.moods import Nudge
from storage.owners import Fenced
from storage.pool import STORAGE_FULL, UNAVAILABLE, storage_fault
from storage.records import StoredSay, Turn, reply_place, say_place
from storage.store import ConversationEnded

log = logging.getLogger("stillhere.turn")

# The longest pause before retrying a failed first call: a model asking (`Retry-After`)
# for more gets no retry, and the person hears at once that it failed.
MAX_RETRY_WAIT_S = 5.0
FALLBACK = "Sorry, I lost my train of thought there. Could you say that again?"


@dataclass(frozen=True, slots=True)
class SayOutcome:
    """What the link answers a say with: the ack frame, or an error code."""

    ack: dict[str, object] | None
    duplicate: bool = False
    error: str | None = None


async def store_say(
    rt: Runtime, say: Say, now: datetime, stream: ConversationStream, mailbox: Mailbox
) -> None:
    """Store a say that came while its actor was busy (a turn running, or an earlier say
    still being stored), and tell the actor."""
    stored = await _store(rt, say, now, stream)
    mailbox.tell(SayStored(stored, say.handles, time.monotonic()))


async def answer_say(
    rt: Runtime,
    plan: TurnRequest,
    say: Say,
    stream: ConversationStream,
    mailbox: Mailbox,
    job: TurnJob,
) -> None:
    """Store a say the actor had nothing else to do for, then answer it in the same job.

    The actor planned the turn when the say came: `plan.new` is the say as it is stored,
    already in the actor's window. So the reply starts as soon as the say is stored, with
    no round trip to the actor in between, and the actor hears of both at the turn's end.
    It starts in the very step that acks the say: the ack and `reply.start` leave in one
    write, and no other say can be stored between them.
    """
    begun: Begun | None = None

    def begin() -> None:
        nonlocal begun
        if not job.abandoned:
            job.arm()
            begun = begin_reply(rt, plan, stream)

    stored = await _store(rt, say, plan.new[0].at, stream, then=begin)
    if stored is None or begun is None:
        job.abandon()  # a store that ends after the wait starts no reply
        mailbox.tell(TurnEnded(None, said_stored=stored is not None))
        return
    await run_turn(rt, plan, stream, mailbox, job, time.monotonic(), stored.generation, begun)


async def _store(
    rt: Runtime,
    say: Say,
    now: datetime,
    stream: ConversationStream,
    then: Callable[[], None] | None = None,
) -> StoredSay | None:
    """Store the say in the stream's conversation, then ack it: the ack means "stored". A
    resent id is acked again and a refused say answered with an error; both give None, as
    nothing new was stored. A PostgreSQL that does not answer within `store_timeout_s`
    (paused, restarting, unreachable) gets the say answered `unavailable`: the client
    resends it with its id. It is answered then even if a statement it waited on takes longer
    to give up (asyncpg cancels a statement by asking PostgreSQL, which may not answer that
    either): that unwinds alone, and the say's write goes on.

    The caller that gave up acks nothing and starts no turn, even if the write lands. The
    resend does: it waits on that write if it is still queued or in flight, or finds its row
    stored and never acked, and is acked and answered as a new say (`Store.add_say`), once.
    Only one caller at a time stores a say of the conversation (`stream.ordering`), so the
    resend gets that far only once the caller before it has given up: never two owners.

    `then` is called right after the ack is sent, in the same step, for a say newly stored.
    `asyncio.wait` leaves the store running when it gives up, and wakes as the store ends."""
    storing = asyncio.ensure_future(_store_in_turn(rt, say, now, stream, then))
    try:
        await asyncio.wait((storing,), timeout=rt.settings.store_timeout_s)
        if storing.done():
            return storing.result()
        log.warning(
            "a say was not stored within %g s: PostgreSQL unavailable", rt.settings.store_timeout_s
        )
        say.reply.resolve_here(SayOutcome(None, error="unavailable"))
        return None
    finally:
        storing.cancel()  # done already, or given up on


async def _store_in_turn(
    rt: Runtime,
    say: Say,
    now: datetime,
    stream: ConversationStream,
    then: Callable[[], None] | None,
) -> StoredSay | None:
    await stream.ordering.acquire()  # acks and the window keep the order says arrived in
    handed_on = False  # the lock, to the ack's write
    try:
        # The reply before it, too: a crash never leaves the record with a say and without
        # the reply it followed.
        await stream.written()
        stored = await _add(rt, say, now, stream)
        if stored is None:
            return None
        if stored.duplicate:
            # Marked, for its seq may be another conversation's: not an event of this stream.
            ack = {"type": "ack", "id": say.client_id, "seq": stored.ack_seq, "repeat": True}
            say.reply.resolve_here(SayOutcome(ack, duplicate=True))
            return None
        say.reply.resolve_here(SayOutcome(stream.emit("ack", id=say.client_id)))
        # The next say waits until this one's ack is written, so that a resend of this one
        # finds it; this say's turn need not.
        stream.after_written(stream.ordering.release)
        handed_on = True
        if then is not None:
            then()
        return stored
    finally:
        if not handed_on:
            stream.ordering.release()


async def _add(
    rt: Runtime, say: Say, now: datetime, stream: ConversationStream
) -> StoredSay | None:
    """The say's row, or None if it was refused (and the say answered with the error)."""
    try:
        return await rt.store.add_say(
            stream.conversation,
            stream.person,
            say.client_id,
            say.text,
            now,
            say_place(stream.last_seq),
            stream.epoch,
        )
    except ConversationEnded:
        say.reply.resolve_here(SayOutcome(None, error="conversation_ended"))
    except Fenced:  # another node owns the person now; their links are being closed
        say.reply.resolve_here(SayOutcome(None, error="moved"))
    except (*UNAVAILABLE, STORAGE_FULL) as failure:
        code, what = storage_fault(failure)
        log.warning("a say could not be stored: PostgreSQL %s", what)
        say.reply.resolve_here(SayOutcome(None, error=code))
    except Exception:
        log.exception("a say could not be stored")
        say.reply.resolve_here(SayOutcome(None, error="internal_error"))
    return None


class TurnJob:
    """The actor's handle on a running turn, to cut it off. Used on the loop only.

    A turn started by `answer_say` is armed once its say is stored: before that there is
    no reply to cut, so an interrupt does nothing (as it would a moment before the say came),
    while an ending conversation abandons the turn before it begins.
    """

    def __init__(self, *, armed: bool = True) -> None:
        self.interrupted = False
        self.abandoned = False
        self._armed = armed
        self._task: asyncio.Task[None] | None = None

    def arm(self) -> None:
        self._armed = True

    def interrupt(self) -> None:
        if not self._armed:
            return
        self.interrupted = True
        if self._task is not None:
            self._task.cancel()

    def abandon(self) -> None:
        """The conversation ends: cut the reply, or give none if it has not begun."""
        if self._armed:
            self.interrupt()
        else:
            self.abandoned = True


class ReplyWriter:
    """Streams a reply's text as deltas and keeps what was actually sent.

    Pieces the model hands over within `window` seconds of the last delta are held and sent
    as one delta when the window closes. A paced model's pieces still go one by one; a fast
    model's, or those that bunch up while the loop is busy, cost one frame, one replay
    entry and one write per link instead of one each.

    Before the window, the echo guard (`actors.echo`) holds back the reply's start while it
    could be a repetition: what it holds is not a piece yet, and what it cuts never is.
    """

    def __init__(
        self, stream: ConversationStream, reply: UUID, window: float, guard: EchoGuard
    ) -> None:
        self.guard = guard
        self._stream = stream
        self._reply = str(reply)
        self._window = window
        self._pieces: list[str] = []  # every piece received, sent or held
        self._sent_pieces = 0
        self._last_sent = -window
        self._timer: asyncio.TimerHandle | None = None
        self.model_chars = 0  # of text the model gave in this turn, held back or cut too

    def write(self, text: str) -> None:
        self.model_chars += len(text)
        self._add(self.guard.feed(text))

    def end_of_text(self) -> None:
        """The model call's text ended: the guard lets go of, or cuts, what it held."""
        self._add(self.guard.end())

    def _add(self, text: str) -> None:
        if not text:
            return
        self._pieces.append(text)
        if self._timer is not None:
            return
        loop = asyncio.get_running_loop()
        wait = self._last_sent + self._window - loop.time()
        if wait <= 0:
            self.flush()
        else:
            self._timer = loop.call_later(wait, self.flush)

    def flush(self) -> None:
        """Send every held piece now, as one delta."""
        self._cancel_timer()
        if self._sent_pieces == len(self._pieces):
            return
        text = "".join(self._pieces[self._sent_pieces :])
        self._sent_pieces = len(self._pieces)
        self._last_sent = asyncio.get_running_loop().time()
        self._stream.emit("reply.delta", reply=self._reply, text=text)

    def drop_held(self) -> None:
        """Forget the pieces not yet sent: the reply was cut off before they went out."""
        self.guard.drop()
        self._cancel_timer()
        del self._pieces[self._sent_pieces :]

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def received(self) -> int:
        """Pieces let through the echo guard, sent or still held."""
        return len(self._pieces)

    def text_since(self, start: int) -> str:
        return "".join(self._pieces[start:])


@dataclass(frozen=True, slots=True)
class Begun:
    """A reply whose `reply.start` is sent: its id, when it began, the says it answers,
    the start's seq."""

    reply: UUID
    at: datetime
    in_reply_to: list[str]
    seq: int


def begin_reply(rt: Runtime, req: TurnRequest, stream: ConversationStream) -> Begun:
    """Send the reply's start: a say stored from here on is one the actor keeps for the
    next turn, and its place in the record is after this reply (`records.say_place`)."""
    reply, at = uuid4(), rt.clock.now()
    in_reply_to = [t.client_id for t in req.new if t.client_id]
    marked = {"follow_on": True} if req.follow_on else {}
    start = stream.emit("reply.start", reply=str(reply), in_reply_to=in_reply_to, **marked)
    return Begun(reply, at, in_reply_to, start["seq"])


async def run_turn(
    rt: Runtime,
    req: TurnRequest,
    stream: ConversationStream,
    mailbox: Mailbox,
    job: TurnJob,
    since: float,
    generation: int | None,
    begun: Begun | None = None,
) -> None:
    """Answer `req.new`, or, for a follow-on (`req.follow_on`, no says), send a message of
    the assistant's own (actors/follow_on.py). `since` is when the oldest say was stored
    (time.monotonic(), for the turn latency metric); `generation` the context generation
    read with it, or None to read it afresh; `begun` the reply if already begun, else it
    begins before anything is awaited."""
    begun = begun or begin_reply(rt, req, stream)
    reply, in_reply_to = begun.reply, begun.in_reply_to
    context, matching, ends = await _gather(rt, req, generation, stream.loose_ends)
    _tell_replies_to(stream, matching)
    lull = not req.follow_on and winding_down(req, matching)
    loose = choose(ends, req.follow_on or lull)
    notes = (matching.note, loose.note(), FOLLOW_ON if req.follow_on else None)
    messages, stats = build_messages(
        req.history,
        req.new,
        speaker=req.speaker,
        cards=[],  # in the context, as working memories
        during_reply=req.during_reply,
        after_interrupt=req.after_interrupt,
        context=context,
        data_notes=notes,
    )
    log.info(
        "turn in conversation %s: handing the model %s; %s",
        str(req.conversation)[:8],
        stats,
        matching,
    )
    guard = EchoGuard(sources_for(req.history, req.new) if rt.settings.echo_guard else ())
    writer = ReplyWriter(stream, reply, rt.settings.delta_window_s, guard)
    tools = ToolContext(
        rt, req.conversation, req.person, stream.epoch, req.handles, mailbox, reply=reply
    )
    try:
        error = await _converse_unless_interrupted(rt, messages, writer, tools, job)
    except BaseException:
        writer.drop_held()  # the turn itself is torn down (shutdown): nothing more goes out
        raise
    if job.interrupted:
        writer.drop_held()
    else:
        writer.flush()
    text = writer.text_since(0) or (FALLBACK if error else "")
    turn = Turn(
        "assistant",
        text,
        begun.at,
        interrupted=job.interrupted,
        reply_id=reply,
        follow_on=req.follow_on,
    )
    end: dict[str, object] = {"reply": str(reply), "text": text, "interrupted": turn.interrupted}
    if error:
        end["error"] = error
    row = ReplyRow(
        req.conversation,
        req.person,
        reply,
        turn,
        in_reply_to,
        reply_place(begun.seq),
        tuple(matching.matches.items()),
        follow_on=req.follow_on,
        mood=None if req.follow_on else _mood(rt, turn),
    )
    stream.end_reply(row, **end)
    handed = tuple(note for note in notes if note)
    trace = TurnTrace(
        reply,
        begun.at,
        tuple(in_reply_to),
        context,
        handed,
        tuple(e.id for e in loose.chosen),
        tuple(e.id for e in loose.threads),
        tuple(tools.calls),
        error,
    )
    stream.traces.append(trace)
    _count_echoes(rt, req, guard)
    rt.metrics.turn_seconds.observe(time.monotonic() - since)
    mailbox.tell(
        TurnEnded(
            turn,
            matched=_matched(req, matching),
            lull=lull,
            follow_on=req.follow_on,
            handles=req.handles,
        )
    )
    if rt.settings.reply_matching:
        noting = note_after(rt, req, stream.epoch, turn, ends, matching, stream.loose_ends)
        rt.jobs.start(noting, "noting loose ends")


async def _gather(
    rt: Runtime, req: TurnRequest, generation: int | None, kept: KeptEnds
) -> tuple[Context, Matching, OpenEnds]:
    """The context, and what the says answer with the loose ends to note: matched while the
    context is gathered, so a judgement costs the reply no extra wait. With reply matching
    off, the context alone, as before there was any."""
    if not rt.settings.reply_matching:
        return await _context(rt, req, generation), UNMATCHED, NO_ENDS
    return await asyncio.gather(
        _context(rt, req, generation), match_replies(rt, req), read_open(rt, req, kept)
    )


def _mood(rt: Runtime, reply: Turn) -> Nudge:
    """How a reply to a say moves the assistant's mood (actors/follow_on.py): written with
    the reply."""
    toward, share = rt.persona.nudge(cut_off=reply.interrupted)
    return Nudge(START_FONDNESS, toward, share, rt.clock.now())


def _tell_replies_to(stream: ConversationStream, matching: Matching) -> None:
    """`reply_to` for each say that answers an earlier message than the latest: after its
    ack and the reply's start, before any of the reply's text (PROTOCOL 1.1)."""
    for said, match in matching.matches.items():
        if match.shown:
            stream.emit("reply_to", id=said, **match.reply_to())


def _matched(req: TurnRequest, matching: Matching) -> tuple[Turn, ...]:
    return tuple(
        replace(t, match=matching.matches[t.client_id])
        for t in req.new
        if t.client_id in matching.matches
    )


def _count_echoes(rt: Runtime, req: TurnRequest, guard: EchoGuard) -> None:
    for cut in guard.cuts:
        rt.metrics.echo_cuts.labels(of=cut.kind).inc()
    if guard.cuts:
        log.info("turn in conversation %s: %s", str(req.conversation)[:8], guard.describe())


async def _context(rt: Runtime, req: TurnRequest, generation: int | None) -> Context:
    """The turn's context. A failing source is already left out by `assemble`; anything
    else going wrong costs the context, never the reply."""
    try:
        return await assemble(rt, req, generation)
    except Exception:
        log.exception("context assembly failed; the model gets the window alone")
        return Context("", failed=("assembly",))


async def _converse_unless_interrupted(
    rt: Runtime,
    messages: list[ChatMessage],
    writer: ReplyWriter,
    tools: ToolContext,
    job: TurnJob,
) -> str | None:
    """Run the model until it is done or cut off; return an error code if it failed."""
    if job.interrupted:
        return None
    job._task = asyncio.ensure_future(_converse(rt, messages, writer, tools))
    try:
        await job._task
    except asyncio.CancelledError:
        if not job.interrupted:
            raise
        log.info("reply cut off after %d pieces", writer.received)
    except ModelError as failure:
        log.warning("model failed during a turn: %s", failure)
        return failure.code
    except Fenced:  # a tool's write: another node owns the person, their links are closing
        log.info("a turn stopped: person %s is another node's now", tools.person[:8])
        return "moved"
    except Exception:
        # A tool or the store failed: the turn still ends, or the actor would wait forever.
        log.exception("a turn failed")
        return "internal_error"
    return None


async def _converse(
    rt: Runtime, messages: list[ChatMessage], writer: ReplyWriter, tools: ToolContext
) -> None:
    for round_ in range(rt.settings.max_tool_rounds + 1):
        start = writer.received
        calls = await _call_model(rt, messages, writer, retry=round_ == 0)
        if not calls:
            return
        messages.append(ChatMessage("assistant", writer.text_since(start), tool_calls=calls))
        for call in calls:
            result = await execute(call, tools)
            messages.append(ChatMessage("tool", result, tool_call_id=call.id))
    log.warning(
        "the model kept calling tools; stopped after %d rounds", rt.settings.max_tool_rounds
    )


async def _call_model(
    rt: Runtime, messages: list[ChatMessage], writer: ReplyWriter, *, retry: bool
) -> list[ToolCall]:
    """One model call. The first call of a turn is retried once if it fails or comes back
    empty before any output; later calls never are (a replay could repeat a tool's work)."""
    before, cuts = writer.received, len(writer.guard.cuts)
    try:
        return await _call_unechoed(rt, messages, writer)
    except ModelError as failure:
        # An echo cut is an answer: asked for again at most once, never retried on top.
        if not retry or writer.received > before or len(writer.guard.cuts) > cuts:
            raise
        wait = max(rt.settings.retry_pause_s, failure.retry_after or 0.0)
        if wait > MAX_RETRY_WAIT_S:  # the person would wait longer than a retry is worth
            raise
        log.warning("first model call failed before any output (%s), retrying once", failure.code)
    rt.metrics.model_retries.inc()
    await asyncio.sleep(wait)
    return await _call_unechoed(rt, messages, writer)


class WholeEcho(ModelError):
    """The model's text was nothing but a repetition, all of it cut."""

    def __init__(self) -> None:
        super().__init__("echo", "the model only repeated earlier messages")


async def _call_unechoed(
    rt: Runtime, messages: list[ChatMessage], writer: ReplyWriter
) -> list[ToolCall]:
    """One model call; one that was nothing but an echo is made again, once, with an
    instruction not to repeat (a second echo is a failure of the model)."""
    try:
        return await _call_once(rt, messages, writer)
    except WholeEcho:
        log.info("the reply was nothing but an echo: asking the model again, once")
        rt.metrics.echo_regenerations.inc()
    return await _call_once(rt, [*messages, ChatMessage("system", NO_REPEAT)], writer)


async def _call_once(
    rt: Runtime, messages: list[ChatMessage], writer: ReplyWriter
) -> list[ToolCall]:
    before, cuts = writer.received, len(writer.guard.cuts)
    calls: list[ToolCall] = []
    cap = rt.settings.max_reply_chars
    # A stream left mid-way is closed on the way out: its connection goes back now, not at GC.
    try:
        async with contextlib.aclosing(rt.model.stream(messages, TOOLS)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    writer.write(event.text)
                    if writer.model_chars > cap:  # an endless reply: cut, the stream closed
                        raise ModelError("too_long", f"the reply passed {cap} characters")
                else:
                    calls.append(event)
    except ModelError:
        writer.guard.drop()  # what it held of a failed call never goes out
        raise
    writer.end_of_text()
    if not calls and writer.received == before:
        if len(writer.guard.cuts) > cuts:
            raise WholeEcho()
        raise ModelError("empty", "the model answered nothing")
    return calls
