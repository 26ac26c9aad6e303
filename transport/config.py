"""Settings of `stillhere serve`: command-line options, each also an env var STILLHERE_<NAME>."""

from __future__ import annotations

import argparse
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from actors.clock import parse_duration
from actors.follow_on import MODES as FOLLOW_ON_MODES
from actors.memory.keeper import DEFAULT_FINGERPRINT_WAIT_S
from actors.persona import Persona, PersonaError, load_persona
from actors.runtime import (
    DEFAULT_DELTA_WINDOW_S,
    DEFAULT_INTERRUPT_WORDS,
    DEFAULT_MAX_REPLY_CHARS,
    DEFAULT_STORE_TIMEOUT_S,
)
from providers.analysis import DEFAULT_TIMEOUT_S as DEFAULT_ANALYSIS_TIMEOUT_S
from providers.collector import DEFAULT as COLLECTOR_DEFAULT
from providers.collector import Pace, parse_thresholds
from providers.embedding import DEFAULT_TIMEOUT_S as DEFAULT_EMBED_TIMEOUT_S
from providers.event_loop import LOOPS
from providers.gil import DEFAULT_S as SWITCH_INTERVAL_DEFAULT


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number of at least 1, not {text!r}")
    return value


def _at_least_zero(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"needs a whole number of at least 0, not {text!r}")
    return value


