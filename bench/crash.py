"""`stillhere-bench crash`: phones on flapping links while the server is killed, again and again.

Starts a real `stillhere serve` (embedded PostgreSQL in a tmp data dir, rehearsal model),
brings up the flap bench's phones (`bench.flap_phones`: reference clients whose links
misbehave on a seeded schedule) and, while they talk, kills the server with SIGKILL at
seeded random instants, restarting it each time on the same port and data. The phones'
ledger (`bench.flap_ledger`) and the server's database then say what a crash cost:

- acked says lost (an ack the phone saw, no turn stored): must be 0;
- says stored twice, seqs repeated on a link, events out of order: 0;
- replies lost per crash: says never answered, counted against the first kill after them;
  at most one per phone and crash (the reply that was streaming);
- resumes after each restart: every reconnect takes up its conversation again;
- time from a restart to its first welcome, and to the server accepting links.

    .venv/bin/python -m bench.crash --kills 20 --clients 20 --seed 1 --json /tmp/crash.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from actors.clock import parse_duration as seconds
from bench import procs, results
from bench.flap import add_rehearsal_options, percentiles
from bench.flap_db import Stored, stillhere_stored
from bench.flap_phones import Fleet, FleetOptions, add_fleet_options, now
from client import Backoff, LinkState
from providers.event_loop import run as run_on_loop

DESCRIPTION = "phones on flapping links while the server is killed (SIGKILL) and restarted"
FOREVER_S = 10**6  # the phones' scripts run until they are stopped


@dataclass
class Crash:
    killed_at: float
    restarted_at: float
    ready_s: float  # restart -> the server accepts a WebSocket
    first_welcome_s: float | None = None  # restart -> the first welcome any phone got
    welcomes: int = 0  # welcomes until the next kill
    resumed: int = 0  # of those, on a phone that had a conversation, which it got back
    new: int = 0  # reconnects that got another conversation


def add_parser(subparsers: Any) -> None:
    """`stillhere-bench crash`."""
    parser = subparsers.add_parser("crash", help=DESCRIPTION, description=DESCRIPTION)
    add_options(parser)
    parser.set_defaults(run=run)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs in the run (20)")
    add_fleet_options(parser, clients=20, think_s=1.0, flap_every_s=5.0)
    parser.add_argument("--seed", type=int, default=1, help="seeds the kills and the phones")
    parser.add_argument(
        "--up", type=seconds, nargs=2, default=(2.0, 8.0), metavar=("MIN", "MAX"),
        help="a kill comes this long after the server is ready, uniform (2s 8s)",
    )  # fmt: skip
    parser.add_argument(
        "--backoff-cap", type=seconds, default=2.0, help="longest reconnect wait (2s)"
    )
    parser.add_argument(
        "--settle-timeout", type=seconds, default=120.0, help="bound on the final settling"
    )
    add_rehearsal_options(parser)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "crash")
    parser.add_argument("--timeout", type=seconds, default=3600.0, help="bound on the run (1h)")


async def _kill_and_restart(
    server: procs.Server, root: Path, args: argparse.Namespace
) -> tuple[procs.Server, Crash]:
    loop = asyncio.get_running_loop()
    killed_at = now()
    server.proc.kill()
    await loop.run_in_executor(None, server.proc.wait)
    restarted_at = now()
    server = _start(root, args, server.port)
    ready_s = await procs.wait_ready(server)
    return server, Crash(killed_at, restarted_at, round(ready_s, 3))


def _start(root: Path, args: argparse.Namespace, port: int | None = None) -> procs.Server:
    return procs.start(
        "stillhere", root, latency=args.rehearsal_latency, rate=args.rehearsal_rate, port=port
    )


async def _crashes(
    fleet: Fleet, server: procs.Server, root: Path, args: argparse.Namespace
) -> tuple[procs.Server, list[Crash]]:
    """Kill and restart the server `--kills` times at seeded instants while the phones talk."""
    rng = random.Random(args.seed)
    crashes: list[Crash] = []
    fleet.start_scripts(now() + FOREVER_S)
    try:
        for _ in range(args.kills):
            await asyncio.sleep(rng.uniform(*args.up))
            server, crash = await _kill_and_restart(server, root, args)
            crashes.append(crash)
        await asyncio.sleep(max(args.up))  # the last restart's phones come back
    finally:
        await fleet.stop_scripts()
    return server, crashes


def _per_restart(fleet: Fleet, crashes: list[Crash]) -> None:
    """Each restart's welcomes, until the next kill."""
    ends = [c.killed_at for c in crashes[1:]] + [float("inf")]
    for crash, end in zip(crashes, ends, strict=True):
        seen = [w for w in fleet.ledger.welcomes if crash.restarted_at <= w.at < end]
        if seen:
            crash.first_welcome_s = round(min(w.at for w in seen) - crash.restarted_at, 3)
        crash.welcomes = len(seen)
        back = [w for w in seen if w.reconnect]
        crash.resumed = sum(1 for w in back if w.resumed and w.conversation == w.expected)
        crash.new = len(back) - crash.resumed


