"""The aiohttp application: routes, and the start-up and shut-down of everything behind them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from functools import partial
from random import Random
from typing import Any

import asyncpg
from aiohttp import web

from actors.clock import Clock, SystemClock
from actors.directory import Directory, stop_actors
from actors.memory.same_memory import SameMemoryJudge
from actors.memory.setup import close_keeper, make_embedder, open_keeper, warm
from actors.metrics import Metrics
from actors.ownership import Ownership
from actors.persona import DEFAULT as DEFAULT_PERSONA
from actors.persona import Persona
from actors.pooled import ActorPool
from actors.runtime import ContextSettings, ConversationSettings, Runtime
from actors.supervisor import Supervisor, Sweep
from providers.analysis import Analysis, AnalysisModel, FailureHook
from providers.background import in_background
from providers.chat import ChatModel
from providers.collector import paced_collector, timed_collections, tune_collector
from providers.compute import limit_compute_threads
from providers.gil import switch_interval
from providers.loop_lag import loop_lag_probe
from providers.openai import OpenAIChat
from providers.rehearsal import RehearsalModel
from providers.rehearsal_analysis import RehearsalAnalysis
from storage.embedded import EmbeddedPostgres
from storage.notices import Notices
from storage.store import Store
from transport.admin import metrics_handler, start_admin
from transport.config import Settings, collector_pace, node_name, without_password
from transport.errors import DISK_SPACE_KEY, json_errors
from transport.forwarded import forwarded, strict_transport
from transport.health import add_routes as add_health_routes
from transport.identity import Identity, load_or_create_secret
from transport.listener import StartupError, reason
from transport.logs import AccessLogger
from transport.memory_api import add_routes as add_memory_routes
from transport.origin import normalise, origin_check
from transport.revocations import RevocationWatch
from transport.rules_api import add_routes as add_rule_routes
from transport.server import SERVER_KEY, Server, close_links, close_revoked
from transport.sse import events_handler, interrupt_handler, leave_handler, say_handler
from transport.threads_api import add_routes as add_thread_routes
from transport.tls import Certificate
from transport.web_app import add_routes as add_web_app_routes
from transport.websocket import keep_pinging, websocket_handler

log = logging.getLogger("stillhere.server")


def make_model(settings: Settings) -> ChatModel:
    if settings.llm_url:
        return OpenAIChat(
            settings.llm_url,
            settings.llm_model,
            settings.llm_key,
            read_timeout=settings.llm_timeout,
        )
    log.warning("no --llm-url given: answering with the built-in REHEARSAL model, not a real one")
    return RehearsalModel(latency=settings.rehearsal_latency, tokens_per_s=settings.rehearsal_rate)


def make_analysis(settings: Settings, on_failure: FailureHook) -> Analysis:
    url = settings.analysis_url or settings.llm_url
    if url:
        return AnalysisModel(
            url,
            settings.analysis_model or settings.llm_model,
            settings.analysis_key or settings.llm_key,
            timeout=settings.analysis_timeout,
            on_failure=on_failure,
        )
    log.warning("no --analysis-url nor --llm-url: analysing with the built-in REHEARSAL analysis")
    return RehearsalAnalysis()


def announce_persona(settings: Settings) -> Persona:
    """The persona `--persona` read (or the default), said in the log."""
    persona = settings.persona or DEFAULT_PERSONA
    log.info(
        "persona %s: energy %.2f, curiosity %.2f, warmth %.2f; follow-ons %s",
        persona.name,
        persona.energy,
        persona.curiosity,
        persona.warmth,
        settings.follow_ons,
    )
    return persona


def conversation_settings(settings: Settings) -> ConversationSettings:
    return ConversationSettings(
        window_turns=settings.window_turns,
        resume_window_s=settings.resume_window,
        speaker_reset_s=settings.speaker_reset,
        park_after_s=settings.park_after,
        actor_idle_s=settings.actor_idle,
        store_timeout_s=settings.store_timeout,
        max_reply_chars=settings.max_reply_chars,
        interrupt_words=settings.interrupt_words,
        delta_window_s=settings.delta_window,
        echo_guard=settings.echo_guard,
        reply_matching=settings.reply_matching,
        reply_candidates=settings.reply_candidates,
        reply_horizon_s=settings.reply_horizon,
        follow_ons=settings.follow_ons,
        context=ContextSettings(
            budget_chars=settings.context_budget,
            source_timeout_s=settings.context_timeout,
            cache_s=settings.context_cache,
        ),
    )


def build_app(
    settings: Settings, clock: Clock | None = None, certificate: Certificate | None = None
) -> web.Application:
    """The app; `certificate`: the listeners' TLS, when `serve` has one (the admin API's)."""
    extra = frozenset(map(normalise, settings.allowed_origins))
    app = web.Application(
        client_max_size=settings.limits.max_frame_bytes * 4,
        middlewares=[
            forwarded(settings.trusted_proxies),
            json_errors("the endpoints are listed in docs/protocol.md"),
            origin_check(extra),
        ],
    )
    app.cleanup_ctx.append(partial(_lifecycle, settings, clock or SystemClock(), certificate))
    app.on_shutdown.append(close_links)
    app.on_response_prepare.append(strict_transport)
    app.router.add_get("/v1/ws", websocket_handler)
    app.router.add_get("/v1/events", events_handler)
    app.router.add_post("/v1/say", say_handler)
    app.router.add_post("/v1/interrupt", interrupt_handler)
    app.router.add_post("/v1/leave", leave_handler)
    app.router.add_get("/metrics", metrics_handler)
    add_health_routes(app.router)
    add_memory_routes(app.router)
    add_rule_routes(app.router)
    add_thread_routes(app.router)
    add_web_app_routes(app.router)
    return app


def runner_options(settings: Settings) -> dict[str, Any]:
    """How aiohttp's runner serves the app (`serve`, and the tests' server): the access
    log that never writes a query string, and how long a connection may go without a whole
    request (`--http-idle-timeout`: a slowloris client is closed then, however it trickles,
    as aiohttp never pushes that deadline back for a partial request)."""
    return {
        "access_log_class": AccessLogger,
        "keepalive_timeout": settings.limits.http_idle_timeout,
    }


def listening_line(server: Server, port: int) -> str:
    """Where a client finds this server, and a browser its live view (the admin listener's
    root, which asks for the token), in one line."""
    settings = server.settings
    main = _authority(settings.host, port)
    http, ws = ("https", "wss") if server.certificate is not None else ("http", "ws")
    where = (
        f"listening on {http}://{main}/ "
        f"(WebSocket {ws}://{main}/v1/ws, events {http}://{main}/v1/events), "
    )
    if server.admin_port is None:
        return where + "admin off (no --admin-token)"
    admin = "https" if server.certificate is not None and settings.admin_tls else "http"
    return where + f"live view {admin}://{_authority(settings.admin_host, server.admin_port)}/"


def log_listening(app: web.Application, port: int) -> None:
    """Log `listening_line` once the main port accepts (the admin API started before it)."""
    log.info("%s", listening_line(app[SERVER_KEY], port))


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address: bracketed


async def _lifecycle(
    settings: Settings, clock: Clock, certificate: Certificate | None, app: web.Application
) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    limit_compute_threads(settings.compute_threads)
    tune_collector(settings.gc_thresholds)
    embedded = None
    dsn = settings.db
    if dsn is None:
        embedded = await loop.run_in_executor(None, EmbeddedPostgres, settings.data_dir)
        dsn = embedded.dsn
    store = await open_store(dsn, embedded is not None)
    model = make_model(settings)
    embedder = make_embedder(
        settings.embed_url,
        settings.embed_model,
        settings.embed_key,
        path=settings.embed_path,
        timeout=settings.embed_timeout,
        local=settings.embed_local,
    )
    memory = await open_keeper(dsn, embedder, clock, fingerprint_wait=settings.fingerprint_wait)
    await warm(embedder)
    metrics = Metrics()
    analysis = make_analysis(settings, metrics.count_analysis_failure)
    memory.same_memory = SameMemoryJudge(analysis, memory)
    persona = announce_persona(settings)
    # Made last before the block that stops it, so no failure leaves its threads behind.
    pool = ActorPool(settings.actor_threads) if settings.actor_threads else None
    rt = Runtime(
        loop,
        store,
        model,
        clock,
        conversation_settings(settings),
        metrics=metrics,
        memory=memory,
        analysis=analysis,
        persona=persona,
        random=Random(settings.follow_on_seed),
        actor_pool=pool,
    )
    admin: web.AppRunner | None = None
    try:
        notices = Notices(dsn)
        ownership = Ownership(store.pool, notices, node_name(settings), settings.lease)
        directory = Directory(rt, ownership)
        memory.on_withdrawn = directory.withdraw
        secret = settings.secret or load_or_create_secret(settings.data_dir)
        revocations = RevocationWatch(notices, partial(close_revoked, directory))
        listening = await notices.open()
        identity = Identity(secret, revocations.revoked)
        # Started last: only the block below stops it, and a thread left running would
        # keep the process from exiting after a start that failed.
        supervisor = Supervisor.start(rt, directory)
        app[SERVER_KEY] = Server(
            settings, rt, identity, directory, supervisor, certificate=certificate
        )
        app[DISK_SPACE_KEY] = store.space
        with (
            switch_interval(settings.switch_interval),
            timed_collections(rt.metrics.observe_collection),
        ):
            async with (
                paced_collector(collector_pace(settings)),
                loop_lag_probe(rt.metrics.loop_lag_seconds.observe),
                in_background(notices.keep(listening)),
                in_background(ownership.keep()),
                in_background(directory.keep_deactivating()),
                in_background(keep_pinging(app[SERVER_KEY])),
                in_background(_revive(embedded)),
            ):
                try:  # inside: a busy admin port still cleans up
                    async with in_background(_tick(supervisor, settings.sweep_interval)):
                        admin = await _start_admin(app[SERVER_KEY])
                        log.info(
                            "stillhere ready as node %s, model: %s, analysis: %s",
                            ownership.node,
                            model.label,
                            analysis.label,
                        )
                        yield
                # The sweeps' ticks have stopped, not yet the node's hold on its people and
                # its ear for other nodes: the conversations are handed over meanwhile.
                finally:
                    if admin is not None:
                        await admin.cleanup()
                    await stop_actors([supervisor])
                    await directory.stop_all(settings.drain_timeout)
                    await ownership.stop()
    finally:
        if pool is not None:
            pool.stop()  # after every actor: what they were told is served first
        await model.close()
        await close_keeper(memory)  # first: the same-memory judge's last pair asks analysis
        await analysis.close()
        await store.close()
        if embedded is not None:
            await loop.run_in_executor(None, embedded.stop)


async def open_store(dsn: str, embedded: bool) -> Store:
    """The store on `dsn`; StartupError, naming `--db` (or the data dir for the embedded
    PostgreSQL), when the DSN is malformed or PostgreSQL cannot be reached or refuses."""
    where = "the embedded PostgreSQL of --data-dir" if embedded else f"--db {without_password(dsn)}"
    try:
        return await Store.open(dsn)
    except asyncpg.ClientConfigurationError as malformed:
        raise StartupError(
            f"{where} is not a PostgreSQL DSN ({malformed}); "
            "pass one such as postgresql://user:password@host:5432/database"
        ) from malformed
    except (OSError, TimeoutError) as unreachable:
        raise StartupError(
            f"cannot reach PostgreSQL at {where} ({reason(unreachable)}); "
            "start PostgreSQL there, or correct --db"
        ) from unreachable
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as refused:
        raise StartupError(f"PostgreSQL at {where} refused: {refused}; correct --db") from refused


async def _start_admin(server: Server) -> web.AppRunner | None:
    """The admin listener; StartupError naming its options when its port cannot be bound."""
    try:
        return await start_admin(server)
    except OSError as failed:
        settings = server.settings
        raise StartupError(
            f"cannot listen on {settings.admin_host}:{settings.admin_port} (--admin-host, "
            f"--admin-port): {reason(failed)}; stop what uses that port, or choose "
            "another --admin-port"
        ) from failed


# How often the embedded PostgreSQL is checked for having stopped on its own: a look at its
# pid file, so cheap; short, as says are answered `unavailable` meanwhile. A start that
# fails (the wheel logs PostgreSQL's whole log each time) is tried again less and less often.
REVIVE_INTERVAL_S = 1.0
REVIVE_MAX_WAIT_S = 60.0


async def _revive(embedded: EmbeddedPostgres | None) -> None:
    """Start the embedded PostgreSQL again whenever it stopped on its own (a full disk).
    A server on an outside PostgreSQL (`--db`) leaves that to whoever runs it."""
    if embedded is None:
        return
    loop = asyncio.get_running_loop()
    wait = REVIVE_INTERVAL_S
    while True:
        await asyncio.sleep(wait)
        started = await loop.run_in_executor(None, embedded.revive)
        wait = REVIVE_INTERVAL_S if started else min(2 * wait, REVIVE_MAX_WAIT_S)


async def _tick(supervisor: object, interval: float) -> None:
    """Tell the supervisor to sweep every `interval` seconds."""
    while True:
        await asyncio.sleep(interval)
        supervisor.tell(Sweep())  # type: ignore[attr-defined]
