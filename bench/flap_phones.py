"""The flap bench's phones: reference clients whose links misbehave on a seeded schedule.

Each simulated phone is a `client.Phone` with its own `aiohttp.ClientSession`. The session
is how the bench reaches under the link without touching the client:

- its connector has a **gate**: while a phone is in a tunnel the gate is shut and every
  connection attempt fails at once (as with no signal), so the phone's own reconnect loop
  keeps failing and backing off until the tunnel ends;
- its WebSocket class can **cut the link right after the hello is written**, and a trace
  hook cuts an event stream as soon as its response starts: drops in the middle of a hello;
- trace hooks timestamp the hello (WebSocket: the upgrade is done and the hello goes out
  next; SSE: the `GET /v1/events` is the hello), so hello -> welcome is measured without
  the connect.

The bench also taps every frame a phone receives *before* the client's own de-duplication
(`Phone._on_frame`), so a duplicate or a gap from the server is counted even though the
client would hide it from the app.

Link events, per phone, drawn from the phone's own `random.Random` (seeded from `--seed`):

| kind | what the bench does |
|---|---|
| tunnel | shut the gate, `drop(hold=True)` (the server is not told), gate shut 5 to 60 s |
| handover | `drop(hold=True)`: the link is replaced at once (the phone reconnects on its backoff) |
| nat | wait until the phone is idle (no reply pending), then `drop(hold=True)` |
| mid_reply | make sure a reply is coming, `drop()` at its first `reply.delta` |
| mid_hello | `drop()`, and cut the reconnect's link right after its hello went out |
| leave | wait until idle, `leave()` for real, then a new Phone (same device) starts afresh |
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from actors.clock import parse_duration
from bench.flap_ledger import Ledger
from client import Backoff, HeldConnection, LinkState, Phone
from client.links import verifying

KINDS: dict[str, float] = {  # relative weights of the link events
    "tunnel": 0.20,
    "handover": 0.25,
    "nat": 0.20,
    "mid_reply": 0.20,
    "mid_hello": 0.10,
    "leave": 0.05,
}
TUNNEL_S = (5.0, 60.0)
# After a tunnel, until the phone's stack resets the connection the phone dropped in it:
# the server's next packet on it (an event, a ping) gets the reset.
HELD_AFTER_S = (0.0, 10.0)
# A handover or a NAT's idle close leaves the old connection as silent, and nothing on the
# old path ever answers: the server's heartbeat finds a WebSocket (a ping after 30 s, then
# 15 s for its pong). An SSE stream has no pong; the bench resets both by then.
SILENT_S = 45.0
IDLE_WAIT_S = 20.0  # how long an event waits for the phone to be idle before giving up
START_TIMEOUT_S = 60.0
LEAVE_TIMEOUT_S = 30.0
STUCK_S = 30.0  # a phone whose last say got no answer in this long says the next thing anyway


def now() -> float:
    return time.perf_counter()


PHONE: contextvars.ContextVar[int] = contextvars.ContextVar("flap_phone", default=-1)


class ClientLogRing(logging.Handler):
    """The last lines of the reference client's debug log, per phone (`--client-debug`).

    The phone's index is a context variable set before `phone.start()`: the phone's tasks
    (its link loop, its writer) inherit it, so each log record finds its phone."""

    def __init__(self, lines: int = 25) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines
        self.rings: dict[int, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        ring = self.rings.setdefault(PHONE.get(), [])
        ring.append(f"{now():.2f} {record.getMessage()[:200]}")
        if len(ring) > self.lines:
            del ring[0]

    def install(self) -> None:
        client_log = logging.getLogger("stillhere.client")
        client_log.setLevel(logging.DEBUG)
        client_log.addHandler(self)

    def remove(self) -> None:
        logging.getLogger("stillhere.client").removeHandler(self)


@dataclass
class Gate:
    """Shut while the phone is in a tunnel: no connection can be made."""

    shut: bool = False


class GatedConnector(aiohttp.TCPConnector):
    def __init__(self, gate: Gate, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate = gate

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        if self.gate.shut:
            raise aiohttp.ClientConnectionError("no signal (in a tunnel)")
        return await super().connect(req, traces, timeout)


def _abort(response: aiohttp.ClientResponse | None) -> None:
    connection = response.connection if response is not None else None
    transport = connection.transport if connection is not None else None
    if transport is not None:
        transport.abort()


@dataclass
class PhoneRun:
    """One simulated phone across its lives (a leave ends a life; a new Phone starts one)."""

    index: int
    device: str
    transport: str
    rng: random.Random
    gate: Gate = field(default_factory=Gate)
    session: aiohttp.ClientSession | None = None
    phone: Phone | None = None
    lives: int = 0
    expected: str | None = None  # conversation of this life's last welcome
    hello_at: float | None = None
    cut_hello: bool = False
    cut_reply: bool = False
    said: int = 0
    last_say_at: float = 0.0
    last_frame_at: float = 0.0


class BenchPhone(Phone):
    """The reference phone, with a tap on every received frame before its de-duplication."""

    tap: Callable[[dict[str, Any]], None] | None = None
    bench_up: bool = False

    def _on_frame(self, frame: dict[str, Any], link: Any) -> None:
        if self.tap is not None:
            self.tap(frame)
        super()._on_frame(frame, link)


TAPPED = hasattr(Phone, "_on_frame")


@dataclass
class FleetOptions:
    base_url: str
    transport: str  # ws | sse | mixed
    think_s: float
    flap_every_s: float
    kinds: dict[str, float]
    backoff: Backoff
    seed: int
    ca_file: Path | None = None  # the server speaks TLS, its certificate of this authority

    @classmethod
    def of(cls, args: argparse.Namespace, base_url: str, backoff: Backoff) -> FleetOptions:
        """From the options `add_fleet_options` added, with every kind of link event."""
        return cls(
            base_url=base_url,
            transport=args.transport,
            think_s=args.think,
            flap_every_s=args.flap_every,
            kinds=dict(KINDS),
            backoff=backoff,
            seed=args.seed,
        )


def at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number of at least 1, not {text!r}")
    return value


def add_fleet_options(
    parser: argparse.ArgumentParser, *, clients: int, think_s: float, flap_every_s: float
) -> None:
    """The phones of a bench that runs a `Fleet` (`--seed` is the bench's own)."""
    parser.add_argument("--clients", type=at_least_one, default=clients, help=f"phones ({clients})")
    parser.add_argument("--transport", choices=["ws", "sse", "mixed"], default="mixed")
    parser.add_argument(
        "--think", type=parse_duration, default=think_s,
        help=f"mean pause between says ({think_s:g}s)",
    )  # fmt: skip
    parser.add_argument(
        "--flap-every", type=parse_duration, default=flap_every_s,
        help=f"mean time between a phone's link events ({flap_every_s:g}s)",
    )  # fmt: skip


class Fleet:
    """N phones, their scripts, and what they saw (the ledger)."""

    def __init__(self, options: FleetOptions, n: int) -> None:
        self.o = options
        self.ledger = Ledger()
        master = random.Random(options.seed)
        self.runs: list[PhoneRun] = []
        for i in range(n):
            rng = random.Random(master.getrandbits(64))
            transport = options.transport
            if transport == "mixed":
                transport = "ws" if i % 2 == 0 else "sse"
            letters = "".join(rng.choices("abcdefghjkmnpqrstuvwxyz", k=24))
            device = f"flap-{options.seed}-{i}-{letters}"
            self.runs.append(PhoneRun(i, device, transport, rng))
        self.up = 0
        self.kinds: Counter[str] = Counter()
        self.cuts: Counter[str] = Counter()  # hello cuts made, mid-reply cuts made, ...
        self.failures: Counter[str] = Counter()
        self.stopping = False
        self.in_storm = False
        self.storm_welcomes: list[tuple[int, float, bool]] = []  # (phone, at, resumed ok)
        self.resume_series: list[tuple[float, float]] = []  # (at, ms), flap phase only
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self._held: set[HeldConnection] = set()  # dropped links' connections, still open
        self.client_log: ClientLogRing | None = None

    # -- phones -----------------------------------------------------------------------------

    def _session(self, run: PhoneRun) -> aiohttp.ClientSession:
        trace = aiohttp.TraceConfig()

        async def on_start(_s: Any, _c: Any, params: aiohttp.TraceRequestStartParams) -> None:
            if params.url.path == "/v1/events":
                run.hello_at = now()

        async def on_end(_s: Any, _c: Any, params: aiohttp.TraceRequestEndParams) -> None:
            path = params.url.path
            if path == "/v1/ws":
                run.hello_at = now()  # the upgrade is done: the hello goes out next
            elif path == "/v1/events" and run.cut_hello:
                run.cut_hello = False
                self.cuts["hello"] += 1
                _abort(params.response)

        trace.on_request_start.append(on_start)
        trace.on_request_end.append(on_end)

        class CuttingWebSocket(aiohttp.ClientWebSocketResponse):
            async def send_str(self, data: str, compress: int | None = None) -> None:
                await super().send_str(data, compress)
                if run.cut_hello and data.startswith('{"type":"hello"'):
                    run.cut_hello = False
                    fleet_cuts["hello"] += 1
                    _abort(self._response)

        fleet_cuts = self.cuts
        connector = GatedConnector(
            run.gate, limit=0, force_close=False, ssl=verifying(self.o.ca_file)
        )
        return aiohttp.ClientSession(
            connector=connector, ws_response_class=CuttingWebSocket, trace_configs=[trace]
        )

    def _new_phone(self, run: PhoneRun) -> BenchPhone:
        run.lives += 1
        run.expected = None
        if run.session is None:
            run.session = self._session(run)
        phone = BenchPhone(
            self.o.base_url,
            device=run.device,
            transport=run.transport,
            backoff=self.o.backoff,
            rng=random.Random(run.rng.getrandbits(64)),
            session=run.session,
            connect_timeout=15.0,
            start_timeout=START_TIMEOUT_S,
        )
        phone.on_event = lambda frame: self._on_event(run, phone, frame)
        phone.on_state = lambda state: self._on_state(phone, state)
        if TAPPED:
            phone.tap = lambda frame: self._on_raw(run, phone, frame)
        run.phone = phone
        return phone

    def _on_raw(self, run: PhoneRun, phone: Phone, frame: dict[str, Any]) -> None:
        run.last_frame_at = now()
        kind = frame.get("type")
        if kind in ("bye", "error", "welcome", "pong"):
            return  # these come through on_event
        self.ledger.frame(run.index, phone.conversation, frame, now())
        if run.cut_reply and kind == "reply.delta":
            run.cut_reply = False
            self.cuts["reply"] += 1
            self.ledger.dropped(run.index)
            phone.drop()

    def _on_event(self, run: PhoneRun, phone: Phone, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        at = now()
        if kind == "welcome":
            hello_ms = (at - run.hello_at) * 1000.0 if run.hello_at is not None else None
            expected = run.expected
            self.ledger.welcome(run.index, frame, at, expected=expected, hello_ms=hello_ms)
            ok = frame.get("resumed") is True and frame.get("conversation") == expected
            if expected is not None and hello_ms is not None:
                if self.in_storm:
                    self.storm_welcomes.append((run.index, at, ok))
                else:
                    self.resume_series.append((at, hello_ms))
            run.expected = str(frame.get("conversation"))
            run.hello_at = None
        elif kind in ("bye", "error") or not TAPPED:
            self.ledger.frame(run.index, phone.conversation, frame, at)

    def _on_state(self, phone: BenchPhone, state: LinkState) -> None:
        up = state is LinkState.UP
        if up != phone.bench_up:
            self.up += 1 if up else -1
            phone.bench_up = up

    def say(self, run: PhoneRun, text: str | None = None) -> str:
        phone = run.phone
        assert phone is not None
        run.said += 1
        run.last_say_at = now()
        text = text or f"Message {run.said} from phone {run.index}, still here."
        up = phone.state is LinkState.UP
        id_ = phone.say(text)
        self.ledger.said(run.index, id_, text, now(), up=up, conv=phone.conversation)
        return id_

    def idle(self, run: PhoneRun) -> bool:
        phone = run.phone
        return (
            phone is not None
            and phone.state is LinkState.UP
            and not phone.outbox
            and not self.ledger.waiting(run.index)
        )

    # -- ramp -------------------------------------------------------------------------------

    async def ramp(self, concurrency: int, progress: Callable[[], None] | None = None) -> int:
        """Start every phone (hello) and have each say one thing; the phones that failed."""
        gate = asyncio.Semaphore(concurrency)

        async def one(run: PhoneRun) -> None:
            async with gate:
                PHONE.set(run.index)
                phone = self._new_phone(run)
                try:
                    await phone.start()
                    self.say(run, "Hello, this is the flap bench.")
                except Exception as failed:
                    self.failures[f"start: {type(failed).__name__}: {failed}"[:200]] += 1
                if progress is not None:
                    progress()

        await asyncio.gather(*(one(r) for r in self.runs))
        return sum(self.failures.values())

    async def wait_settled(self, timeout: float) -> int:
        """Wait until every phone is up with nothing unanswered; how many were not."""
        deadline = now() + timeout
        while now() < deadline:
            if all(self.idle(r) for r in self.runs):
                return 0
            await asyncio.sleep(0.25)
        return sum(1 for r in self.runs if not self.idle(r))

    # -- flapping ---------------------------------------------------------------------------

    def start_scripts(self, end: float) -> None:
        kinds = [k for k, w in self.o.kinds.items() if w > 0]
        weights = [self.o.kinds[k] for k in kinds]
        for run in self.runs:
            task = asyncio.get_running_loop().create_task(self._script(run, end, kinds, weights))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def stop_scripts(self, grace: float = 120.0) -> None:
        """Let every script finish the event it is in (a leave starts its new phone), then
        cancel whatever is still running after `grace` seconds."""
        self.stopping = True
        self._stop.set()
        tasks = list(self._tasks)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace)
            for task in late:
                task.cancel()
                self.failures["script cancelled after the grace period"] += 1
            for task in late:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for run in self.runs:
            run.gate.shut = False
            run.cut_hello = run.cut_reply = False
        for held in list(self._held):
            self._reset(held)

    async def _script(
        self, run: PhoneRun, end: float, kinds: list[str], weights: list[float]
    ) -> None:
        rng = run.rng
        think = self.o.think_s
        next_say = now() + rng.uniform(0.0, think)
        next_flap = now() + rng.expovariate(1.0 / self.o.flap_every_s)
        while not self.stopping:
            t = now()
            wake = min(next_say, next_flap, end)
            if wake > t:
                await self._pause(wake - t)
            t = now()
            if t >= end or run.phone is None or self.stopping:
                return
            if t >= next_say:
                busy = self.ledger.waiting(run.index) or bool(run.phone.outbox)
                if busy and t - run.last_say_at < STUCK_S:
                    next_say = t + 1.0  # a conversation: one message, then the answer
                else:
                    self.say(run)
                    next_say = t + rng.uniform(0.5, 1.5) * think
            if t >= next_flap:
                kind = rng.choices(kinds, weights)[0]
                try:
                    await self._flap(run, kind, end)
                except Exception as failed:
                    self.failures[f"{kind}: {type(failed).__name__}: {failed}"[:200]] += 1
                next_flap = now() + rng.expovariate(1.0 / self.o.flap_every_s)

    async def _pause(self, seconds: float) -> None:
        """Sleep, cut short when the scripts are told to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), max(0.0, seconds))

    async def _wait(self, predicate: Callable[[], bool], timeout: float, end: float) -> bool:
        deadline = min(now() + timeout, end)
        while not predicate():
            if now() >= deadline or self.stopping:
                return False
            await asyncio.sleep(0.1)
        return True

    def _drop(self, run: PhoneRun, *, held_by: str | None = None) -> HeldConnection | None:
        """Drop the phone's link; `held_by` (a kind of link event) keeps its connection open
        and silent, as that event leaves it, until `_reset`."""
        assert run.phone is not None
        self.ledger.dropped(run.index)
        held = run.phone.drop(hold=held_by is not None)
        if held is not None:
            self._held.add(held)
            self.cuts[f"{held_by}_held_open"] += 1
        return held

    def _drop_silently(self, run: PhoneRun, kind: str) -> None:
        held = self._drop(run, held_by=kind)
        if held is not None:
            asyncio.get_running_loop().call_later(SILENT_S, self._reset, held)

    def _reset(self, held: HeldConnection) -> None:
        if held in self._held:
            self._held.discard(held)
            held.reset()

    async def _flap(self, run: PhoneRun, kind: str, end: float) -> None:
        phone = run.phone
        assert phone is not None
        self.kinds[kind] += 1
        if kind == "tunnel":
            run.gate.shut = True
            held = self._drop(run, held_by=kind)  # the server is not told: it keeps the link
            try:
                await self._pause(min(run.rng.uniform(*TUNNEL_S), end - now()))
            finally:
                run.gate.shut = False
                if held is not None:
                    after = run.rng.uniform(*HELD_AFTER_S)
                    asyncio.get_running_loop().call_later(after, self._reset, held)
        elif kind == "handover":
            self._drop_silently(run, kind)
        elif kind == "nat":
            if await self._wait(lambda: self.idle(run), IDLE_WAIT_S, end):
                self._drop_silently(run, kind)
            else:
                self.kinds["nat_skipped"] += 1
        elif kind == "mid_reply":
            if not self.ledger.waiting(run.index) and not phone.outbox:
                self.say(run)
            run.cut_reply = True
            await self._wait(lambda: not run.cut_reply, IDLE_WAIT_S, end)
            if run.cut_reply:
                run.cut_reply = False
                self.kinds["mid_reply_missed"] += 1
        elif kind == "mid_hello":
            run.cut_hello = True
            self._drop(run)
            await self._wait(lambda: not run.cut_hello, IDLE_WAIT_S, end)
            if run.cut_hello:
                run.cut_hello = False
                self.kinds["mid_hello_missed"] += 1
        elif kind == "leave":
            await self._leave(run, end)

    async def _leave(self, run: PhoneRun, end: float) -> None:
        if not await self._wait(lambda: self.idle(run), IDLE_WAIT_S, end):
            self.kinds["leave_skipped"] += 1
            return
        old = run.phone
        assert old is not None
        run.phone = None  # the script and the storm leave it alone from here
        try:
            await asyncio.wait_for(old.leave(), LEAVE_TIMEOUT_S)
        except Exception as failed:
            self.failures[f"leave: {type(failed).__name__}: {failed}"[:200]] += 1
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.close(), LEAVE_TIMEOUT_S)
        PHONE.set(run.index)
        phone = self._new_phone(run)
        try:
            await phone.start()
        except Exception as failed:
            self.failures[f"restart: {type(failed).__name__}: {failed}"[:200]] += 1

    # -- storm ------------------------------------------------------------------------------

    async def storm(self, timeout: float) -> dict[str, Any]:
        """Drop every phone at the same instant; time until each is resumed."""
        self.storm_welcomes.clear()
        self.in_storm = True
        t0 = now()
        for run in self.runs:
            if run.phone is not None:
                self._drop(run)
        n = len(self.runs)
        deadline = t0 + timeout
        try:
            while now() < deadline:
                ok = {p for p, _, good in self.storm_welcomes if good}
                if len(ok) >= n:
                    break
                await asyncio.sleep(0.05)
        finally:
            self.in_storm = False
        first_ok: dict[int, float] = {}
        for p, at, good in self.storm_welcomes:
            if good and p not in first_ok:
                first_ok[p] = at
        ms = sorted((at - t0) * 1000.0 for at in first_ok.values())
        return {
            "phones": n,
            "resumed": len(first_ok),
            "not_resumed": n - len(first_ok),
            "storm_s": round(ms[-1] / 1000.0, 3) if ms and len(first_ok) == n else None,
            "last_resumed_s": round(ms[-1] / 1000.0, 3) if ms else None,
            "reconnect_ms": ms,
            "welcomes_not_resumed": sum(1 for _, _, good in self.storm_welcomes if not good),
        }

    # -- end --------------------------------------------------------------------------------

    async def close(self, concurrency: int = 200) -> None:
        gate = asyncio.Semaphore(concurrency)

        async def one(run: PhoneRun) -> None:
            async with gate:
                if run.phone is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(run.phone.close(), 10.0)
                if run.session is not None:
                    with contextlib.suppress(Exception):
                        await run.session.close()

        await asyncio.gather(*(one(r) for r in self.runs))

    def unsettled(self, limit: int = 20) -> list[dict[str, Any]]:
        """What the phones that are not up-and-idle are doing (for the report)."""
        out = []
        for run in self.runs:
            if self.idle(run):
                continue
            phone = run.phone
            out.append(
                {
                    "phone": run.index,
                    "transport": run.transport,
                    "lives": run.lives,
                    "state": phone.state.value if phone is not None else None,
                    "outbox": len(phone.outbox) if phone is not None else None,
                    "unanswered": len(self.ledger.pending[run.index]),
                    "gate_shut": run.gate.shut,
                    "links": phone.links if phone is not None else None,
                    "task_done": phone._task.done() if phone and phone._task else None,
                    "link": type(phone._link).__name__ if phone and phone._link else None,
                    "queued": phone._queue.qsize() if phone and phone._queue else None,
                    "last_frame_s_ago": round(now() - run.last_frame_at, 1),
                    "last_say_s_ago": round(now() - run.last_say_at, 1),
                    "at": round(now(), 2),
                    "client_log": self.client_log.rings.get(run.index, [])
                    if self.client_log is not None
                    else None,
                }
            )
            if len(out) >= limit:
                break
        return out

    def wedged(self) -> int:
        """Phones whose client shows UP with no link and no writer queue: its link loop is
        stuck (it will never reconnect nor send its outbox) - a client-side fault."""
        return sum(
            1
            for r in self.runs
            if r.phone is not None
            and r.phone.state is LinkState.UP
            and r.phone._link is None
            and r.phone._queue is None
        )

    def said_by(self) -> dict[str, str]:
        """say id -> device of the phone that said it."""
        devices = {r.index: r.device for r in self.runs}
        return {i: devices[s.phone] for i, s in self.ledger.says.items()}
