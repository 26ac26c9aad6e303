"""The conversation actor: one per person with a live conversation.

It owns the conversation's state (window of recent turns, declared speaker, cards created in
this conversation, last activity, turn state) and makes every decision about it. Messages are
processed one at a time, so the state needs no locks. It never blocks: storage and model work
run on the loop as jobs that report back by message, so a busy actor still hears "stop".
"""

from __future__ import annotations

import logging
import re
import string
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import pykka

from actors.follow_on import FollowOnDue, FollowOnWait, after_exchange, count_cancelled
from actors.handles import TurnHandles
from actors.inbox import ThreadingActor
from actors.messages import (
    Attach,
    CardCreated,
    CardsWithdrawn,
    End,
    Interrupt,
    Park,
    Say,
    SayStored,
    Snapshot,
    SpeakerSet,
    TurnEnded,
    TurnRequest,
    speaker_lapsed,
)
from actors.pooled import ActorPool, PooledActor
from actors.runtime import ActorFailed, Reply, Runtime
from actors.stream import ConversationStream
from actors.turn import SayOutcome, TurnJob, answer_say, run_turn, store_say
from storage.records import ConversationRecord, Turn

log = logging.getLogger("stillhere.conversation")

_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}…!¡¿]+")


def is_interruption(text: str, words: tuple[str, ...]) -> bool:
    """A short message meant to cut the reply off: "stop", "wait!", "hold on, hold on"."""
    said = " ".join(_PUNCTUATION.sub(" ", text.lower()).split())
    if len(said.split()) > 4:
        return False
    return any(said == w or said.startswith(w + " ") for w in words)


@dataclass(frozen=True, slots=True)
class _Planned:
    """A say put in the window before it was stored, what it changed, to undo if it is not."""

    said: Turn
    evicted: Turn | None  # the turn that left the window to make room for it
    after_interrupt: bool  # whether the turn it planned was to be told of a cut reply


class Home(Protocol):
    """The actor's fixed address on the loop side (the directory's LiveConversation): it
    outlives the actor, so a replacement takes over the same stream."""

    stream: ConversationStream
    snapshot: Snapshot | None

    def tell(self, message: object) -> bool: ...

    def report_failure(self, error: BaseException) -> None: ...

    async def finish(self, reason: str, reply: Reply | None) -> None: ...


