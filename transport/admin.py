"""The admin API, for developers looking into a conversation that went wrong; and `/metrics`.

The admin API is off unless an admin token is configured, and then listens on a socket of
its own, apart from the one phones connect to: it shows what people said, so it listens on
loopback only unless `--admin-remote on` allows another address. Every request needs
`Authorization: Bearer <admin token>`, compared in constant time (`hmac.compare_digest`);
the token is never logged (the access log records paths only). With `--admin-tls on` it
speaks HTTPS with the main listener's certificate (`--tls-cert`), reloaded with it.

Like all loop-side code it never blocks on an actor: each actor is asked for a `Snapshot`
through a `Reply`, all of them at once and with a timeout, so one stuck actor costs one
timeout and is listed as `unresponsive` instead of hanging the page.

`GET /metrics` sits on the main app instead, without a token: its counters hold no person
key, no text and no secret.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import orjson
import pykka
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from actors.directory import ConversationGone, LiveConversation
from actors.messages import Attach, Snapshot
from actors.runtime import ActorFailed, Reply
from actors.supervisor import SweepHistory, Sweeps
from storage.records import Turn
from transport.admin_listing import actor_query
from transport.admin_nodes import iso, nodes_handler, owner, rounded, unknown_person
from transport.admin_view import add_view, is_view_path
from transport.config import Settings
from transport.errors import error_response, json_errors
from transport.logs import AccessLogger
from transport.query import InvalidField
from transport.server import SERVER_KEY, Server

log = logging.getLogger("stillhere.admin")

# How long an actor (or the supervisor) has to answer before it is called unresponsive.
SNAPSHOT_TIMEOUT = 2.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- the listener -------------------------------------------------------------------------


async def start_admin(server: Server) -> web.AppRunner | None:
    """Start the admin listener if an admin token is configured; None if it is off."""
    settings = server.settings
    if not settings.admin_token:
        return None
    check_admin_host(settings)
    runner = web.AppRunner(
        build_admin_app(server, settings.admin_token), access_log_class=AccessLogger
    )
    await runner.setup()
    tls = server.certificate.context if server.certificate and settings.admin_tls else None
    try:
        await web.TCPSite(runner, settings.admin_host, settings.admin_port, ssl_context=tls).start()
    except OSError:
        await runner.cleanup()
        raise
    server.admin_port = runner.addresses[0][1]  # its URL is in the line `serve` logs
    if not is_loopback(settings.admin_host):
        log.warning(
            "the admin API listens beyond loopback (%s, --admin-remote on): "
            "it shows what people said",
            settings.admin_host,
        )
    return runner


class AdminExposed(ValueError):
    """The admin listener was asked to listen beyond loopback without --admin-remote on."""


def check_admin_host(settings: Settings) -> None:
    """Refuse a non-loopback admin address unless `--admin-remote on` says it is meant: the
    admin API shows what people said, so exposing it takes two deliberate options."""
    if settings.admin_token and not settings.admin_remote and not is_loopback(settings.admin_host):
        raise AdminExposed(
            f"--admin-host {settings.admin_host} is not a loopback address; the admin API "
            "shows what people said: add --admin-remote on to listen there anyway"
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_admin_app(server: Server, token: str) -> web.Application:
    # JSON errors outermost: the bearer check's refusals and its own failures are JSON too.
    answer_json = json_errors("the admin API is under /admin/actors")
    app = web.Application(middlewares=[answer_json, _bearer(token)])
    app[SERVER_KEY] = server
    app.router.add_get("/admin/actors", actors_handler)
    app.router.add_get("/admin/actors/{person}", actor_handler)
    app.router.add_get("/admin/actors/{person}/turns", turns_handler)
    app.router.add_get("/admin/sweeps", sweeps_handler)
    app.router.add_get("/admin/nodes", nodes_handler)
    app.router.add_get("/admin/metrics", metrics_handler)
    add_view(app)
    return app


def _bearer(token: str) -> Any:
    """Refuse any request without the admin token, before routing (nothing can be probed);
    but for the live view's own files, which hold no data: the page asks for the token."""
    expected = token.encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_view_path(request.path):
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            return error_response(
                401,
                "unauthorized",
                "send the admin token as Authorization: Bearer <token>",
                headers={"WWW-Authenticate": 'Bearer realm="stillhere-admin"'},
            )
        return await handler(request)

    return check


# -- endpoints ----------------------------------------------------------------------------


async def actors_handler(request: web.Request) -> web.Response:
    """`GET /admin/actors`: one row per live actor, the most recently active first; or the
    page `?q=&state=&sort=&limit=&offset=` ask for (transport/admin_listing.py)."""
    try:
        query = actor_query(request.query)
    except InvalidField as wrong:
        return error_response(400, "invalid_field", str(wrong))
    server = request.app[SERVER_KEY]
    lives = server.directory.lives()
    looks = await _looks(lives)
    now = server.runtime.clock.now()
    rows = [_Row(live, look, now) for live, look in zip(lives, looks, strict=True)]
    return _json({"at": now.isoformat(), **query.page(rows)})


async def actor_handler(request: web.Request) -> web.Response:
    """`GET /admin/actors/{person}`: one actor's whole state, by hashed person key, and
    which node owns the person (this one, unless it was just taken from it)."""
    server = request.app[SERVER_KEY]
    person = request.match_info["person"]
    live = server.directory.get(person)
    if live is None:
        return await unknown_person(request, person)
    look = await _look(live)
    detail = _detail(live, look, server.runtime.clock.now())
    # The mood is the person's, kept in the database beside the conversation: read, not asked.
    detail["fondness"] = await server.runtime.store.moods.fondness(live.person)
    detail["owner"] = await owner(request, person)
    return _json(detail)


