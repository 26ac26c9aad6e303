"""`stillhere inspect [PERSON] [--turns] [--cluster [--people]]`: the admin API, read by a
person at a terminal.

Without PERSON, a table of the live actors; with it, one actor's state and which node owns
the person (or, when another node runs them, which one); with `--turns`, the traces of its
last turns; with `--cluster`, the nodes sharing the database, their state, last heartbeat
and people. It talks to a running server's admin API over HTTP (the server must run with an
admin token), so it sees exactly what the API shows and needs nothing else: no database,
no data dir.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from transport.config import env_value

DEFAULT_URL = "http://127.0.0.1:8766"
PERSON_CHARS = 64  # a person key is a hex HMAC-SHA256
SHOWN_PERSON = 12  # enough to be unique in practice, and a prefix `inspect` accepts


class InspectError(Exception):
    """What went wrong, in words for the terminal. Never names the token."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "inspect", help="show live actors (or one) through a running server's admin API"
    )
    parser.set_defaults(run=run_inspect)
    parser.add_argument(
        "person", nargs="?", help="a person key as listed, or a unique prefix of one"
    )
    parser.add_argument(
        "--admin-url",
        default=env_value("admin-url") or DEFAULT_URL,
        help=f"the server's admin API (env STILLHERE_ADMIN_URL, default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--admin-token",
        default=env_value("admin-token"),
        help="the server's admin token (env STILLHERE_ADMIN_TOKEN)",
    )
    parser.add_argument(
        "--ca-file",
        type=Path,
        help="with an https --admin-url: the authority its certificate is checked against "
        "(default: the system's)",
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON as it is")
    parser.add_argument(
        "--turns",
        action="store_true",
        help="with PERSON: what the model was handed at each of the last turns, and its tools",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="the nodes sharing the server's database: state, last heartbeat, people owned",
    )
    parser.add_argument(
        "--people", action="store_true", help="with --cluster: list each node's people too"
    )


def run_inspect(args: argparse.Namespace) -> int:
    """The `inspect` command; 1 with a message on stderr when the API cannot answer."""
    try:
        print(
            inspect(
                args.admin_url,
                args.admin_token,
                args.person,
                raw=args.json,
                turns=args.turns,
                cluster=args.cluster,
                people=args.people,
                ca_file=args.ca_file,
            )
        )
    except InspectError as error:
        print(f"stillhere inspect: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `stillhere inspect --json | head`: the reader left, which is no error; point
        # stdout at devnull so the flush at exit does not complain either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def inspect(
    url: str,
    token: str | None,
    person: str | None,
    *,
    raw: bool = False,
    turns: bool = False,
    cluster: bool = False,
    people: bool = False,
    ca_file: Path | None = None,
) -> str:
    if not token:
        raise InspectError("no admin token: pass --admin-token or set STILLHERE_ADMIN_TOKEN")
    if turns and person is None:
        raise InspectError("--turns needs a PERSON: whose turns?")
    if cluster and (person is not None or turns):
        raise InspectError("--cluster lists the nodes: give it no PERSON and no --turns")
    if people and not cluster:
        raise InspectError("--people goes with --cluster")
    api = AdminClient(url, token, ca_file=ca_file)
    if cluster:
        listing = api.get("/admin/nodes?people=on" if people else "/admin/nodes")
        return _pretty(listing) if raw else nodes_text(listing)
    if person is None:
        listing = api.get("/admin/actors")
        return _pretty(listing) if raw else actors_table(listing)
    if turns:
        traced = api.get(f"/admin/actors/{api.resolve(person)}/turns")
        return _pretty(traced) if raw else turns_text(traced)
    actor = api.get(f"/admin/actors/{api.resolve(person)}")
    return _pretty(actor) if raw else actor_text(actor)


def _base_url(url: str) -> str:
    """The admin API's address; a bare host:port is taken as http, as people type it, and
    the live view's URL the server logs at start-up, or one ending in `/admin/`, may be
    pasted as it is."""
    full = url if "://" in url else "http://" + url
    parts = urllib.parse.urlsplit(full)
    try:
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        valid = False
    if not valid:
        raise InspectError(f"--admin-url must be an address such as {DEFAULT_URL}, not {url!r}")
    return full.rstrip("/").removesuffix("/admin")


class AdminClient:
    def __init__(
        self, url: str, token: str, timeout: float = 10.0, ca_file: Path | None = None
    ) -> None:
        self.url = _base_url(url)
        self._token = token
        self._timeout = timeout
        # The admin API is usually on loopback: an http_proxy from the environment must
        # not carry the request (and its token) elsewhere. Over https (--admin-tls on), its
        # certificate is checked, against `ca_file` if given.
        verify = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=verify)
        )

    def get(self, path: str) -> Any:
        request = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {self._token}"}
        )
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                return orjson.loads(response.read())
        except urllib.error.HTTPError as failed:
            raise InspectError(self._refusal(failed, path)) from None
        except urllib.error.URLError as failed:
            raise InspectError(self._unreachable(failed.reason)) from None
        except (OSError, orjson.JSONDecodeError) as failed:
            raise InspectError(self._unreachable(failed)) from None

    def resolve(self, person: str) -> str:
        """A full person key from a prefix of one, as the table shows them."""
        if len(person) >= PERSON_CHARS:
            return person
        keys = [row["person"] for row in self.get("/admin/actors")["actors"]]
        matches = [key for key in keys if key.startswith(person.lower())]
        if not matches:
            raise InspectError(f"no live conversation for person {person}")
        if len(matches) > 1:
            raise InspectError(f"{person} matches {len(matches)} people; give more of the key")
        return matches[0]

    def _unreachable(self, reason: object) -> str:
        if isinstance(reason, ConnectionRefusedError):
            reason = "connection refused"
        return (
            f"cannot reach the admin API at {self.url} ({reason}); is the server running "
            "with --admin-token, and is --admin-url its admin port?"
        )

    def _refusal(self, failed: urllib.error.HTTPError, path: str) -> str:
        try:
            body = orjson.loads(failed.read())
        except (orjson.JSONDecodeError, OSError):
            body = {}
        code = body.get("code") if isinstance(body, dict) else None
        if failed.code == 401:
            return (
                "the admin API refused the token (401): "
                "check --admin-token or STILLHERE_ADMIN_TOKEN"
            )
        if code == "unknown_person":
            person = path.removesuffix("/turns").rsplit("/", 1)[-1][:SHOWN_PERSON]
            held = body.get("owner")
            if held and not held["this_node"]:
                return (
                    f"no live conversation for person {person} on this node: "
                    f"node {held['node']} owns them ({_lease(held)}); ask its admin API"
                )
            return f"no live conversation for person {person} (ended or parked?)"
        if failed.code == 404:
            return (
                f"{self.url}{path} not found (404): "
                "is --admin-url the admin port, not the main one?"
            )
        message = body.get("message") if isinstance(body, dict) else None
        return f"the admin API answered {failed.code}: {message or failed.reason}"