def _rate(text: str) -> float:
    """A rate per second: a finite number of at least 0 (0: no limit)."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"needs a number of at least 0, not {text!r}")
    return value


def _gc_thresholds(text: str) -> tuple[int, int, int]:
    try:
        return parse_thresholds(text)
    except ValueError as wrong:
        raise argparse.ArgumentTypeError(str(wrong)) from None


def _local_embedder(text: str) -> str:
    if text not in ("pair", "minilm", "use"):
        raise argparse.ArgumentTypeError("pair, minilm or use")
    return text


def longer_than_zero(text: str) -> float:
    seconds = parse_duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"needs a duration above 0, not {text!r}")
    return seconds


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"needs on or off, not {text!r}")
    return text == "on"


def _persona_file(text: str) -> Persona:
    """The persona in a file, read here and only here: a bad one stops the start with its
    reason."""
    try:
        return load_persona(Path(text))
    except PersonaError as wrong:
        raise argparse.ArgumentTypeError(str(wrong)) from None


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip().lower() for w in text.split(",") if w.strip())


def _origins(text: str) -> tuple[str, ...]:
    """Web origins (`https://app.example.org`), comma-separated: scheme and host, no path."""
    origins = []
    for raw in _words(text):
        origin = raw.rstrip("/")
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
            raise argparse.ArgumentTypeError(
                f"an origin is scheme://host[:port], such as https://app.example.org, not {raw!r}"
            )
        origins.append(origin)
    return tuple(origins)


@dataclass(frozen=True, slots=True)
class Limits:
    """Protocol limits, documented in docs/protocol.md."""

    max_frame_bytes: int = 64 * 1024
    max_text_chars: int = 4000
    max_id_chars: int = 128
    frames_per_s: float = 20.0
    frame_burst: int = 40
    # Bytes a link may hold for a phone that does not read (frames queued and the socket's
    # buffer); past it the link is closed (4503). A whole reply is a few KB.
    link_buffer: int = 1024 * 1024
    hello_timeout: float = 10.0  # from connecting to a successful hello (4408)
    max_links_per_address: int = 0  # open links from one IP address; 0: no limit
    # New links one IP address may open, sustained per second and at once: a hello flood
    # from one address costs a refused request each past them. 0: no limit.
    links_per_s_per_address: float = 0.0
    link_burst_per_address: int = 20
    max_links_per_person: int = 8  # over it, the person's oldest link is closed (4429)
    # A connection that has not sent a whole request this long after it opened, or after
    # its last answer, is closed (aiohttp's keep-alive timeout): a slow client cannot hold
    # one. Above aiohttp clients' own 15 s, so they close their idle connections first.
    http_idle_timeout: float = 30.0
    socket_send_buffer: int = 0  # SO_SNDBUF of each connection; 0: the kernel sizes it


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8765
    # Connections the kernel holds while the loop is busy: when every phone of a cell comes
    # back at once, aiohttp's default 128 overflows and the rest retry SYN after 1 s, 3 s...
    backlog: int = 4096
    data_dir: Path = Path(".stillhere")
    db: str | None = field(default=None, repr=False)  # a DSN may hold a password
    llm_url: str | None = None
    llm_model: str = "gpt-4o-mini"
    llm_key: str | None = field(default=None, repr=False)  # a secret: never shown
    llm_timeout: float = 60.0
    # The analysis model; unset, the chat model's url, model and key (providers/analysis.py).
    analysis_url: str | None = None
    analysis_model: str | None = None
    analysis_key: str | None = field(default=None, repr=False)  # a secret: never shown
    analysis_timeout: float = DEFAULT_ANALYSIS_TIMEOUT_S
    reply_matching: bool = True
    reply_candidates: int = 8
    reply_horizon: float = 2 * 24 * 3600
    rehearsal_latency: float = 0.3
    rehearsal_rate: float = 20.0  # a reader's pace: a reply can be stopped
    delta_window: float = DEFAULT_DELTA_WINDOW_S
    echo_guard: bool = True
    persona: Persona | None = None  # from --persona's file; None: the default (actors/persona.py)
    follow_ons: str = "auto"
    follow_on_seed: int | None = None  # None: seeded by the system
    resume_window: float = 30 * 60
    sweep_interval: float = 5 * 60
    park_after: float = 10 * 60
    speaker_reset: float = 30 * 60
    window_turns: int = 40
    context_budget: int = 6000
    context_timeout: float = 0.5
    store_timeout: float = DEFAULT_STORE_TIMEOUT_S
    max_reply_chars: int = DEFAULT_MAX_REPLY_CHARS
    context_cache: float = 60.0
    interrupt_words: tuple[str, ...] = DEFAULT_INTERRUPT_WORDS
    # Web origins besides the server's own whose pages may open links and write (origin.py).
    allowed_origins: tuple[str, ...] = ()
    secret: str | None = field(default=None, repr=False)  # a secret: never shown
    log_format: str = "text"
    embed_url: str | None = None
    embed_model: str | None = None
    embed_key: str | None = field(default=None, repr=False)  # a secret: never shown
    embed_path: str | None = None
    embed_local: str = "pair"  # without embed_url: pair, minilm or use
    embed_timeout: float = DEFAULT_EMBED_TIMEOUT_S
    fingerprint_wait: float = DEFAULT_FINGERPRINT_WAIT_S
    admin_token: str | None = field(default=None, repr=False)  # a secret: never shown
    admin_host: str = "127.0.0.1"
    admin_port: int = 8766
    admin_remote: bool = False  # may the admin API listen beyond loopback?
    compute_threads: int = 1
    event_loop: str = "uvloop"
    switch_interval: float = SWITCH_INTERVAL_DEFAULT
    gc_young_every: float = Pace().young_every_s
    gc_full_every: float = Pace().full_every_s
    gc_thresholds: tuple[int, int, int] = COLLECTOR_DEFAULT
    # Nodes sharing one --db (docs/architecture.md, "Several nodes"): this one's name, how
    # long its hold on a conversation lasts unrenewed, and how long SIGTERM waits to hand
    # every conversation over before the process exits.
    node_id: str | None = None  # None: the host name and --port
    lease: float = 6.0
    drain_timeout: float = 10.0
    drain_notice: float = 2.5  # while a balancer watches /readyz (transport/drain.py)
    limits: Limits = field(default_factory=Limits)


# (name, type, help); the default comes from Settings.
_OPTIONS: list[tuple[str, object, str]] = [
    ("host", str, "address to listen on"),
    ("port", int, "port to listen on"),
    ("backlog", int, "connections waiting to be accepted (capped by net.core.somaxconn)"),
    ("data-dir", Path, "folder for the embedded PostgreSQL and the signing secret"),
    ("db", str, "PostgreSQL DSN; without it an embedded PostgreSQL runs in the data dir"),
    ("llm-url", str, "OpenAI-compatible API base URL; without it, the rehearsal model"),
    ("llm-model", str, "model name sent to the chat API"),
    ("llm-key", str, "API key for the chat API"),
    ("llm-timeout", parse_duration, "read timeout of a chat API call"),
    ("analysis-url", str, "analysis model's API base URL; default --llm-url, else rehearsal"),
    ("analysis-model", str, "model name sent to the analysis API; default --llm-model"),
    ("analysis-key", str, "API key for the analysis API; default --llm-key"),
    ("analysis-timeout", longer_than_zero, "longest wait for an analysis answer, in all"),
    (
        "reply-matching",
        _on_off,
        "on or off: match each say to the message it answers, note loose ends (off: none)",
    ),
    ("reply-candidates", positive, "assistant messages a say may be matched to, at most"),
    ("reply-horizon", longer_than_zero, "assistant messages older than this are no candidates"),
    ("rehearsal-latency", parse_duration, "rehearsal model: pause before its first word"),
    ("rehearsal-rate", float, "rehearsal model: words per second (0: no pause)"),
    ("delta-window", parse_duration, "a reply's pieces this close together share one delta"),
    ("echo-guard", _on_off, "on or off: cut a reply's opening repetition of recent messages"),
    ("persona", _persona_file, "TOML file: name, energy, curiosity, warmth (none: the default)"),
    ("follow-ons", str, "after a lull: auto (the persona and mood decide), always or off"),
    ("follow-on-seed", int, "seed of the follow-on draw, for runs that repeat (none: any)"),
    ("resume-window", parse_duration, "a conversation idle longer than this is archived"),
    ("sweep-interval", parse_duration, "how often idle conversations are swept"),
    ("park-after", parse_duration, "stop an actor with no link attached for this long"),
    ("speaker-reset", parse_duration, "silence after which the speaker is the owner again"),
    ("window-turns", int, "recent turns kept in the conversation's window"),
    ("context-budget", int, "characters of context (past talks, memories, rules) per turn"),
    ("context-timeout", parse_duration, "time each context source may take before it is left out"),
    (
        "context-cache",
        parse_duration,
        "longest reuse of a person's context reads while none changed (0: off)",
    ),
    (
        "store-timeout",
        longer_than_zero,
        "longest a say waits for PostgreSQL; past it the say is answered unavailable",
    ),
    ("max-reply-chars", positive, "a reply longer than this is cut, ending with error too_long"),
    ("interrupt-words", _words, "comma-separated short messages that cut a reply off"),
    (
        "allowed-origins",
        _origins,
        "comma-separated web origins, besides the server's own, whose pages may use the API",
    ),
    ("secret", str, "signs account tokens; made once and kept in the data dir if absent"),
    ("log-format", str, "text or json"),
    ("embed-url", str, "OpenAI-compatible embeddings API base URL; without it, local MiniLM"),
    ("embed-model", str, "model name sent to the embeddings API"),
    ("embed-key", str, "API key for the embeddings API"),
    ("embed-path", str, "folder of the local all-MiniLM-L6-v2 weights"),
    ("embed-local", _local_embedder, "without --embed-url: pair (default), minilm or use"),
    ("embed-timeout", longer_than_zero, "longest wait for one embeddings API answer"),
    (
        "fingerprint-wait",
        parse_duration,
        "longest a memory being stored waits for its fingerprint; later, it is filled in after",
    ),
    ("node-id", str, "this node's name among the nodes sharing --db (none: host name:port-random)"),
    (
        "lease",
        longer_than_zero,
        "a node's hold on a conversation, unrenewed, ends after this (a hung node's people move)",
    ),
    (
        "drain-timeout",
        longer_than_zero,
        "on SIGTERM, the longest wait to hand every conversation over before exiting",
    ),
    (
        "drain-notice",
        parse_duration,
        "on SIGTERM, how long /readyz fails before conversations are handed over, when a "
        "load balancer has been asking it",
    ),
    ("admin-token", str, "turns the admin API on; clients send it as a Bearer token"),
    ("admin-host", str, "address the admin API listens on"),
    ("admin-port", int, "port the admin API listens on"),
    ("admin-remote", _on_off, "on: let --admin-host be a non-loopback address"),
    ("event-loop", str, "uvloop (faster) or asyncio (the standard library's loop)"),
    (
        "switch-interval",
        longer_than_zero,
        "how long a thread may keep the GIL once another waits for it",
    ),
    (
        "gc-young-every",
        parse_duration,
        "freeze the young objects this often, sampled ones collected first (0: CPython decides)",
    ),
    ("gc-full-every", longer_than_zero, "collect all objects, frozen too, this often"),
    (
        "gc-thresholds",
        _gc_thresholds,
        "CPython's generation 0, 1, 2 thresholds, while starting and at --gc-young-every 0",
    ),
    (
        "compute-threads",
        positive,
        "threads numpy and faiss may each use (more only slows the loop)",
    ),
]
_CHOICES = {
    "log-format": ["text", "json"],
    "event-loop": list(LOOPS),
    "follow-ons": list(FOLLOW_ON_MODES),
}
# Their values (perhaps from the environment) are never printed, not even by --help.
_SECRET_OPTIONS = frozenset({"secret", "llm-key", "analysis-key", "admin-token", "embed-key"})
_LIMIT_OPTIONS: list[tuple[str, object, str]] = [
    ("max-frame-bytes", int, "largest client frame accepted"),
    ("max-text-chars", int, "longest say text accepted"),
    ("max-id-chars", int, "longest say id accepted"),
    ("frames-per-s", float, "sustained client frames per second per link"),
    ("frame-burst", int, "client frames allowed in a burst per link"),
    ("link-buffer", positive, "bytes held for a link whose phone stopped reading, at most"),
    ("hello-timeout", longer_than_zero, "time from connecting to a successful hello"),
    ("max-links-per-address", _at_least_zero, "open links from one IP address (0: no limit)"),
    (
        "links-per-s-per-address",
        _rate,
        "new links one IP address may open per second, sustained (0: no limit)",
    ),
    ("link-burst-per-address", positive, "new links one IP address may open at once"),
    ("max-links-per-person", positive, "open links of one person; more close the oldest"),
    (
        "http-idle-timeout",
        longer_than_zero,
        "a connection without a whole request this long after opening or answering is closed",
    ),
    (
        "socket-send-buffer",
        _at_least_zero,
        "kernel send buffer of each connection, in bytes (0: the kernel sizes it)",
    ),
]


def env_value(name: str) -> str | None:
    return os.environ.get("STILLHERE_" + name.upper().replace("-", "_"))


def without_password(dsn: str) -> str:
    """The DSN as it may be shown: its password, if any, replaced by `***`."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def add_options(parser: argparse.ArgumentParser) -> None:
    for name, kind, help_ in _OPTIONS + _LIMIT_OPTIONS:
        attr = name.replace("-", "_")
        source = Limits() if (name, kind, help_) in _LIMIT_OPTIONS else Settings()
        default = getattr(source, attr)
        env = env_value(name)
        if env is not None:
            default = kind(env)  # type: ignore[operator]
        choices = _CHOICES.get(name)
        shown = default if not isinstance(default, tuple) else ",".join(map(str, default))
        if shown == "":
            shown = "none"
        if isinstance(default, bool):
            shown = "on" if default else "off"
        if name in _SECRET_OPTIONS:
            shown = "none" if default is None else "set, not shown"
        if name == "db" and default:
            shown = without_password(default)
        parser.add_argument(
            f"--{name}",
            type=kind,
            default=default,
            choices=choices,  # type: ignore[arg-type]
            help=f"{help_} (env STILLHERE_{attr.upper()}, default {shown})",
        )


