"""`python -m bench.slow_readers`: what phones that stop reading cost the server's memory.

One stillhere server (rehearsal model) and two fleets of N bare WebSocket phones, one after
the other. Every phone says hello, then asks for the same long stories, `--says` of them
back to back (each reply some 100 KB of frames). The baseline fleet reads everything. The
stalled fleet stops reading right after its welcome, with a small receive buffer, and
keeps asking: what the kernel does not take waits in the server, up to `--link-buffer`
per link, past which the server cuts the link (close 4503).

The kernel takes its part first, outside the server's RSS: the server runs with
`--socket-send-buffer` (32 KB by default here), which fixes each socket's kernel send
buffer. With 0, the kernel sizes it, and on loopback (an MTU of 64 KB) it grows to
`net.ipv4.tcp_wmem`'s maximum, 4 MB here: a link is then cut only once some 4 MB have been
sent to it, and all of that is kernel memory the report does not see. The server's RSS is sampled
throughout; the report gives each fleet's peak RSS above the idle server, their ratio, the
bound the option sets (N x link buffer), and how many links the server cut (its log).

    python -m bench.slow_readers --phones 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohappyeyeballs import AddrInfoType

from bench import procs, results
from bench.flap import ratio
from bench.flap_throughput import ErrorFrame, connect, say
from providers.event_loop import LOOPS
from providers.event_loop import run as run_on_loop

TOPIC = "the lighthouse keeper " * 180  # some 4 KB: a story is 12 sentences of it
STORY = "tell me a story about " + TOPIC.strip()
STORY_CAP_CHARS = 1_000_000  # far above a story: the server's default cap would cut it
RECEIVE_BUFFER = 4096  # a stalled phone's socket: the kernel holds little for it
QUIET_S = 3.0  # the server has answered every say once no turn ended for this long
# How a phone's link ended, as the phone saw it: `error` is an error frame for a say (its
# code counted in `error_codes`), `cut` the link closed under it.
ENDS = ("read", "open", "error", "cut", "refused")
LOG_MARKS = {  # the server's log lines for a link it closed
    "slow_reader": "its phone stopped reading",
    "hello_timeout": "no hello in time",
}
# A reply the server cut for its length (`--max-reply-chars`): a story not told whole.
REPLY_CUT_MARK = "model failed during a turn: too_long"


def _bytes(text: str) -> int:
    units = {"kb": 1024, "mb": 1024 * 1024, "b": 1}
    lowered = text.strip().lower()
    for unit, size in units.items():
        if lowered.endswith(unit):
            return int(float(lowered[: -len(unit)]) * size)
    return int(lowered)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.slow_readers", description=__doc__)
    parser.add_argument("--phones", type=int, default=1000, help="phones per fleet (1000)")
    parser.add_argument("--says", type=int, default=4, help="stories asked per phone (4)")
    parser.add_argument(
        "--link-buffer", type=_bytes, default=128 * 1024, help="the server's (128KB)"
    )
    parser.add_argument(
        "--socket-send-buffer",
        type=_bytes,
        default=32 * 1024,
        help="the server's, for each connection (32KB; 0: the kernel sizes it)",
    )
    parser.add_argument(
        "--pause", type=float, default=1.0, help="seconds between a stalled phone's says (1)"
    )
    parser.add_argument("--event-loop", choices=LOOPS, default="uvloop")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "slow_readers")
    args = parser.parse_args(argv)
    if min(args.phones, args.says) < 1:
        parser.error("--phones and --says must each be at least 1")
    return args


def _small_receive_buffer(addr_info: AddrInfoType) -> socket.socket:
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    return sock


async def _phone(
    http: aiohttp.ClientSession, url: str, args: argparse.Namespace, answered: asyncio.Event
) -> str:
    """A reading phone's run; how its link ended: `read` (every reply) or `cut`."""
    try:
        ws, _ = await connect(http, url)
    except (ConnectionError, aiohttp.ClientError, RuntimeError):
        return "refused"
    try:
        for _ in range(args.says):
            await say(ws, STORY)
        return "read"
    except ErrorFrame as error:
        return f"error {error.code}"
    except (ConnectionError, aiohttp.ClientError, RuntimeError):
        return "cut"
    finally:
        await _close(ws)


async def _stalled_phone(
    http: aiohttp.ClientSession, url: str, args: argparse.Namespace, answered: asyncio.Event
) -> str:
    """A phone that stops reading after its welcome and keeps asking; its link stays
    open until the server has answered every fleet's say (`answered`)."""
    try:
        ws, _ = await connect(http, url)
    except (ConnectionError, aiohttp.ClientError, RuntimeError):
        return "refused"
    try:
        transport = ws._response.connection.transport  # type: ignore[union-attr]
        transport.pause_reading()  # the phone stops reading: frames pile up behind it
        for n in range(args.says):
            frame = {"type": "say", "id": f"s{n}", "text": STORY}
            await ws.send_str(orjson.dumps(frame).decode())
            await asyncio.sleep(args.pause)  # a turn each, as a person talking to a frozen app
        await answered.wait()
        return "open"
    except (ConnectionError, aiohttp.ClientError):
        return "cut"
    finally:
        await _close(ws)


async def _close(ws: aiohttp.ClientWebSocketResponse) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ws.close(), 1.0)


async def _turns(http: aiohttp.ClientSession, base_url: str) -> float:
    """Turns the server has finished (its `stillhere_turn_seconds` count)."""
    async with http.get(base_url + "/metrics") as response:
        text = await response.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("stillhere_turn_seconds_count")
    )