async def turns_handler(request: web.Request) -> web.Response:
    """`GET /admin/actors/{person}/turns`: the traces of the conversation's last turns,
    oldest first. They live on the loop side, beside the stream: no actor is asked."""
    person = request.match_info["person"]
    live = request.app[SERVER_KEY].directory.get(person)
    if live is None:
        return await unknown_person(request, person)
    turns = live.stream.traces.wire()
    return _json({"person": live.person, "conversation": str(live.id), "turns": turns})


async def sweeps_handler(request: web.Request) -> web.Response:
    """`GET /admin/sweeps`: the supervisor's last sweeps and how many actors it replaced."""
    server = request.app[SERVER_KEY]
    reply = Reply(asyncio.get_running_loop())
    try:
        server.supervisor.tell(Sweeps(reply))
        history: SweepHistory = await reply.wait(SNAPSHOT_TIMEOUT)
    except (pykka.ActorDeadError, TimeoutError):
        return error_response(503, "unresponsive", "the supervisor did not answer in time")
    return _json(
        {
            "interval_s": server.settings.sweep_interval,
            "sweeping": history.sweeping,
            "replaced": history.replaced,
            "sweeps": history.sweeps,
        }
    )


async def metrics_handler(request: web.Request) -> web.Response:
    """`GET /metrics` on the main app, and `GET /admin/metrics` for the live view (a page
    on the admin listener may only read its own origin): Prometheus text format, this
    server's registry."""
    metrics = request.app[SERVER_KEY].runtime.metrics
    return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})


# -- looking at an actor ------------------------------------------------------------------


async def _looks(lives: list[LiveConversation]) -> list[Snapshot | str]:
    """What `_look` gives for each, the actors whose published snapshot is stale asked all
    at once; the others cost no task and no message (thousands of them, every page). A
    deactivated conversation is listed `inactive`, not activated to be looked at: only
    the page of one conversation activates it."""
    looks: list[Snapshot | str | None] = [
        _published(live) if live.active else "inactive" for live in lives
    ]
    stale = [i for i, look in enumerate(looks) if look is None]
    asked = await asyncio.gather(*(_ask(lives[i]) for i in stale))
    for i, look in zip(stale, asked, strict=True):
        looks[i] = look
    return [look for look in looks if look is not None]


async def _look(live: LiveConversation) -> Snapshot | str:
    """The actor's snapshot, or the state to show instead: `stopped` (no actor is running:
    it is being archived or parked, or replaced after a failure) or `unresponsive` (it did
    not answer in time, or failed answering)."""
    return _published(live) or await _ask(live)


def _published(live: LiveConversation) -> Snapshot | None:
    """The snapshot the actor published after its last message, if it is running and has
    handled every message told to it (it would answer the same); else None: ask it."""
    current = live.current_snapshot()
    if current is not None and live.ref is not None and live.ref.is_alive():
        return current
    return None


async def _ask(live: LiveConversation) -> Snapshot | str:
    try:
        snapshot: Snapshot = await live.ask(Attach, timeout=SNAPSHOT_TIMEOUT)
    except ConversationGone:
        return "stopped"
    except (ActorFailed, TimeoutError):
        return "unresponsive"
    return snapshot


class _Row:
    """A row of the list: its columns to filter and sort by, and its JSON (`wire`), made
    only for the rows of the page asked for, of thousands sorted."""

    __slots__ = ("age_s", "idle_s", "links", "live", "pending", "person", "snap", "state")

    def __init__(self, live: LiveConversation, look: Snapshot | str, now: datetime) -> None:
        snap = look if isinstance(look, Snapshot) else None
        self.live, self.snap, self.person = live, snap, live.person
        self.state = snap.state if snap else look
        self.age_s = (now - snap.started_at).total_seconds() if snap else None
        self.idle_s = (now - snap.last_activity).total_seconds() if snap else None
        self.links = len(live.stream.links)
        self.pending = snap.pending if snap else None

    @property
    def conversation(self) -> str:
        return str(self.live.id)

    @property
    def window(self) -> int | None:
        return len(self.snap.history) if self.snap else None

    def wire(self) -> dict[str, Any]:
        """The row as the API answers it; the actor's fields are null when it did not answer."""
        snap = self.snap
        return {
            "person": self.person,
            "conversation": self.conversation,
            "state": self.state,
            "age_s": rounded(self.age_s),
            "last_activity": snap.last_activity.isoformat() if snap else None,
            "idle_s": rounded(self.idle_s),
            "links": self.links,
            "pending": self.pending,
            "window": self.window,
        }


def _detail(live: LiveConversation, look: Snapshot | str, now: datetime) -> dict[str, Any]:
    """The whole state: the row's fields, then the actor's state in full, then its stream
    (loop side, so shown even when the actor does not answer)."""
    snap = look if isinstance(look, Snapshot) else None
    stream = live.stream
    return {
        **_Row(live, look, now).wire(),
        "started_at": snap.started_at.isoformat() if snap else None,
        "speaker": snap.speaker if snap else None,
        "speaker_at": iso(snap.speaker_at) if snap else None,
        "during_reply": snap.during_reply if snap else None,
        "after_interrupt": snap.after_interrupt if snap else None,
        "window": [_turn(t) for t in snap.history] if snap else None,
        "pending": [_turn(t) for t in snap.pending_turns] if snap else None,
        "cards": [c.wire() for c in snap.cards] if snap else None,
        "stream": {
            "last_seq": stream.last_seq,
            "buffered": stream.buffered,
            "links": sorted(link.name for link in stream.links),
        },
    }


def _turn(turn: Turn) -> dict[str, Any]:
    return {**turn.wire(), "interrupted": turn.interrupted, "client_id": turn.client_id}


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")
