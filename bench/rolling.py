"""`stillhere-bench rolling`: every node of a cluster restarted in turn, under load.

Starts `stillhere cluster --nodes N` (the embedded PostgreSQL, N nodes, HAProxy in front),
brings up the flap bench's phones through HAProxy (reference clients; by default on links
that do not flap, so that every interruption a phone sees is the restarts') and restarts
each node in turn: SIGTERM (the node drains, transport/drain.py), wait for it to exit, let
the cluster start it again, wait until it serves, `--between`, then the next node. The
phones' ledger (`bench.flap_ledger`) and the database then say what the rolling restart
cost:

- acked says lost, says stored twice, seqs repeated, says never answered: must be 0;
- every reconnect resumed its conversation, every phone was moved and resumed, every
  phone is up at the end;
- each phone's longest interruption (its link down until up again), p50/p99: target p99
  at most 2 s.

    stillhere-bench rolling --nodes 3 --clients 60 --json /tmp/rolling.json
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from actors.clock import parse_duration as seconds
from bench import procs, results
from bench.crash import FOREVER_S, back_since, ledger_figures, problems_exit_code
from bench.flap import add_rehearsal_options, percentiles
from bench.flap_cluster import start, wait_ready
from bench.flap_db import Stored, stillhere_stored
from bench.flap_phones import BenchPhone, Fleet, FleetOptions, PhoneRun, add_fleet_options, now
from client import Backoff, LinkState
from providers.event_loop import run as run_on_loop

DESCRIPTION = "every node of a cluster restarted in turn (SIGTERM) while phones talk"
STOP_TIMEOUT_S = 60.0  # a node drains within its --drain-timeout (10 s) and exits


@dataclass
class Restart:
    node: str
    term_at: float
    drain_s: float  # SIGTERM -> the process exited
    back_s: float  # exited -> the node, started again by the cluster, accepts a WebSocket


class TimedFleet(Fleet):
    """The fleet, with each phone's interruptions: from its link going down to up again."""

    def __init__(self, options: FleetOptions, n: int) -> None:
        super().__init__(options, n)
        self.run_of: dict[int, int] = {}  # id(phone) -> its run's index
        self.down_since: dict[int, float] = {}  # id(phone) -> when its link went down
        self.interruptions: list[tuple[int, float, float]] = []  # (phone, from, seconds)

    def _new_phone(self, run: PhoneRun) -> BenchPhone:
        phone = super()._new_phone(run)
        self.run_of[id(phone)] = run.index
        return phone

    def _on_state(self, phone: BenchPhone, state: LinkState) -> None:
        was_up = phone.bench_up
        super()._on_state(phone, state)
        if was_up and not phone.bench_up:
            self.down_since[id(phone)] = now()
        elif not was_up and phone.bench_up and id(phone) in self.down_since:
            since = self.down_since.pop(id(phone))
            self.interruptions.append((self.run_of[id(phone)], since, now() - since))