# -- rendering ----------------------------------------------------------------------------

_HEADER = (
    "PERSON",
    "CONVERSATION",
    "STATE",
    "AGE",
    "IDLE",
    "LINKS",
    "PENDING",
    "WINDOW",
    "LAST ACTIVITY",
)


def actors_table(listing: dict[str, Any]) -> str:
    """The live actors, one line each, the most recently active first."""
    actors = listing["actors"]
    if not actors:
        return "no live actors"
    rows = [_HEADER, *(_row(actor) for actor in actors)]
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.append(f"{len(actors)} live actor{'s' if len(actors) != 1 else ''}")
    return "\n".join(line.rstrip() for line in lines)


def _row(actor: dict[str, Any]) -> tuple[str, ...]:
    return (
        actor["person"][:SHOWN_PERSON],
        actor["conversation"][:8],
        actor["state"],
        duration(actor["age_s"]),
        duration(actor["idle_s"]),
        str(actor["links"]),
        _or_dash(actor["pending"]),
        _or_dash(actor["window"]),
        when(actor["last_activity"]),
    )


def actor_text(actor: dict[str, Any]) -> str:
    """One actor's state, readable: its facts, then its window, cards and pending says."""
    lines = [
        f"person         {actor['person']}",
        f"conversation   {actor['conversation']}",
        f"state          {actor['state']}",
        f"owner          {_owner(actor.get('owner'))}",
    ]
    if actor["window"] is None:
        lines.append("               the actor did not answer: only its stream is shown")
        return "\n".join([*lines, _stream_line(actor["stream"])])
    lines += [
        f"started        {when(actor['started_at'])} ({duration(actor['age_s'])} ago)",
        f"last activity  {when(actor['last_activity'])} ({duration(actor['idle_s'])} idle)",
        f"speaker        {_speaker(actor)}",
        f"mood           {_mood(actor.get('fondness'))}",
        f"next turn      {_next_turn(actor)}",
        _stream_line(actor["stream"]),
        "",
        _section("window", "turn", actor["window"], _turn_line),
        "",
        _section("cards", "card", actor["cards"], _card_line),
        "",
        _section("pending", "message", actor["pending"], _turn_line),
    ]
    return "\n".join(lines)


def _owner(held: dict[str, Any] | None) -> str:
    if held is None:
        return "no node (released as it ends or parks)"
    node = f"{held['node']} (this node)" if held["this_node"] else held["node"]
    return f"node {node}, {_lease(held)}"


def _lease(held: dict[str, Any]) -> str:
    return f"epoch {held['epoch']}, lease until {when(held['lease_until'])}"


_NODE_HEADER = ("NODE", "STATE", "PEOPLE", "STARTED", "LAST HEARTBEAT", "HOST", "PID")