async def _all_answered(base_url: str, phones: int, answered: asyncio.Event) -> None:
    """Set `answered` once the server has finished a turn for every phone at least (says
    a phone sends while a reply streams share the next one) and then no more for QUIET_S."""
    async with aiohttp.ClientSession() as http:
        first = last = await _turns(http, base_url)
        quiet = 0.0
        while quiet < QUIET_S or last - first < phones:
            await asyncio.sleep(0.5)
            turns = await _turns(http, base_url)
            quiet = quiet + 0.5 if turns == last else 0.0
            last = turns
    answered.set()


async def _fleet(server: procs.Server, args: argparse.Namespace, stalled: bool) -> dict[str, Any]:
    idle = server.rss_mb()
    connector = aiohttp.TCPConnector(
        limit=0, socket_factory=_small_receive_buffer if stalled else None
    )
    marks_before = _marks(server)
    answered = asyncio.Event()
    phone = _stalled_phone if stalled else _phone
    with procs.RssSampler(server, interval=0.25) as rss:
        async with aiohttp.ClientSession(connector=connector) as http:
            url = server.base_url + "/v1/ws"
            waiting = asyncio.ensure_future(_all_answered(server.base_url, args.phones, answered))
            runs = [phone(http, url, args, answered) for _ in range(args.phones)]
            ends = await asyncio.gather(*runs, return_exceptions=True)
            await waiting
            rss.sample()
    peak = max(mb for _, mb, _ in rss.series)
    said = [e.split(" ", 1) for e in ends if isinstance(e, str)]  # [end] or ["error", code]
    marks = _marks(server)
    return {
        "idle_rss_mb": round(idle, 1),
        "peak_rss_mb": round(peak, 1),
        "held_mb": round(peak - idle, 1),
        "ends": {k: sum(end[0] == k for end in said) for k in ENDS},
        "error_codes": dict(Counter(end[1] for end in said if len(end) == 2)),
        "errors": sum(isinstance(e, BaseException) for e in ends),
        "server_closed": {name: marks[name] - marks_before[name] for name in LOG_MARKS},
        "replies_cut": marks["replies_cut"] - marks_before["replies_cut"],
    }


def _marks(server: procs.Server) -> dict[str, int]:
    """How many links the server has closed so far, by reason, and replies it cut for
    their length (its log lines)."""
    marks = {**LOG_MARKS, "replies_cut": REPLY_CUT_MARK}
    with contextlib.suppress(OSError):
        text = server.log_path.read_text(errors="replace")
        return {name: text.count(mark) for name, mark in marks.items()}
    return dict.fromkeys(marks, 0)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="stillhere-slow-readers-"))
    # The same story asked again is no echo to cut here, and no reply is long enough to
    # be cut (`--max-reply-chars`): every reply is told whole. Two turns of history keep
    # each turn's context small: the bench is about the link.
    extra = ["--link-buffer", str(args.link_buffer), "--echo-guard", "off", "--window-turns", "2"]
    extra += ["--max-reply-chars", str(STORY_CAP_CHARS)]
    extra += ["--socket-send-buffer", str(args.socket_send_buffer)]
    server = procs.start(
        "stillhere", root, latency=0.0, rate=0.0, event_loop=args.event_loop, extra=extra
    )
    try:
        await procs.wait_ready(server)
        print("slow readers: the reading fleet ...", file=sys.stderr)
        reading = await _fleet(server, args, stalled=False)
        print("slow readers: the stalled fleet ...", file=sys.stderr)
        stalled = await _fleet(server, args, stalled=True)
    finally:
        stopped = await asyncio.get_running_loop().run_in_executor(None, procs.stop, server)
        shutil.rmtree(root, ignore_errors=True)
    return {
        "phones": args.phones,
        "says": args.says,
        "link_buffer_bytes": args.link_buffer,
        "socket_send_buffer_bytes": args.socket_send_buffer,
        "bound_mb": round(args.phones * args.link_buffer / 2**20, 1),
        "reading": reading,
        "stalled": stalled,
        "held_over_baseline": ratio(stalled["held_mb"], reading["held_mb"]),
        "server_stop": stopped,
    }


def table(result: dict[str, Any]) -> str:
    reading, stalled = result["reading"], result["stalled"]
    return "\n".join(
        [
            f"stillhere slow readers: {result['phones']} phones x {result['says']} stories, "
            f"--link-buffer {result['link_buffer_bytes']} (bound {result['bound_mb']} MB), "
            f"--socket-send-buffer {result['socket_send_buffer_bytes']}",
            f"  {'fleet':<10}{'idle MB':>9}{'peak MB':>9}{'held MB':>9}  ends",
            *(
                f"  {name:<10}{f['idle_rss_mb']:>9}{f['peak_rss_mb']:>9}{f['held_mb']:>9}  "
                f"{f['ends']} {f['error_codes'] or ''}"
                for name, f in (("reading", reading), ("stalled", stalled))
            ),
            f"  closed by the server: reading {reading['server_closed']}, "
            f"stalled {stalled['server_closed']}",
            f"  replies cut for their length: reading {reading['replies_cut']}, "
            f"stalled {stalled['replies_cut']}",
            f"  held over baseline: {result['held_over_baseline']}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Figures to read, not a target to meet: exit 0 once the run finished."""
    args = parse_args(argv)
    finishing = procs.finish("slow readers", run(args), args, table, lambda _: 0)
    return run_on_loop(finishing, "asyncio")


if __name__ == "__main__":
    sys.exit(main())