def _lost_replies(fleet: Fleet, crashes: list[Crash]) -> dict[str, Any]:
    """Says that never got a whole reply, each counted against the first kill after it."""
    ledger = fleet.ledger
    answered = {i for r in ledger.replies.values() if r.ends > 0 for i in r.in_reply_to}
    per: Counter[tuple[int, int]] = Counter()  # (crash, phone) -> replies lost
    without_crash = 0
    kills = [c.killed_at for c in crashes]
    for say in ledger.says.values():
        if say.id in answered:
            continue
        after = [k for k, at in enumerate(kills) if at >= say.at]
        if after:
            per[(after[0], say.phone)] += 1
        else:
            without_crash += 1
    return {
        "replies_lost": sum(per.values()) + without_crash,
        "replies_lost_max_per_crash_and_phone": max(per.values(), default=0),
        "replies_lost_without_a_crash": without_crash,
    }


def _cut_replies(fleet: Fleet) -> dict[str, int]:
    """Whole replies whose deltas do not join to their `reply.end`: cut by a crash when the
    deltas that came are the start of the text (the deltas after them died with the process;
    the `reply.end`, stored, was replayed whole), broken otherwise."""
    cut = broken = 0
    for reply in fleet.ledger.replies.values():
        if reply.starts != 1 or reply.ends != 1:
            continue
        joined, text = "".join(reply.deltas), reply.end_text or ""
        if joined != text:
            if text.startswith(joined):
                cut += 1
            else:
                broken += 1
    return {"replies_cut_by_a_crash": cut, "broken_replies": broken}


async def back_since(fleet: Fleet, last_kill: float, timeout: float) -> int:
    """Wait until every phone is up with its outbox empty and every say answered but those
    acked before the last kill (a reply lost in a crash leaves its say unanswered for good:
    that is counted, not waited for); how many were not.

    A say is judged by its first ack, not by when it was made: one queued while its phone
    was cut off and acked by the server that came back is answered by that server, however
    long before the kill the phone wrote it."""
    ledger = fleet.ledger

    def excused(id_: str) -> bool:
        acked = ledger.ack_at.get(id_)
        return acked is not None and acked < last_kill

    def back(run: Any) -> bool:
        phone = run.phone
        return (
            phone is not None
            and phone.state is LinkState.UP
            and not phone.outbox
            and all(excused(i) for i in ledger.pending[run.index])
        )

    deadline = now() + timeout
    while now() < deadline and not all(back(r) for r in fleet.runs):
        await asyncio.sleep(0.25)
    return sum(1 for r in fleet.runs if not back(r))


def ledger_figures(fleet: Fleet, stored: Stored) -> dict[str, Any]:
    """What the phones' ledger and the database say of every say, reply and seq: the
    counts a run that stops or moves servers under the phones must keep at 0."""
    verdict = fleet.ledger.verdict(stored.rows, stored.answered)
    return {
        "says": verdict["says"],
        "replies": verdict["replies"],
        "acked_says_lost": verdict["acked_not_stored"],
        "says_never_acked": verdict["lost_says"],
        "stored_twice": verdict["stored_twice"],
        "stored_wrong_person": stored.wrong_person,
        "answered_in_db_twice": verdict["answered_in_db_twice"],
        "seq_repeated": verdict["duplicated_events"],
        "out_of_order_events": verdict["out_of_order_events"],
        "duplicated_says": verdict["duplicated_says"],
        "duplicated_replies": verdict["duplicated_replies"],
        "seq_gaps": verdict["lost_events"],  # numbering jumps past a block after each crash
        "reconnects": verdict["reconnects"],
        "resumed": verdict["resumed"],
        "new_conversations_unexpected": verdict["new_conversations_unexpected"],
        "link_events": dict(fleet.kinds),
        "phone_failures": dict(fleet.failures),
        "error_frames": verdict["error_frames"],
        "unexpected_frames": verdict["unexpected_frames"],  # e.g. an ack before a welcome
        "examples": verdict["examples"],
    }


