"""`bench.fuzz`'s driver: sends drawn frames and bodies to a running server and checks it.

The server runs on an event loop; Hypothesis runs in another thread and hands each example
to that loop (`asyncio.run_coroutine_threadsafe`), so the checks are plain synchronous
Hypothesis tests while the server and the links stay asynchronous.

For each frame the probe checks what the protocol promises (docs/protocol.md):

- every server frame is a JSON object of a server type; an `error` has a documented code
  and a message;
- every frame is answered (a ping sent right after it marks where its answer ends), except
  the two that have none (`interrupt`, and `ack` with a good seq, on a link past its hello);
  before a successful hello nothing but `ping` and `hello` is accepted;
- the link closes only where the protocol says: after `unauthorized` or `bye`, or for a
  message over 4 x the frame limit;
- a frame answered with an error changes nothing stored: the rows of every table are the
  same before and after it (a digest per table, read once the server is quiet);
- a hello naming another person's conversation gets the person's own, and nothing of the
  other's; numbered events on a link come with increasing seqs;
- after every example, a new link still gets a pong.

POST bodies and event streams get the same treatment: a documented status, never a 500,
JSON with an error code for a refusal, nothing stored changed by one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import asyncpg
import orjson

from bench.fuzz_frames import Wire, encode, resolve

T = TypeVar("T")

SERVER_TYPES = frozenset(
    {
        "welcome", "ack", "reply.start", "reply.delta", "reply.end", "card", "reminder",
        "page", "reply_to", "error", "bye", "pong",
    }
)  # fmt: skip
NUMBERED = frozenset({"ack", "reply.start", "reply.delta", "reply.end", "card", "reminder"})
ANSWERS = frozenset({"error", "welcome", "ack", "bye"})
CODES = frozenset(
    {
        "frame_too_large", "bad_json", "bad_frame", "unknown_type", "unsupported_version",
        "invalid_field", "invalid_id", "invalid_text", "text_too_long", "rate_limited",
        "unauthorized", "already_hello", "hello_first", "conversation_ended", "internal_error",
    }
)  # fmt: skip
HTTP_STATUSES = frozenset({200, 201, 400, 401, 404, 409, 413, 429, 503})
# aiohttp's own limit on a request line (`max_line_size`): past it, its HTTP parser answers
# 400 in plain text before any handler runs, as it answers 413 for a body too large.
MAX_REQUEST_LINE = 8190
VICTIM_MARKER = "victim-marker-7f3a"  # in the other person's say: must never reach a fuzz link
ANSWER_TIMEOUT_S = 10.0
# Two digests this far apart must agree before a frame is sent: the writes that follow a
# reply off its path (the loose-ends analysis, the memory keeper) land within it, also on a
# loaded machine. Bounded: 15 s of writes without a pause is a failure.
QUIET_PAUSE_S = 0.25
QUIET_TRIES = 60
HARD_LIMIT_FACTOR = 4  # a message over 4 x the frame limit closes the link (docs/protocol.md)
PERSONS = 3  # fuzz persons: examples reuse them, so conversations are resumed and left


class FuzzFailure(AssertionError):
    """A property did not hold; the message says which and for what frame."""


class Stopped(BaseException):
    """The run was stopped (Ctrl-C, a timeout): not a failure, so Hypothesis does not
    catch it and the property ends at once."""


@dataclass
class Counts:
    frames: int = 0
    requests: int = 0
    examples: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # code -> frames answered with it
    answers: dict[str, int] = field(default_factory=dict)  # server frame type -> how many
    statuses: dict[int, int] = field(default_factory=dict)  # HTTP status -> POSTs answered


@dataclass
class LinkState:
    device: str
    helloed: bool = False
    closed: bool = False
    seq: int = 0  # greatest numbered seq seen
    pending: set[str] = field(default_factory=set)  # says acked, their reply not ended
    answering: dict[str, list[str]] = field(default_factory=dict)  # reply -> its says
    frames: list[dict[str, Any]] = field(default_factory=list)


class Probe:
    """A running server (its base URL and its database) and the checks made against it."""

    def __init__(
        self, base_url: str, dsn: str, loop: asyncio.AbstractEventLoop, max_frame_bytes: int
    ) -> None:
        self.base_url = base_url
        self.max_frame_bytes = max_frame_bytes  # the server's: a larger frame is refused
        self.dsn = dsn
        self.loop = loop
        self.counts = Counts()
        self.devices = [f"fuzz-person-{i}-{uuid.uuid4().hex}" for i in range(PERSONS)]
        self.own: dict[str, str] = {}  # device -> its conversation, from its last welcome
        self.victim: str | None = None
        self._http: aiohttp.ClientSession | None = None
        self._db: asyncpg.Connection | None = None
        self._tables: list[str] = []
        self._stopped = threading.Event()
        self._refused_digest: dict[str, tuple[int, str]] | None = None  # see quiet_digest

    # -- set-up, from the loop ---------------------------------------------------------------

    async def open(self) -> None:
        self._http = aiohttp.ClientSession()
        self._db = await asyncpg.connect(self.dsn)
        self.victim = await self._victim_conversation()
        # `owners` and `nodes` say which node runs a person and that it is alive, not what
        # the person stored: leases and heartbeats are renewed on a timer, whatever a frame did.
        rows = await self._db.fetch(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'public' AND table_type = 'BASE TABLE' "
            "AND table_name NOT IN ('owners', 'nodes') ORDER BY 1"
        )
        self._tables = [r["table_name"] for r in rows]

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._db is not None:
            await self._db.close()

    async def _victim_conversation(self) -> str:
        """Another person's conversation, with a say the fuzz links must never see."""
        assert self._http is not None
        device = "fuzz-victim-" + uuid.uuid4().hex
        async with self._http.ws_connect(self.base_url + "/v1/ws") as ws:
            await ws.send_json({"type": "hello", "v": 1, "device": device})
            welcome = await ws.receive_json(timeout=ANSWER_TIMEOUT_S)
            await ws.send_json({"type": "say", "id": "v1", "text": f"{VICTIM_MARKER} is mine"})
            while (await ws.receive_json(timeout=ANSWER_TIMEOUT_S))["type"] != "reply.end":
                pass
        return str(welcome["conversation"])

    # -- from Hypothesis's thread ----------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the probe's loop and wait for it, unless the run is stopped."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        while not future.done():
            if self._stopped.wait(0.2):
                future.cancel()
                raise Stopped
        return future.result()

    def stop(self) -> None:
        """From the loop: end the property running in the other thread."""
        self._stopped.set()

    def script(self, wires: list[Wire], hello_at: int | None, person: int) -> None:
        self.run(self._script(wires, hello_at, person))

    def request(self, path: str, wire: Wire, content_type: str, person: int) -> None:
        self.run(self._request(path, wire, content_type, person))

    def stream(self, query: dict[str, Any], last_event_id: str | None, person: int) -> None:
        self.run(self._stream(query, last_event_id, person))

    # -- the database ------------------------------------------------------------------------

    async def digest(self) -> dict[str, tuple[int, str]]:
        """Every table's row count and an md5 of its rows, in one statement."""
        assert self._db is not None
        parts = [
            f"SELECT '{t}' AS t, count(*) AS n, "
            f"md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) AS h FROM {t} x"
            for t in self._tables
        ]
        rows = await self._db.fetch(" UNION ALL ".join(parts))
        return {r["t"]: (int(r["n"]), str(r["h"])) for r in rows}

    async def quiet_digest(self) -> dict[str, tuple[int, str]]:
        """The digest once two reads in a row agree: the writes after a reply have landed.
        Right after a refusal whose digest held, that digest (nothing was accepted since)."""
        if self._refused_digest is not None:
            kept, self._refused_digest = self._refused_digest, None
            return kept
        last = await self.digest()
        for _ in range(QUIET_TRIES):
            await asyncio.sleep(QUIET_PAUSE_S)
            now = await self.digest()
            if now == last:
                return now
            last = now
        raise FuzzFailure("the database never went quiet")

    async def unchanged_since(self, before: dict[str, tuple[int, str]], what: str) -> None:
        after = await self.digest()
        changed = sorted(t for t in before if before[t] != after.get(t))
        if changed:
            raise FuzzFailure(f"{what} was refused but changed tables {changed}")
        self._refused_digest = after

    # -- WebSocket scripts ---------------------------------------------------------------------

    async def _script(self, wires: list[Wire], hello_at: int | None, person: int) -> None:
        assert self._http is not None
        device = self.devices[person % len(self.devices)]
        plan: list[Wire | None] = list(wires)
        if hello_at is not None:
            plan.insert(min(hello_at, len(plan)), None)  # None: a good hello
        state = LinkState(device)
        async with self._http.ws_connect(self.base_url + "/v1/ws", autoping=True) as ws:
            for wire in plan:
                if state.closed:
                    break
                await self._one_frame(ws, state, wire)
        self.counts.examples += 1
        await self._alive()

    def _refs(self, device: str, seq: int = 0) -> dict[str, Any]:
        """What a drawn plan's Refs stand for, for this device now."""
        return {"device": device, "own": self.own.get(device), "victim": self.victim, "seq": seq}

    async def _one_frame(
        self, ws: aiohttp.ClientWebSocketResponse, state: LinkState, wire: Wire | None
    ) -> None:
        if wire is None:
            frame: dict[str, Any] = {"type": "hello", "v": 1, "device": state.device}
            if state.device in self.own:
                frame.update(conversation=self.own[state.device], last_seq=state.seq)
            data: str | bytes = orjson.dumps(frame).decode()
        else:
            data = encode(wire, self._refs(state.device, state.seq))
        await self._quiet(ws, state)
        before = await self.quiet_digest()
        sent = self._local_view(data, self.max_frame_bytes)
        what = f"frame {data[:200]!r}"
        self.counts.frames += 1
        try:
            await (ws.send_bytes(data) if isinstance(data, bytes) else ws.send_str(data))
            await ws.send_str('{"type":"ping"}')
        except (ConnectionError, RuntimeError) as gone:
            raise FuzzFailure(f"{what}: the link was gone before it was sent: {gone}") from None
        answers, closed = await self._answers(ws, state, pongs=2 if sent == "ping" else 1)
        self._check(state, sent, answers, closed, what)
        if any(a.get("type") == "error" for a in answers):
            await self.unchanged_since(before, what)

    @staticmethod
    def _local_view(data: str | bytes, limit: int) -> str | None:
        """The frame's type as the probe reads it, if it is an object with a string type
        and within the size the server reads."""
        size = len(data.encode() if isinstance(data, str) else data)
        if size > HARD_LIMIT_FACTOR * limit:
            return "over the hard limit"  # the server closes the link (1009)
        if size > limit:
            return "too large"
        with contextlib.suppress(orjson.JSONDecodeError):
            frame = orjson.loads(data)
            if isinstance(frame, dict) and isinstance(frame.get("type"), str):
                kind = frame["type"]
                if kind == "ack" and not _is_seq(frame.get("seq")):
                    return "bad ack"
                return kind
        return None

    async def _answers(
        self, ws: aiohttp.ClientWebSocketResponse, state: LinkState, pongs: int
    ) -> tuple[list[dict[str, Any]], bool]:
        """The frames up to the sentinel's pong (the frame's answer and any events), and
        whether the link closed instead."""
        answers: list[dict[str, Any]] = []
        while True:
            try:
                message = await ws.receive(timeout=ANSWER_TIMEOUT_S)
            except TimeoutError:
                raise FuzzFailure("no answer and no pong within the timeout") from None
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):  # fmt: skip
                state.closed = True
                return answers, True
            if message.type is not aiohttp.WSMsgType.TEXT:
                raise FuzzFailure(f"a {message.type.name} message from the server")
            frame = orjson.loads(message.data)
            self._note(state, frame)
            if frame.get("type") == "pong":
                pongs -= 1
                if pongs == 0:
                    return answers, False
            else:
                answers.append(frame)

    def _note(self, state: LinkState, frame: Any) -> None:
        """Check one server frame on its own, and follow the link's seq and open says."""
        if not isinstance(frame, dict) or frame.get("type") not in SERVER_TYPES:
            raise FuzzFailure(f"not a server frame: {frame!r:.200}")
        if VICTIM_MARKER in orjson.dumps(frame).decode():
            raise FuzzFailure(f"another person's conversation reached this link: {frame!r:.200}")
        kind = frame["type"]
        state.frames.append(frame)
        self.counts.answers[kind] = self.counts.answers.get(kind, 0) + 1
        if kind == "error":
            code = frame.get("code")
            if code not in CODES or not isinstance(frame.get("message"), str):
                raise FuzzFailure(f"an error without a documented code: {frame!r:.200}")
            self.counts.errors[code] = self.counts.errors.get(code, 0) + 1
        elif kind == "welcome":
            if frame.get("conversation") == self.victim:
                raise FuzzFailure("a hello was given another person's conversation")
            state.helloed = True
            state.seq = max(state.seq, int(frame.get("seq") or 0))
            self.own[state.device] = str(frame.get("conversation"))
        if kind in NUMBERED and not (kind == "ack" and frame.get("repeat")):
            seq = frame.get("seq")
            if not isinstance(seq, int) or seq <= 0:
                raise FuzzFailure(f"a numbered event without a seq: {frame!r:.200}")
            state.seq = max(state.seq, seq)
        if kind == "ack" and isinstance(frame.get("id"), str) and not frame.get("repeat"):
            state.pending.add(frame["id"])
        if kind == "reply.start":
            state.answering[str(frame.get("reply"))] = list(frame.get("in_reply_to") or [])
        if kind == "reply.end":
            state.pending.difference_update(state.answering.pop(str(frame.get("reply")), []))

    def _check(
        self,
        state: LinkState,
        sent: str | None,
        answers: list[dict[str, Any]],
        closed: bool,
        what: str,
    ) -> None:
        kinds = [a.get("type") for a in answers]
        errors = [a.get("code") for a in answers if a.get("type") == "error"]
        allowed = "unauthorized" in errors or "bye" in kinds or sent == "over the hard limit"
        if closed and not allowed:
            raise FuzzFailure(f"{what}: the link was closed, not after unauthorized or bye")
        silent = state.helloed and sent in ("interrupt", "ack")
        if not closed and sent != "ping" and not silent and not ANSWERS.intersection(kinds):
            raise FuzzFailure(f"{what}: no answer (got {kinds})")
        if sent == "too large" and "frame_too_large" not in errors:
            raise FuzzFailure(f"{what}: a frame over the limit was not refused ({kinds})")
        if sent == "bad ack" and "invalid_field" not in errors:
            raise FuzzFailure(f"{what}: an ack without a good seq was not refused ({kinds})")
        if silent and errors:
            raise FuzzFailure(f"{what}: an error for a frame the protocol accepts: {errors}")
        if not state.helloed and sent in ("say", "interrupt", "leave", "ack") and not errors:
            raise FuzzFailure(f"{what}: accepted before a hello ({kinds})")
        seqs = [f["seq"] for f in state.frames if f.get("type") in NUMBERED and not f.get("repeat")]
        if any(b <= a for a, b in itertools.pairwise(seqs)):
            raise FuzzFailure(f"{what}: seqs on the link do not increase: {seqs[-10:]}")

    async def _quiet(self, ws: aiohttp.ClientWebSocketResponse, state: LinkState) -> None:
        """Read the link until every acked say of it has its reply ended."""
        while state.pending and not state.closed:
            try:
                message = await ws.receive(timeout=ANSWER_TIMEOUT_S)
            except TimeoutError:
                raise FuzzFailure(f"says {sorted(state.pending)} acked, never answered") from None
            if message.type is not aiohttp.WSMsgType.TEXT:
                state.closed = True
                raise FuzzFailure(f"the link closed while says {sorted(state.pending)} waited")
            self._note(state, orjson.loads(message.data))

    async def _alive(self) -> None:
        assert self._http is not None
        try:
            async with self._http.ws_connect(self.base_url + "/v1/ws") as ws:
                await ws.send_str('{"type":"ping"}')
                pong = await ws.receive_json(timeout=ANSWER_TIMEOUT_S)
        except (aiohttp.ClientError, OSError, TimeoutError) as down:
            raise FuzzFailure(f"the server no longer answers: {down!r}") from None
        if pong.get("type") != "pong":
            raise FuzzFailure(f"a new link's ping got {pong!r:.200}")

    # -- HTTP bodies -------------------------------------------------------------------------

    async def _request(self, path: str, wire: Wire, content_type: str, person: int) -> None:
        assert self._http is not None
        device = self.devices[person % len(self.devices)]
        body = encode(wire, self._refs(device))
        headers = {"Content-Type": content_type} if content_type else {}
        before = await self.quiet_digest()
        what = f"POST {path} {body[:200]!r}"
        self.counts.requests += 1
        async with self._http.post(self.base_url + path, data=body, headers=headers) as answer:
            status, raw = answer.status, await answer.read()
        self.counts.statuses[status] = self.counts.statuses.get(status, 0) + 1
        if status not in HTTP_STATUSES:
            raise FuzzFailure(f"{what}: HTTP {status}: {raw[:200]!r}")
        if status == 413:
            return  # the HTTP server's own limit, before the handler (docs/protocol.md)
        try:
            answered = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise FuzzFailure(f"{what}: HTTP {status} is not JSON: {raw[:200]!r}") from None
        if VICTIM_MARKER in raw.decode(errors="replace"):
            raise FuzzFailure(f"{what}: another person's conversation in the answer")
        if status >= 400:
            code = answered.get("code") if isinstance(answered, dict) else None
            if not isinstance(code, str) or not code:
                raise FuzzFailure(f"{what}: HTTP {status} without a code: {raw[:200]!r}")
            self.counts.errors[code] = self.counts.errors.get(code, 0) + 1
            await self.unchanged_since(before, what)
        elif path == "/v1/say" and isinstance(answered, dict) and not answered.get("repeat"):
            await self._answered_in_db(str(answered.get("id")))

    async def _stream(self, query: dict[str, Any], last_event_id: str | None, person: int) -> None:
        """`GET /v1/events`: a stream that starts with a welcome of the person's own
        conversation, or a JSON error with a code and nothing stored changed."""
        assert self._http is not None
        device = self.devices[person % len(self.devices)]
        drawn = resolve(query, self._refs(device))
        params = {str(k): str(v) for k, v in drawn.items() if v is not None}
        headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
        before = await self.quiet_digest()
        what = f"GET /v1/events {params!r:.200} Last-Event-ID {last_event_id!r:.50}"
        self.counts.requests += 1
        url = self.base_url + "/v1/events"
        async with self._http.get(url, params=params, headers=headers) as answer:
            status = answer.status
            self.counts.statuses[status] = self.counts.statuses.get(status, 0) + 1
            if status == 200:
                welcome = await self._first_event(answer, what)
                if welcome.get("type") != "welcome" or welcome.get("conversation") == self.victim:
                    raise FuzzFailure(f"{what}: the stream began with {welcome!r:.200}")
                self.own[device] = str(welcome["conversation"])
                return
            raw = await answer.read()
            line = len(f"GET {answer.url.raw_path_qs} HTTP/1.1")
        if status == 400 and line > MAX_REQUEST_LINE:
            return  # the HTTP server's limit, not the handler's (docs/protocol.md)
        if status not in (400, 401):
            raise FuzzFailure(f"{what}: HTTP {status}: {raw[:200]!r}")
        with contextlib.suppress(orjson.JSONDecodeError):
            code = orjson.loads(raw).get("code")
            if isinstance(code, str) and code:
                self.counts.errors[code] = self.counts.errors.get(code, 0) + 1
                await self.unchanged_since(before, what)
                return
        raise FuzzFailure(f"{what}: HTTP {status} without a JSON code: {raw[:200]!r}")

    async def _first_event(self, answer: aiohttp.ClientResponse, what: str) -> dict[str, Any]:
        """The data of the stream's first event."""
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            async for line in answer.content:
                if line.startswith(b"data:"):
                    text = line[5:].strip()
                    if VICTIM_MARKER.encode() in text:
                        raise FuzzFailure(f"{what}: another person's conversation in the stream")
                    return dict(orjson.loads(text))
        raise FuzzFailure(f"{what}: the stream ended before its first event")

    async def _answered_in_db(self, say_id: str) -> None:
        """A POSTed say streams its reply to no link: wait for it in the database."""
        assert self._db is not None
        for _ in range(int(ANSWER_TIMEOUT_S / 0.05)):
            if await self._db.fetchval(
                "SELECT count(*) FROM turns WHERE role = 'assistant' AND $1 = ANY(in_reply_to)",
                say_id,
            ):
                return
            await asyncio.sleep(0.05)
        raise FuzzFailure(f"POST /v1/say {say_id!r} acked but never answered")


def _is_seq(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