def settings_from(args: argparse.Namespace) -> Settings:
    limit_names = {n.replace("-", "_") for n, _, _ in _LIMIT_OPTIONS}
    values = vars(args)
    limits = Limits(**{k: values[k] for k in limit_names})
    fields = {n.replace("-", "_") for n, _, _ in _OPTIONS}
    return Settings(**{k: values[k] for k in fields}, limits=limits)


def node_name(settings: Settings) -> str:
    """This node's name: `--node-id`, else the host name and port with a suffix drawn at
    start-up, so that servers sharing a port setting (tests, benches in one process) never
    collide; a node that restarts under a new name still gets its people back at once, as
    its old name's lock went with its old process."""
    return settings.node_id or f"{socket.gethostname()}:{settings.port}-{secrets.token_hex(3)}"


def collector_pace(settings: Settings) -> Pace:
    return Pace(settings.gc_young_every, settings.gc_full_every)


def add_db_options(parser: argparse.ArgumentParser, *, scratch: bool) -> None:
    parser.add_argument(
        "--db",
        default=env_value("db"),
        help="PostgreSQL DSN (env STILLHERE_DB); without it, "
        + (
            "an embedded PostgreSQL in a temporary folder, thrown away after"
            if scratch
            else "the embedded PostgreSQL of --data-dir (not while a server uses it)"
        ),
    )
    if not scratch:
        add_data_dir_option(parser)


def add_data_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(env_value("data-dir") or Settings().data_dir),
        help="the server's data folder: its secret file and embedded PostgreSQL",
    )