def nodes_text(listing: dict[str, Any]) -> str:
    """The nodes, one line each (this one marked `*`), and under each its people if the
    listing has them."""
    rows = [_NODE_HEADER, *(_node_row(node, listing["node"]) for node in listing["nodes"])]
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    lines = [_cells(rows[0], widths)]
    for node, row in zip(listing["nodes"], rows[1:], strict=True):
        lines.append(_cells(row, widths))
        lines += [_owned_line(owned) for owned in node.get("persons", [])]
    up = sum(node["state"] == "up" for node in listing["nodes"])
    lines.append(f"{len(listing['nodes'])} nodes, {up} up; * this node")
    return "\n".join(lines)


def _cells(row: tuple[str, ...], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()


def _node_row(node: dict[str, Any], this: str) -> tuple[str, ...]:
    heartbeat = when(node["last_heartbeat"])
    if node["heartbeat_age_s"] is not None:
        heartbeat += f" ({duration(node['heartbeat_age_s'])} ago)"
    return (
        node["name"] + (" *" if node["name"] == this else ""),
        node["state"],
        str(node["people"]),
        when(node["started_at"]),
        heartbeat,
        _or_dash(node["host"]),
        _or_dash(node["pid"]),
    )


def _owned_line(owned: dict[str, Any]) -> str:
    lapsed = "  [lease expired]" if owned["expired"] else ""
    return f"  {owned['person'][:SHOWN_PERSON]}  {_lease(owned)}{lapsed}"


def _mood(fondness: float | None) -> str:
    if fondness is None:
        return "fondness not set yet (no exchange so far)"
    return f"fondness {fondness:.2f} (0 to 1; follow-ons come sooner and more often as it grows)"


def _speaker(actor: dict[str, Any]) -> str:
    if actor["speaker"] is None:
        return "the owner"
    return f"{actor['speaker']} (since {when(actor['speaker_at'])})"


def _next_turn(actor: dict[str, Any]) -> str:
    notes = []
    if actor["after_interrupt"]:
        notes.append("is told its previous reply was cut off")
    if actor["during_reply"]:
        notes.append("is told messages arrived while it was writing")
    return "; ".join(notes) or "no notes"


def _stream_line(stream: dict[str, Any]) -> str:
    links = ", ".join(stream["links"]) or "none attached"
    return (
        f"stream         last seq {stream['last_seq']}, {stream['buffered']} events buffered, "
        f"links: {links}"
    )


def _section(title: str, noun: str, items: list[dict[str, Any]], line: Any) -> str:
    count = f"{len(items)} {noun}{'s' if len(items) != 1 else ''}"
    return "\n".join([f"{title} ({count})", *(line(item) for item in items)])


def _turn_line(turn: dict[str, Any]) -> str:
    mark = "  [interrupted]" if turn.get("interrupted") else ""
    text = turn["text"].replace("\n", "\n" + " " * 23)
    return f"  {when(turn['at'], '%H:%M:%S')}  {turn['role']:<9}  {text}{mark}"


def _card_line(card: dict[str, Any]) -> str:
    return f"  {card['kind']:<9}  {card['text']}"


def turns_text(traced: dict[str, Any]) -> str:
    """Each traced turn, oldest first: what the model was handed, and what its tools did."""
    turns = traced["turns"]
    plural = "s" if len(turns) != 1 else ""
    head = f"conversation {traced['conversation']}: {len(turns)} turn{plural} traced"
    return "\n\n".join([head, *(_trace_text(turn) for turn in turns)])


def _ids_line(title: str, ids: list[str]) -> list[str]:
    return [f"  {title:<15}{' '.join(i[:8] for i in ids)}"] if ids else []


def _trace_text(turn: dict[str, Any]) -> str:
    answering = ", ".join(turn["answering"]) or "nothing new"
    memories = "; ".join(
        f"{layer} {len(ids)}" + (f": {' '.join(i[:8] for i in ids)}" if ids else "")
        for layer, ids in turn["memories"].items()
    )
    timings = ", ".join(
        f"{name} {'kept' if ms is None else f'{ms:.1f} ms'}"
        for name, ms in turn["timings_ms"].items()
    )
    lines = [
        f"{when(turn['at'], '%H:%M:%S')}  reply {turn['reply'][:8]}, answering {answering}",
        f"  context        {turn['context_chars']} chars, {len(turn['conversations'])} "
        f"conversations ({turn['exchanges']} turns word for word), {turn['rules']} rules",
        f"  memories       {memories}",
        f"  sources        {timings}",
        f"  problems       {'; '.join(turn['problems']) or 'none'}",
        *(f"  note           {' / '.join(note.splitlines())}" for note in turn["notes"]),
        *_ids_line("loose ends", turn["loose_ends"]),
        *_ids_line("threads", turn["threads"]),
        *(f"  tool           {line}" for line in turn["tools"]),
    ]
    if turn["error"]:
        lines.append(f"  error          {turn['error']}")
    return "\n".join(lines)


def duration(seconds: float | None) -> str:
    """`9s`, `3m12s`, `2h05m`: short enough for a table column."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def when(iso: str | None, fmt: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    """An API timestamp in UTC, like the server's records."""
    if iso is None:
        return "-"
    return datetime.fromisoformat(iso).astimezone(UTC).strftime(fmt)


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