def add_parser(subparsers: Any) -> None:
    """`stillhere-bench rolling`."""
    parser = subparsers.add_parser("rolling", help=DESCRIPTION, description=DESCRIPTION)
    add_options(parser)
    parser.set_defaults(run=run)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3, help="nodes in the cluster (3)")
    add_fleet_options(parser, clients=60, think_s=1.0, flap_every_s=FOREVER_S)
    parser.add_argument("--seed", type=int, default=1, help="seeds the phones")
    parser.add_argument(
        "--before", type=seconds, default=5.0, help="phones talking before the first restart (5s)"
    )
    parser.add_argument(
        "--between", type=seconds, default=3.0,
        help="after a node is back, before the next one is restarted (3s)",
    )  # fmt: skip
    parser.add_argument(
        "--backoff-cap", type=seconds, default=2.0, help="longest reconnect wait (2s)"
    )
    parser.add_argument(
        "--settle-timeout", type=seconds, default=120.0, help="bound on the final settling"
    )
    add_rehearsal_options(parser)
    parser.add_argument("--event-loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "rolling")
    parser.add_argument("--timeout", type=seconds, default=1800.0, help="bound on the run (30m)")


async def restart(cluster: procs.Server, index: int) -> Restart:
    """SIGTERM node `index`, wait for it to exit and to serve again (the cluster restarts
    it after its first pause)."""
    loop = asyncio.get_running_loop()
    name = f"node-{index}"
    process = procs.node_process(cluster, name)
    term_at = now()
    process.terminate()
    await loop.run_in_executor(None, process.wait, STOP_TIMEOUT_S)
    exited_at = now()
    node = procs.Server(name, cluster.proc, cluster.port + index, None, cluster.log_path)
    await procs.wait_ready(node)
    return Restart(name, term_at, round(exited_at - term_at, 3), round(now() - exited_at, 3))


async def rolling(fleet: Fleet, cluster: procs.Server, args: argparse.Namespace) -> list[Restart]:
    """Every node restarted in turn while the phones talk."""
    restarts = []
    fleet.start_scripts(now() + FOREVER_S)
    try:
        await asyncio.sleep(args.before)
        for index in range(1, args.nodes + 1):
            restarts.append(await restart(cluster, index))
            await asyncio.sleep(args.between)
    finally:
        await fleet.stop_scripts()
    return restarts


def _phones(fleet: TimedFleet) -> dict[str, Any]:
    """Per phone: its longest interruption (0 if none), whether it was moved (got a
    welcome on a reconnect) and whether every reconnect resumed its conversation."""
    longest = dict.fromkeys(range(len(fleet.runs)), 0.0)
    for phone, _, gap in fleet.interruptions:
        longest[phone] = max(longest[phone], gap)
    back = [w for w in fleet.ledger.welcomes if w.reconnect]
    moved = {w.phone for w in back}
    not_resumed = {w.phone for w in back if not (w.resumed and w.conversation == w.expected)}
    return {
        "phones": len(fleet.runs),
        "phones_moved": len(moved),
        "phones_not_resumed": len(not_resumed),
        "phones_never_moved": len(fleet.runs) - len(moved),
        "longest_interruption_s": percentiles(list(longest.values())),
        "interruptions": len(fleet.interruptions),
    }


def figures(fleet: TimedFleet, stored: Stored, restarts: list[Restart]) -> dict[str, Any]:
    answered = {i for r in fleet.ledger.replies.values() if r.ends > 0 for i in r.in_reply_to}
    return {
        "restarts": len(restarts),
        **ledger_figures(fleet, stored),
        "says_never_answered": sum(1 for i in fleet.ledger.says if i not in answered),
        **_phones(fleet),
        "drain_s": percentiles([r.drain_s for r in restarts]),
        "per_restart": [asdict(r) for r in restarts],
    }


MUST_BE_ZERO = (
    "acked_says_lost", "says_never_acked", "says_never_answered", "stored_twice",
    "stored_wrong_person", "answered_in_db_twice", "seq_repeated", "out_of_order_events",
    "duplicated_says", "duplicated_replies", "new_conversations_unexpected",
    "phones_not_resumed", "phones_never_moved", "unsettled",
)  # fmt: skip
TARGET_P99_S = 2.0


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="stillhere-rolling-"))
    latency = ["--rehearsal-latency", f"{args.rehearsal_latency}s"]
    options = [*latency, "--rehearsal-rate", f"{args.rehearsal_rate}"]
    cluster = start(root, args.nodes, args.event_loop, options)
    try:
        async with asyncio.timeout(args.timeout):
            await wait_ready(cluster, args.nodes)
            backoff = Backoff(first=0.2, cap=args.backoff_cap, jitter=0.5)
            fleet = TimedFleet(FleetOptions.of(args, cluster.base_url, backoff), args.clients)
            try:
                await fleet.ramp(50)
                restarts = await rolling(fleet, cluster, args)
                unsettled = await back_since(fleet, restarts[-1].term_at, args.settle_timeout)
            finally:
                await fleet.close()
            assert cluster.pgdata is not None and cluster.data_dir is not None
            stored = await stillhere_stored(cluster.pgdata, cluster.data_dir, fleet.said_by())
            report = figures(fleet, stored, restarts)
            report.update(unsettled=unsettled, seed=args.seed, nodes=args.nodes)
            return report
    finally:
        await asyncio.get_running_loop().run_in_executor(None, procs.stop, cluster)
        shutil.rmtree(root, ignore_errors=True)


def problems(report: dict[str, Any]) -> list[str]:
    found = [f"{key} = {report[key]}" for key in MUST_BE_ZERO if report[key]]
    if report["restarts"] != report["nodes"]:
        found.append(f"{report['restarts']} restarts of {report['nodes']} nodes")
    return found


def table(report: dict[str, Any]) -> str:
    gap, drain = report["longest_interruption_s"], report["drain_s"]
    return "\n".join(
        [
            f"rolling restart             {report['nodes']} nodes, {report['phones']} phones "
            f"(seed {report['seed']})",
            f"says, replies               {report['says']}, {report['replies']}",
            f"acked says lost             {report['acked_says_lost']}",
            f"says stored twice           {report['stored_twice']}",
            f"seq repeated                {report['seq_repeated']}",
            f"says never answered         {report['says_never_answered']}",
            f"reconnects resumed          {report['resumed']} of {report['reconnects']}",
            f"phones moved, not resumed   {report['phones_moved']}, {report['phones_not_resumed']}",
            f"longest interruption/phone  p50 {gap['p50']} s, p99 {gap['p99']} s "
            f"(target p99 <= {TARGET_P99_S:g} s)",
            f"SIGTERM -> exit             p50 {drain['p50']} s, max of "
            f"{max(r['drain_s'] for r in report['per_restart'])} s",
        ]
    )


async def run(args: argparse.Namespace) -> int:
    """0 when the rolling restart lost, repeated or duplicated nothing and every phone
    resumed; 1 if not; 2 if the run could not finish."""
    return await procs.finish("rolling", measure(args), args, table, _exit_code)


def _exit_code(report: dict[str, Any]) -> int:
    return problems_exit_code(problems(report), report)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rolling", description=DESCRIPTION)
    add_options(parser)
    return run_on_loop(run(parser.parse_args(argv)), "asyncio")


if __name__ == "__main__":
    sys.exit(main())