class ConversationActor(pykka.Actor):
    """What a conversation's actor does; `PooledConversation` and `ThreadedConversation`
    are it on a shared pool of threads and on a thread of its own (`conversation_actor`)."""

    def __init__(self, rt: Runtime, record: ConversationRecord, live: Home) -> None:
        super().__init__()
        self._rt = rt
        self._live = live
        self._id = record.id
        self._person = record.person
        self._window: deque[Turn] = deque(record.window, maxlen=rt.settings.window_turns)
        self._started_at = record.started_at
        self._speaker = record.speaker
        self._speaker_at = record.speaker_at
        self._cards = list(record.cards)
        self._last_activity = record.last_activity
        self._turn: TurnJob | None = None
        self._storing = 0  # says given to `store_say`, not yet reported back (`SayStored`)
        self._planned: _Planned | None = None  # the say an `answer_say` job is answering
        self._pending: list[Turn] = []
        self._pending_since = 0.0  # time.monotonic() when the oldest pending say was stored
        self._pending_handles: TurnHandles | None = None
        self._during_reply = False
        self._after_interrupt = bool(record.window and record.window[-1].interrupted)
        self._ending: End | None = None
        self._parking = False
        self._follow_on: FollowOnWait | None = None  # after a lull, until its pause ends
        self._handled = 0  # messages received, published with each snapshot

    def on_start(self) -> None:
        self._live.snapshot = self._snapshot()

    def on_receive(self, message: Any) -> None:
        self._handled += 1
        try:
            self._handle(message)
            # Published for the loop: one reference, replaced whole, never changed after.
            self._live.snapshot = self._snapshot()
        except Exception as error:
            # Whoever waits on this message hears of the failure at once; pykka then stops
            # the actor and on_failure hands it to the supervisor.
            reply = getattr(message, "reply", None)
            if isinstance(reply, Reply):
                reply.fail(ActorFailed(repr(error)))
            raise

    def _handle(self, message: Any) -> None:
        match message:
            case Say():
                self._on_say(message)
            case SayStored():
                self._on_stored(message)
            case TurnEnded():
                self._on_turn_ended(message)
            case FollowOnDue():
                self._on_follow_on_due(message)
            case Interrupt():
                self._interrupt()
            case Attach():
                message.reply.resolve(self._snapshot())
            case CardCreated():  # a reinforced memory comes again: keep it once, latest last
                self._cards = [c for c in self._cards if c.id != message.card.id]
                self._cards.append(message.card)
            case CardsWithdrawn():
                self._cards = [c for c in self._cards if c.id not in message.ids]
            case SpeakerSet():
                self._speaker, self._speaker_at = message.speaker, message.at
            case End():
                self._on_end(message)
            case Park():
                self._on_park(message)
            case _:
                log.warning("conversation actor ignored an unknown message %r", message)

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        self._live.report_failure(exception_value)

    # -- says and turns -------------------------------------------------------------------

    def _on_say(self, say: Say) -> None:
        self._cancel_follow_on()  # the person spoke first
        if self._leaving:
            # Ending: the conversation is over. Parking: the next hello rehydrates it, so
            # the client's resend (same id) lands there.
            error = "conversation_ended" if self._ending is not None else "internal_error"
            log.info("a say refused (%s): the conversation is leaving", error)
            say.reply.resolve(SayOutcome(None, error=error))
            return
        now = self._rt.clock.now()
        silence = (now - self._last_activity).total_seconds()
        if self._speaker and speaker_lapsed(
            self._last_activity, now, self._rt.settings.speaker_reset_s
        ):
            log.info("speaker reset to the owner after %d s of silence", silence)
            self._speaker = self._speaker_at = None
            reset = self._rt.store.set_speaker(
                self._id, None, None, self._person, self._live.stream.epoch
            )
            self._rt.run(reset, "resetting the speaker")
        self._last_activity = now  # before any model work: a long turn cannot expire us
        if self._turn is None and not self._storing:
            self._answer_at_once(say, now)
            return
        self._storing += 1
        self._rt.run(store_say(self._rt, say, now, self._live.stream, self._live), "storing a say")

    def _answer_at_once(self, say: Say, now: datetime) -> None:
        """Nothing else to do, nor any earlier say still being stored: one job stores the
        say and answers it. The say joins the window now, as it will be stored; should it
        not be (a resend, or refused), `_on_turn_ended` takes it back out."""
        said = Turn("user", say.text, now, client_id=say.client_id)
        full = len(self._window) == self._window.maxlen
        evicted = self._window[0] if full and self._window else None
        self._planned = _Planned(said, evicted, self._after_interrupt)
        plan = self._request([said], say.handles)
        self._window.append(said)
        self._during_reply = self._after_interrupt = False
        self._turn = TurnJob(armed=False)
        self._rt.run(
            answer_say(self._rt, plan, say, self._live.stream, self._live, self._turn), "a turn"
        )

    def _on_stored(self, message: SayStored) -> None:
        self._storing = max(0, self._storing - 1)  # a replacement actor may hear of older ones
        if message.stored is None:
            return  # a resend or a refused say: nothing new to answer
        turn = message.stored.turn
        if self._ending is not None:
            return  # stored, but the conversation is ending: the summary will include it
        if self._turn is None:
            self._start_turn([turn], message.handles, message.since, message.stored.generation)
            return
        if not self._pending:
            self._pending_since = message.since
        self._pending.append(turn)
        self._pending_handles = message.handles
        if is_interruption(turn.text, self._rt.settings.interrupt_words):
            log.info("interrupted by a short message while replying")
            self._interrupt()
        else:
            self._during_reply = True

    def _start_turn(
        self,
        new: list[Turn],
        handles: TurnHandles,
        since: float,
        generation: int | None = None,
        *,
        follow_on: bool = False,
    ) -> None:
        """Start a turn on `new` (none for a follow-on). `generation` is the context
        generation read with the say just stored; says kept while a reply ran pass none, as
        that reply may have changed the context since they were stored, so the turn reads it
        afresh."""
        request = self._request(new, handles, follow_on=follow_on)
        self._window.extend(new)
        self._during_reply = self._after_interrupt = False
        self._turn = TurnJob()
        job = run_turn(
            self._rt, request, self._live.stream, self._live, self._turn, since, generation
        )
        self._rt.run(job, "a turn")

    def _request(
        self, new: list[Turn], handles: TurnHandles, *, follow_on: bool = False
    ) -> TurnRequest:
        return TurnRequest(
            conversation=self._id,
            person=self._person,
            history=list(self._window),
            new=new,
            speaker=self._speaker,
            cards=list(self._cards),
            during_reply=self._during_reply,
            after_interrupt=self._after_interrupt,
            handles=handles,
            follow_on=follow_on,
        )

    def _on_turn_ended(self, message: TurnEnded) -> None:
        if self._planned is not None and not message.said_stored:
            self._unplan(self._planned)
        self._planned = None
        if message.matched:
            self._rematch(message.matched)
        if message.turn is None:
            self._during_reply = False  # no reply was written after all
        else:
            self._window.append(message.turn)
            self._after_interrupt = message.turn.interrupted
            # As the database counts it (`Store`): the reply's turn is activity too, a
            # follow-on's not (the assistant speaking on its own is not the person's).
            if not message.follow_on:
                self._last_activity = max(self._last_activity, message.turn.at)
        self._turn = None
        if self._ending is not None:
            self._finish()
        elif self._pending and self._pending_handles is not None:
            pending, self._pending = self._pending, []
            self._start_turn(pending, self._pending_handles, self._pending_since)
        if message.turn is not None and not message.follow_on:
            self._after_exchange(message)

    # -- follow-ons -----------------------------------------------------------------------

    def _after_exchange(self, ended: TurnEnded) -> None:
        """After a lull with nothing else to do, a follow-on may come (actors/follow_on.py)."""
        idle = self._turn is None and not self._storing and not self._leaving
        handles = ended.handles
        if not (ended.lull and idle and handles and self._rt.settings.follow_ons != "off"):
            return
        wait = self._follow_on = FollowOnWait(handles)
        stream = self._live.stream
        job = after_exchange(self._rt, self._id, self._person, stream.written, wait, self._live)
        self._rt.run(job, "after an exchange")

    def _on_follow_on_due(self, due: FollowOnDue) -> None:
        """The pause is over. Anything that would keep the actor from starting a turn now (a
        say, the end, parking) cancelled the wait first, so the wait is ours or stale."""
        if due.wait is not self._follow_on:
            count_cancelled(self._rt)  # cancelled as the message was on its way
            return
        self._follow_on = None
        self._rt.metrics.follow_ons.labels(outcome="sent").inc()
        self._start_turn([], due.wait.handles, time.monotonic(), follow_on=True)

    def _cancel_follow_on(self) -> None:
        if self._follow_on is not None:
            self._rt.call(self._follow_on.cancel, self._rt)
            self._follow_on = None

    def _rematch(self, matched: tuple[Turn, ...]) -> None:
        """The says just answered, as matched: the next turn's candidates start from them."""
        by_id = {t.client_id: t for t in matched}
        for i, turn in enumerate(self._window):
            if turn.role == "user" and turn.client_id in by_id:
                self._window[i] = by_id[turn.client_id]

    def _unplan(self, planned: _Planned) -> None:
        """The planned say was not stored: the turn stands as it was before it came. Nothing
        joined the window since, so the say is its newest turn."""
        if self._window and self._window[-1] is planned.said:
            self._window.pop()
        if planned.evicted is not None:
            self._window.appendleft(planned.evicted)
        self._after_interrupt = planned.after_interrupt

    def _interrupt(self) -> None:
        if self._turn is not None:
            self._rt.call(self._turn.interrupt)

    # -- ending ---------------------------------------------------------------------------

    def _on_end(self, message: End) -> None:
        if self._ending is not None:
            if message.reply is not None:
                message.reply.resolve(False)
            return
        self._ending = message
        self._cancel_follow_on()  # the person leaves, or the conversation idles out
        if self._turn is None:
            self._finish()
        else:  # the reply is cut and stored (or never begins), then we finish
            self._rt.call(self._turn.abandon)

    def _finish(self) -> None:
        """Hand over to the directory, which archives, says bye and then stops us: until
        then we still answer, so nobody meets a dead actor mid-ending."""
        assert self._ending is not None
        self._rt.run(self._live.finish(self._ending.reason, self._ending.reply), "ending")

    def _on_park(self, message: Park) -> None:
        idle = self._turn is None and not self._pending and not self._storing and not self._leaving
        self._parking = idle
        if idle:
            self._cancel_follow_on()
        message.reply.resolve(idle)

    @property
    def _leaving(self) -> bool:
        return self._ending is not None or self._parking

    def _snapshot(self) -> Snapshot:
        return Snapshot(
            conversation=str(self._id),
            last_activity=self._last_activity,
            speaker=self._speaker,
            cards=list(self._cards),
            history=list(self._window),
            generating=self._turn is not None,
            pending=len(self._pending),
            started_at=self._started_at,
            speaker_at=self._speaker_at,
            pending_turns=list(self._pending),
            ending=self._leaving,
            during_reply=self._during_reply,
            after_interrupt=self._after_interrupt,
            handled=self._handled,
            at=self._rt.clock.now(),
            storing=self._storing,
            follow_on=self._follow_on,
        )


class PooledConversation(ConversationActor, PooledActor):
    """Served by the runtime's pool (`--actor-threads` N)."""

    def actor_pool(self) -> ActorPool:
        assert self._rt.actor_pool is not None
        return self._rt.actor_pool


class ThreadedConversation(ConversationActor, ThreadingActor):
    """On a thread of its own (`--actor-threads 0`)."""

    # Daemon threads: CPython keeps a shutdown lock per non-daemon thread and walks all of
    # them at every thread start, so starting the 5,000th actor cost 5,000 steps. Shutdown
    # stops every actor itself (`Directory.stop_all`), so nothing relies on the join.
    use_daemon_thread = True


def conversation_actor(rt: Runtime) -> type[ConversationActor]:
    """The actor type `rt` runs conversations on: its pool's if it has one."""
    return ThreadedConversation if rt.actor_pool is None else PooledConversation
