"""The reference phone: one person's app, holding its conversation across dropped links.

What a good mobile app does, and what the load benchmark and the tests rely on:

- it reconnects by itself after every drop, on the backoff schedule, and says hello with
  the `conversation` it had and the `last_seq` it got, so the server replays what it missed;
- it delivers every stream event to the app exactly once and in seq order, whatever the
  replays and duplicates: an event at or below `last_seq` was already delivered;
- it keeps every say in an outbox until its `ack` (ack means stored), and resends it with
  the same id after each reconnect: the server stores and answers an id once, so resending
  is always safe and a say made in a tunnel is not lost;
- `leave()` (the person really left) ends the conversation; a drop or `close()` never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from enum import StrEnum
from types import TracebackType
from typing import Any

import aiohttp

from client.backoff import Backoff
from client.links import (
    Credentials,
    EventStreamLink,
    Frame,
    HeldConnection,
    Link,
    Posts,
    Refused,
    Transient,
    WebSocketLink,
    verifying,
)

log = logging.getLogger("stillhere.client")

# Errors after which the says we sent are resent (nothing was stored); any other error
# about a say means the say itself is refused (too long, blank) and it leaves the outbox.
RESEND_CODES = frozenset(
    {
        "rate_limited",
        "internal_error",
        "unavailable",
        "storage_full",
        "conversation_ended",
        "hello_first",
    }
)
POLL_S = 0.05  # wait_until also re-checks predicates that depend on things we cannot see
# The server's default limits (docs/protocol.md): a say over them is refused before it is read,
# by an error that cannot name it, so it would stay in the outbox and be refused forever.
MAX_TEXT_CHARS = 4000
MAX_ID_CHARS = 128
LEAVE_POSTS = 3
DEFAULT_BACKOFF = Backoff()  # frozen: one shared default is safe


class LinkState(StrEnum):
    """The dot at the top of the screen."""

    DOWN = "down"  # red: no link, waiting before the next attempt (or stopped)
    CONNECTING = "connecting"  # amber: an attempt is under way
    UP = "up"  # green: welcome received, frames flow


class Phone:
    """One person's phone app speaking protocol v1 over WebSocket ("ws") or SSE + POST ("sse").

    `on_event` gets every stream event (frames with a seq) exactly once and in seq order,
    every `welcome` (one per link: check `conversation` and `resumed`), `bye` and `error`.
    `sleep` and `clock` are injectable so tests can check the reconnect schedule without
    waiting; `connect_timeout` bounds one attempt (connect + hello -> welcome). A dead link
    that says nothing is noticed by the WebSocket `heartbeat` (ping every N s) or, for SSE,
    by `read_timeout` (the server pings every 15 s). With `record=False` the phone keeps no
    `events`/`delivered` lists (a long load run counts in `on_event` instead).
    `max_text_chars` and `max_id_chars` are the server's limits (its defaults here): `say`
    refuses a say over them at once rather than keep sending one the server cannot read.
    An `https://` base URL gives `wss://` links, the server's certificate checked against
    the system's authorities, or `ca_file`'s (a session passed in brings its own).
    """

    def __init__(
        self,
        base_url: str,
        *,
        device: str | None = None,
        token: str | None = None,
        transport: str = "ws",
        on_event: Callable[[dict[str, Any]], None] | None = None,
        on_state: Callable[[LinkState], None] | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        rng: random.Random | None = None,
        session: aiohttp.ClientSession | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        connect_timeout: float = 10.0,
        start_timeout: float = 30.0,
        heartbeat: float | None = 20.0,
        read_timeout: float | None = 45.0,
        record: bool = True,
        max_text_chars: int = MAX_TEXT_CHARS,
        max_id_chars: int = MAX_ID_CHARS,
        ca_file: str | os.PathLike[str] | None = None,
    ) -> None:
        if transport not in ("ws", "sse"):
            raise ValueError(f"transport is 'ws' or 'sse', not {transport!r}")
        if device is None and token is None:
            device = secrets.token_urlsafe(24)  # what an app generates once and keeps
        self.base_url = base_url
        self.device = device
        self.token = token
        self.transport = transport
        self.on_event = on_event
        self.on_state = on_state
        self.backoff = backoff
        self.rng = rng if rng is not None else random.Random()
        self.connect_timeout = connect_timeout
        self.start_timeout = start_timeout
        self.heartbeat = heartbeat
        self.read_timeout = read_timeout
        self.record = record
        self.max_text_chars = max_text_chars
        self.max_id_chars = max_id_chars
        self.ca_file = ca_file
        self._sleep = sleep
        self._clock = clock

        self.state = LinkState.DOWN
        self.conversation: str | None = None
        self.last_seq = 0
        self.welcome: dict[str, Any] | None = None
        self.outbox: dict[str, str] = {}
        self.events: list[dict[str, Any]] = []  # stream events only, as delivered
        self.delivered: list[dict[str, Any]] = []  # everything on_event got, in order
        self.reconnects = 0
        self.links = 0  # links that reached welcome
        self.refused: Refused | None = None

        self._creds = Credentials(device=device, token=token)
        self._http = session
        self._own_http = session is None
        self._task: asyncio.Task[None] | None = None
        self._link: Link | None = None
        # For the live link's writer: say ids to send, and seqs to confirm (ints).
        self._queue: asyncio.Queue[str | int] | None = None
        self._resend_task: asyncio.Task[None] | None = None
        self._resend_link: Link | None = None  # the link the pending resend is for
        self._started = False
        self._stopping = False
        self._leaving = False
        self._leave_bye: dict[str, Any] | None = None
        self._moved = False  # the last link ended with `bye` `moved`: reconnect at once
        self._waiters: set[asyncio.Future[None]] = set()

    # -- the app's side ---------------------------------------------------------------------

    async def start(self) -> None:
        """Connect in the background; return once the first link is up.

        Raises TimeoutError after `start_timeout`, or Refused for bad credentials; either
        way the phone is stopped (nothing keeps running behind a failed start)."""
        if self._started:
            raise RuntimeError("a phone starts once; make a new one to come back")
        self._started = True
        if self._http is None:
            connector = aiohttp.TCPConnector(limit=0, ssl=verifying(self.ca_file))
            self._http = aiohttp.ClientSession(connector=connector)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="phone")
        try:
            await self.wait_until(
                lambda: self.links > 0 or self.refused is not None or self._task_done(),
                self.start_timeout,
            )
        except TimeoutError:
            await self.close()
            raise TimeoutError(f"no link to {self.base_url} in {self.start_timeout} s") from None
        if self.links == 0:
            await self.close()
            raise self.refused or ConnectionError("the phone stopped before its first link")

    def say(self, text: str, id: str | None = None) -> str:
        """Put a say in the outbox and send it if the link is up; it stays until acked.

        ValueError for a text over `max_text_chars`, or an id that is not 1 to
        `max_id_chars` characters: the server could never take it."""
        id_ = id if id is not None else uuid.uuid4().hex
        if not 0 < len(id_) <= self.max_id_chars or "\x00" in id_:
            raise ValueError(f"a say's id is 1 to {self.max_id_chars} characters, without NUL")
        if len(text) > self.max_text_chars:
            raise ValueError(f"a say's text is limited to {self.max_text_chars} characters")
        self.outbox[id_] = text
        if self.state is LinkState.UP and self._queue is not None:
            self._queue.put_nowait(id_)
        self._notify()
        return id_

    async def interrupt(self) -> None:
        """Cut the reply in progress. Best effort: with no link there is nothing to cut
        that the server would not have finished anyway."""
        try:
            if self.transport == "sse":
                await self._posts().interrupt()  # a POST needs no open stream
            elif self.state is LinkState.UP and self._link is not None:
                await self._link.interrupt()
            else:
                log.debug("interrupt with no link: not sent")
        except Transient as failed:
            log.debug("interrupt not delivered: %s", failed)

    async def leave(self) -> None:
        """End the conversation (the person really left), wait for its bye, stop.

        Over WebSocket the leave frame goes on the live link; if there is none, or the link
        dies before the bye, `POST /v1/leave` finishes the job (it never starts a
        conversation, so sending it after a leave frame that did get through is harmless).
        No reconnection happens once leaving began: a hello could start a new conversation.
        A hello already sent may still start one, so an attempt under way is let finish
        first, and the leave goes to whatever conversation it reached.
        """
        self._leaving = True
        try:
            with contextlib.suppress(TimeoutError):
                await self.wait_until(self._not_connecting, self.connect_timeout)
            link = self._link
            if self.transport == "ws" and self.state is LinkState.UP and link is not None:
                with contextlib.suppress(Transient, TimeoutError):
                    await link.leave()
                    await self.wait_until(
                        lambda: self._leave_bye is not None or self._link is not link,
                        self.connect_timeout,
                    )
            if self._leave_bye is None:
                await self._halt()  # no hello in flight may start a conversation meanwhile
                self._leave_bye = await self._post_leave()
                self._deliver(self._leave_bye)
        finally:
            await self._stop(polite=False)

    async def close(self) -> None:
        """Stop without leaving (the app was killed): the conversation stays resumable."""
        await self._stop(polite=True)

    def drop(self, *, hold: bool = False) -> HeldConnection | None:
        """Cut the current link; the phone reconnects with backoff.

        The server sees the connection end at once, unless `hold`: then it stays open and
        silent, as a real tunnel leaves it, until the returned connection is `reset()`. The
        server keeps the link attached meanwhile, as it would until its heartbeat fails."""
        if self._link is None:
            return None
        log.debug("dropping the %s link%s", self.transport, " (held open)" if hold else "")
        held = self._link.hold() if hold else None
        self._link.abort()
        return held

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Return once `predicate()` holds; TimeoutError after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while not predicate():
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.add(waiter)
                try:
                    await asyncio.wait({waiter}, timeout=POLL_S)
                finally:
                    self._waiters.discard(waiter)

    async def __aenter__(self) -> Phone:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # -- the link loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        """Connect, serve the link until it ends, wait, again; until stopped or leaving."""
        attempt = 0
        while not (self._stopping or self._leaving):
            try:
                up_at = await self._attempt()
            except Refused as refused:
                log.debug("credentials refused: %s; not reconnecting", refused)
                self.refused = refused
                self._deliver(refused.frame)
                self._set_state(LinkState.DOWN)
                return
            except asyncio.CancelledError:
                raise
            except Exception as failed:  # never let the background task die
                log.debug("link attempt %d failed: %r", attempt, failed)
                up_at = None
            if self._stopping or self._leaving:
                return
            if up_at is not None and self._clock() - up_at >= self.backoff.hold:
                attempt = 0  # that link held: this is a fresh drop, not a flapping link
            if self._moved:  # the server moved us (another node, or it stops): at once
                self._moved = False
                continue
            delay = self.backoff.delay(attempt, self.rng)
            attempt += 1
            log.debug("reconnecting in %.2f s (attempt %d)", delay, attempt)
            await self._sleep(delay)

    async def _attempt(self) -> float | None:
        """One link: connect, serve it until it ends. When it came up, or None."""
        assert self._http is not None
        link: Link
        if self.transport == "ws":
            link = WebSocketLink(self._http, self.base_url, self._creds, heartbeat=self.heartbeat)
        else:
            link = EventStreamLink(
                self._http, self.base_url, self._creds, read_timeout=self.read_timeout
            )
        self._link = link
        self._set_state(LinkState.CONNECTING)
        try:
            try:
                async with asyncio.timeout(self.connect_timeout):
                    welcome = await link.open(self.conversation, self.last_seq)
            except BaseException:
                link.abort()
                raise
            up_at = self._clock()
            await self._serve(link, welcome)
            return up_at
        finally:
            self._link = None
            self._set_state(LinkState.DOWN)

    async def _serve(self, link: Link, welcome: Frame) -> None:
        """The link is up: resend the outbox, read frames until the link ends."""
        self._on_welcome(welcome)
        queue: asyncio.Queue[str | int] = asyncio.Queue()
        for id_ in self.outbox:  # in order, after welcome, same ids
            queue.put_nowait(id_)
        self._queue = queue
        self._set_state(LinkState.UP)
        writer = asyncio.get_running_loop().create_task(self._write(link, queue))
        try:
            async for frame in link.frames():
                self._on_frame(frame, link)
        except (aiohttp.ClientError, OSError, TimeoutError) as ended:
            log.debug("%s link ended: %r", link.kind, ended)
        finally:
            self._queue = None
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            if self._stopping and not self._leaving:
                await link.close()
            else:
                link.abort()

    async def _write(self, link: Link, queue: asyncio.Queue[str | int]) -> None:
        """Send says in outbox order; a say that did not go out is retried, in place.
        Confirmations go in the same order; one that fails is left to the next hello."""
        failures = 0
        while True:
            id_ = await queue.get()
            if isinstance(id_, int):
                with contextlib.suppress(Transient):
                    await link.confirm(id_)
                continue
            while id_ in self.outbox:
                try:
                    answer = await link.say(id_, self.outbox[id_])
                except Transient as failed:
                    if self._queue is not queue:
                        return  # the link ended: a cancel can surface as a POST timeout
                    delay = self.backoff.delay(failures, self.rng)
                    failures += 1
                    log.debug("say %s not delivered (%s); again in %.2f s", id_, failed, delay)
                    await self._sleep(delay)
                    continue
                failures = 0
                if answer is not None:  # SSE: the POST's answer
                    if answer.get("type") == "ack":
                        self._acked(answer)
                    else:
                        self._on_error(answer, link)
                break

    # -- frames -----------------------------------------------------------------------------

    def _on_welcome(self, welcome: Frame) -> None:
        conversation = welcome.get("conversation")
        seq = welcome.get("seq")
        if conversation != self.conversation:
            if self.conversation is not None:
                log.debug("new conversation %s (was %s)", conversation, self.conversation)
            self.conversation = conversation
            self.last_seq = seq if isinstance(seq, int) else 0
        route = welcome.get("route")
        if isinstance(route, str):
            self._creds.route = route  # on every later request: to the node that has us
        self.welcome = welcome
        self.links += 1
        if self.links > 1:
            self.reconnects += 1
        self._deliver(welcome)

    def _on_frame(self, frame: Frame, link: Link) -> None:
        kind = frame["type"]
        seq = frame.get("seq")
        if kind == "ack":
            self._acked(frame)
            if frame.get("repeat") is True:
                # An old ack repeated for a resent id: its seq may be an earlier
                # conversation's, or null. "Stored", not an event of this stream.
                return
        if isinstance(seq, int) and kind != "welcome":
            if seq <= self.last_seq:
                log.debug("already delivered: %s %d", kind, seq)
                return
            self.last_seq = seq
            if self.record:
                self.events.append(frame)
            self._deliver(frame)
            if kind == "reply.end" and self._queue is not None:
                self._queue.put_nowait(seq)  # a reply is whole here: the server may let go
        elif kind == "bye":
            self._moved = frame.get("reason") == "moved"
            if self._leaving:
                if self._leave_bye is not None:
                    return
                self._leave_bye = frame
            self._deliver(frame)  # the server closes the link; we reconnect unless leaving
        elif kind == "error":
            self._on_error(frame, link)
        elif kind != "pong":
            self._deliver(frame)

    def _acked(self, frame: Frame) -> None:
        id_ = frame.get("id")
        if isinstance(id_, str) and self.outbox.pop(id_, None) is not None:
            self._notify()

    def _on_error(self, frame: Frame, link: Link) -> None:
        code = frame.get("code")
        id_ = frame.get("id")
        if code == "conversation_ended":
            link.abort()  # this link's conversation is over: a new link gets the new one
        elif code in RESEND_CODES:
            self._resend_later(link)
        elif isinstance(id_, str) and id_ in self.outbox:
            log.debug("say %s refused for good: %s", id_, code)
            del self.outbox[id_]
        self._deliver(frame)

    def _resend_later(self, link: Link) -> None:
        """After a rate limit (the frame was dropped unread), resend what is not acked:
        once per link, whatever it refused meanwhile. One pending for an earlier link would
        do nothing on waking, so it gives way."""
        if self._resend_task is not None and not self._resend_task.done():
            if self._resend_link is link:
                return
            self._resend_task.cancel()

        async def resend() -> None:
            await self._sleep(self.backoff.first)
            if self._link is link and self._queue is not None:
                for id_ in self.outbox:
                    self._queue.put_nowait(id_)

        self._resend_link = link
        self._resend_task = asyncio.get_running_loop().create_task(resend())

    # -- plumbing ---------------------------------------------------------------------------

    def _deliver(self, frame: Frame) -> None:
        if self.record:
            self.delivered.append(frame)
        if self.on_event is not None:
            try:
                self.on_event(frame)
            except Exception:
                log.exception("on_event failed on a %s frame", frame.get("type"))
        self._notify()

    def _set_state(self, state: LinkState) -> None:
        if state is self.state:
            return
        self.state = state
        if self.on_state is not None:
            try:
                self.on_state(state)
            except Exception:
                log.exception("on_state failed on %s", state.value)
        self._notify()

    def _notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _not_connecting(self) -> bool:
        return self.state is not LinkState.CONNECTING

    def _task_done(self) -> bool:
        return self._task is not None and self._task.done()

    def _posts(self) -> Posts:
        assert self._http is not None, "start() the phone first"
        return Posts(self._http, self.base_url, self._creds)

    async def _post_leave(self) -> Frame:
        """`POST /v1/leave`, retried a few times on the backoff schedule."""
        for attempt in range(LEAVE_POSTS):
            try:
                return await self._posts().leave()
            except Transient as failed:
                log.debug("leave not delivered: %s", failed)
                if attempt + 1 < LEAVE_POSTS:
                    await self._sleep(self.backoff.delay(attempt, self.rng))
        raise ConnectionError("could not reach the server to leave the conversation")

    async def _halt(self) -> None:
        """Stop the link loop (and any pending resend); the link goes with it."""
        for pending in (self._task, self._resend_task):
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
        self._set_state(LinkState.DOWN)

    async def _stop(self, *, polite: bool) -> None:
        self._stopping = True
        if not polite and self._link is not None:
            self._link.abort()
        await self._halt()
        if self._own_http and self._http is not None:
            await self._http.close()
            self._http = None
        self._notify()