def figures(fleet: Fleet, stored: Stored, crashes: list[Crash]) -> dict[str, Any]:
    _per_restart(fleet, crashes)
    firsts = [c.first_welcome_s for c in crashes if c.first_welcome_s is not None]
    return {
        "kills": len(crashes),
        **ledger_figures(fleet, stored),
        **_cut_replies(fleet),
        **_lost_replies(fleet, crashes),
        "restarts_without_a_welcome": sum(1 for c in crashes if c.first_welcome_s is None),
        "restart_to_first_welcome_s": percentiles(firsts),
        "restart_to_ready_s": percentiles([c.ready_s for c in crashes]),
        "crashes": [asdict(c) for c in crashes],
    }


# Counts that must be 0 for the run to pass; and the one bounded by 1 (the streaming reply).
MUST_BE_ZERO = (
    "acked_says_lost", "says_never_acked", "stored_twice", "stored_wrong_person",
    "answered_in_db_twice", "seq_repeated", "out_of_order_events", "duplicated_says",
    "duplicated_replies", "broken_replies", "replies_lost_without_a_crash",
    "new_conversations_unexpected", "restarts_without_a_welcome", "unsettled",
)  # fmt: skip


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="stillhere-crash-"))
    server = _start(root, args)
    try:
        async with asyncio.timeout(args.timeout):
            await procs.wait_ready(server)
            backoff = Backoff(first=0.2, cap=args.backoff_cap, jitter=0.5)
            fleet = Fleet(FleetOptions.of(args, server.base_url, backoff), args.clients)
            try:
                await fleet.ramp(50)
                server, crashes = await _crashes(fleet, server, root, args)
                last_kill = crashes[-1].killed_at if crashes else now()
                unsettled = await back_since(fleet, last_kill, args.settle_timeout)
            finally:
                await fleet.close()
            assert server.pgdata is not None and server.data_dir is not None
            stored = await stillhere_stored(server.pgdata, server.data_dir, fleet.said_by())
            report = figures(fleet, stored, crashes)
            report["unsettled"] = unsettled
            report["seed"] = args.seed
            report["clients"] = args.clients
            return report
    finally:
        await procs.stopped(server)
        shutil.rmtree(root, ignore_errors=True)


def problems(report: dict[str, Any]) -> list[str]:
    found = [f"{key} = {report[key]}" for key in MUST_BE_ZERO if report[key]]
    if report["replies_lost_max_per_crash_and_phone"] > 1:
        found.append("more than the streaming reply lost in one crash")
    if report["kills"] < 1:
        found.append("no kill happened")
    return found


def table(report: dict[str, Any]) -> str:
    def p(key: str) -> str:
        q = report[key]
        return f"p50 {q['p50']} s, p99 {q['p99']} s (n {q['n']})"

    per = report["crashes"]
    return "\n".join(
        [
            f"kills                       {report['kills']} (seed {report['seed']}, "
            f"{report['clients']} phones)",
            f"says, replies               {report['says']}, {report['replies']}",
            f"acked says lost             {report['acked_says_lost']}",
            f"says stored twice           {report['stored_twice']}",
            f"seq repeated                {report['seq_repeated']}",
            f"replies lost                {report['replies_lost']} (at most "
            f"{report['replies_lost_max_per_crash_and_phone']} per crash and phone)",
            f"reconnects resumed          {report['resumed']} of {report['reconnects']}",
            "resumed per restart         " + " ".join(str(c["resumed"]) for c in per),
            f"restart -> first welcome    {p('restart_to_first_welcome_s')}",
            f"restart -> accepting        {p('restart_to_ready_s')}",
        ]
    )


async def run(args: argparse.Namespace) -> int:
    """0 when no crash lost, repeated or duplicated anything; 1 if one did; 2 if the run
    could not finish."""
    return await procs.finish("crash", measure(args), args, table, _exit_code)


def _exit_code(report: dict[str, Any]) -> int:
    """1, with the problems and examples of each printed, when a crash cost too much."""
    return problems_exit_code(problems(report), report)


def problems_exit_code(found: list[str], report: dict[str, Any]) -> int:
    """1, with `found` and the ledger's examples of each kind printed, if anything was
    found; else 0. Shared by the benches that keep a phones' ledger."""
    if found:
        print("problems:\n  " + "\n  ".join(found))
        for kind, seen in report["examples"].items():
            print(f"  e.g. {kind}: " + "; ".join(seen[:3]))
    return 1 if found else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.crash", description=DESCRIPTION)
    add_options(parser)
    return run_on_loop(run(parser.parse_args(argv)), "asyncio")


if __name__ == "__main__":
    sys.exit(main())
