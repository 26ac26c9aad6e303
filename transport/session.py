"""One link's dialogue with its conversation, the same over WebSocket and SSE + POST.

The session turns validated client frames into actor messages and answers; it holds the
link's attachment to the conversation and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from actors.directory import CLOSE_MOVED, MOVED, ConversationGone, Draining, LiveConversation
from actors.handles import Page, TurnHandles
from actors.messages import Interrupt, Say
from actors.ownership import NotOwned
from actors.runtime import ActorFailed
from actors.stream import ConversationStream, Link
from actors.turn import SayOutcome
from storage.owners import Fenced
from storage.records import Card, Reminder
from transport.identity import route_of
from transport.protocol import CLOSE_TOO_MANY_LINKS, ProtocolError, error_frame
from transport.server import Server, close_revoked

log = logging.getLogger("stillhere.session")

# Before a hello on a draining node is sent elsewhere (`Session._elsewhere`).
DRAINING_REFUSAL_DELAY_S = 0.25


_TOO_MANY = error_frame(
    "too_many_links", "this person has too many links open; this, the oldest, was closed"
)
_SAY_ERRORS = {
    "conversation_ended": "this conversation has ended; say hello again",
    "internal_error": "the say was not stored; send it again",
    "unavailable": "the database did not answer in time; send the say again with its id",
    "storage_full": "the database's disk is full; send the say again with its id later",
    "moved": "the conversation moved to another node; reconnect and send the say again",
}


class StreamHandles:
    """The per-turn handles a link hands over: show on this screen (a card, a page),
    schedule on this phone.

    All publish on the conversation's stream, so they still reach the phone after a drop
    (replay) even though the link that asked is gone.
    """

    def __init__(self, stream: ConversationStream) -> None:
        self._stream = stream

    def show_card(self, card: Card) -> None:
        self._stream.emit("card", card=card.wire())

    def show_page(self, page: Page) -> None:
        self._stream.emit("page", page=page.wire())

    def schedule(self, reminder: Reminder) -> None:
        self._stream.emit("reminder", reminder=reminder.wire())


class Session:
    __slots__ = ("_link", "_server", "live", "person")  # one per held link: no dict

    def __init__(self, server: Server, link: Link) -> None:
        self._server = server
        self._link = link
        self.person: str | None = None
        self.live: LiveConversation | None = None

    async def hello(self, frame: dict[str, Any], *, last_seq_alone: bool = False) -> None:
        """Identify, resume or start the conversation, send welcome and missed events.

        Missed events are replayed when the hello names the resumed conversation, or, with
        `last_seq_alone` (an EventSource's Last-Event-ID), names none. Raises Unauthorized
        for bad credentials."""
        server = self._server
        started = time.monotonic()
        self.person = server.identity.person(device=frame.get("device"), token=frame.get("token"))
        try:
            if server.directory.draining:
                raise Draining(self.person)
            opened = await server.directory.open(self.person)
        except Draining:
            await self._elsewhere()
            return
        except (ConversationGone, ActorFailed, TimeoutError) as failure:
            # The actor failed or stalled mid-activation; the supervisor is on it.
            log.warning("%s: the conversation could not be opened: %r", self._link.name, failure)
            raise ProtocolError(
                "internal_error", "the conversation could not be opened; say hello again"
            ) from None
        except (NotOwned, Fenced):
            raise ProtocolError(
                "unavailable", "another node still holds this conversation; say hello again"
            ) from None
        live, snap = opened.live, opened.snapshot
        rt = server.runtime
        welcome = {
            "type": "welcome",
            "conversation": str(live.id),
            "route": route_of(self.person),
            "resumed": opened.resumed,
            "age_s": round(opened.age_s, 3) if opened.age_s is not None else None,
            "speaker": snap.speaker_now(rt.clock.now(), rt.settings.speaker_reset_s),
            "cards": [c.wire() for c in snap.cards],
            "history": [t.wire() for t in snap.history],
        }
        named = frame.get("conversation") == str(live.id) or (
            last_seq_alone and frame.get("conversation") is None
        )
        last_seq = frame.get("last_seq") if named and opened.resumed else None
        self.live = live
        # Room for this link under the person's limit: the oldest links give way.
        live.stream.shed(
            server.settings.limits.max_links_per_person, _TOO_MANY, CLOSE_TOO_MANY_LINKS
        )
        replayed = await server.directory.attach(
            live, self._link, welcome, last_seq, hello_since=started
        )
        if self.person in server.identity.revoked:  # revoked while this hello was under way
            close_revoked(server.directory, self.person)
        if opened.resumed:
            log.info(
                "%s resumed conversation %s, age %d s, %d events replayed",
                self._link.name,
                str(live.id)[:8],
                opened.age_s or 0,
                replayed,
            )

    async def _elsewhere(self) -> None:
        """This node is stopping: `bye` `moved` and close 4001, so the client reconnects at
        once, to a node its load balancer still sends links to. After a short wait: until
        the balancer sees /readyz fail, the reconnect may land here again, and the wait
        keeps that loop to a few links a second."""
        log.info("%s sent elsewhere: this node is draining", self._link.name)
        await asyncio.sleep(DRAINING_REFUSAL_DELAY_S)
        self._link.send(MOVED)
        self._link.end(CLOSE_MOVED)

    def _current(self, id_: str | None = None) -> LiveConversation:
        live = self.live
        if live is None:
            raise ProtocolError("hello_first", "the first frame on a link must be a hello", id_)
        if self._server.directory.get(live.person) is not live:
            raise ProtocolError(
                "conversation_ended", "this conversation has ended; say hello again", id_
            )
        return live

    async def say(self, frame: dict[str, Any]) -> SayOutcome:
        """Store the say. Its ack goes out on the stream, or for a resent id, only in the
        outcome (the caller sends it on this link)."""
        id_ = frame["id"]
        live = self._current(id_)
        handles = StreamHandles(live.stream)
        try:
            outcome: SayOutcome = await live.ask(
                lambda reply: Say(id_, frame["text"], TurnHandles(handles, handles), reply)
            )
        except ConversationGone:
            outcome = SayOutcome(None, error="conversation_ended")
        except (ActorFailed, TimeoutError) as failure:
            log.warning("%s: say %s was not answered: %r", self._link.name, id_, failure)
            outcome = SayOutcome(None, error="internal_error")
        if outcome.error is not None:
            raise ProtocolError(outcome.error, _SAY_ERRORS[outcome.error], id_)
        return outcome

    def confirm(self, seq: int) -> None:
        """The client's `ack`: it has every event up to `seq`. Advisory, so unlike a say it
        is not refused on a conversation that has ended meanwhile (it changes nothing)."""
        if self.live is None:
            raise ProtocolError("hello_first", "the first frame on a link must be a hello")
        self.live.stream.confirm(seq)

    def interrupt(self) -> None:
        self._current().tell(Interrupt())

    async def leave(self) -> None:
        await self._server.directory.end(self._current(), "leave")

    def close(self) -> None:
        if self.live is not None:
            self._server.directory.detach(self.live, self._link)
