"""`stillhere-bench failover`: PostgreSQL's primary killed under load, its standby promoted.

Two phases, in one run:

- **cost**: two `stillhere cluster`s at once, `--nodes` nodes each, one with a synchronous
  standby (`--standby`) and one without; the flap bench's throughput phase (M phones x K
  says, zero-latency rehearsal model) goes through each one's HAProxy in turn, round after
  round. Per cluster: turns/s, turn time p50/p99, and CPU ms per turn of the nodes, the
  primary PostgreSQL and the standby's. The difference is what an ack on two disks costs.
- **failover** (`--runs` times, each on a fresh cluster with a standby): flap-bench phones
  through HAProxy flap and talk; at a random instant of `--window` (seeded) the primary's
  postmaster is killed with SIGKILL, as when its machine dies; after `--detect` (the
  operator's tooling noticing) `stillhere db --promote` promotes the standby. The phones
  resend what was not acked. Reported: how long past the promotion a say waited for its
  ack, p50 and p99 (says whose link dropped before their reply left out: that wait is the
  tunnel's); phones that came back to another conversation than theirs (0); and the crash
  bench's ledger against the promoted standby: acked says lost, stored twice, seq
  repeated, all 0.

    stillhere-bench failover --runs 3 --clients 20 --json /tmp/failover.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import subprocess
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from actors.clock import parse_duration as seconds
from bench import flap_cluster, flap_throughput, procs, results
from bench.cluster_kill import fleet, ledgers
from bench.crash import FOREVER_S, back_since
from bench.flap import percentiles
from bench.flap_phones import Fleet, add_fleet_options, now
from bench.flap_throughput import Throughput, in_turn

DESCRIPTION = "PostgreSQL's primary killed (SIGKILL) under load, its synchronous standby promoted"
PROMOTE_TIMEOUT_S = 120.0
RESUME_P99_TARGET_S = 10.0  # a say's wait for its ack past the promotion
MUST_BE_ZERO = (
    "acked_says_lost", "stored_twice", "stored_wrong_person", "seq_repeated",
    "phones_lost_conversation", "unsettled",
)  # fmt: skip
SIDES = ("nodes", "postgres", "standby")


def add_parser(subparsers: Any) -> None:
    """`stillhere-bench failover`."""
    parser = subparsers.add_parser("failover", help=DESCRIPTION, description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--nodes", type=int, default=2, help="nodes of each cluster (2)")
    parser.add_argument("--runs", type=int, default=3, help="failovers, each on a new cluster")
    add_fleet_options(parser, clients=20, think_s=1.0, flap_every_s=5.0)
    parser.add_argument("--seed", type=int, default=1, help="seeds the phones and the instants")
    parser.add_argument("--warm", type=seconds, default=10.0, help="talk before the window")
    parser.add_argument(
        "--window", type=seconds, default=10.0, help="the kill comes at a random instant of it"
    )
    parser.add_argument(
        "--detect", type=seconds, default=2.0, help="from the kill to the promotion (2s)"
    )
    parser.add_argument("--after", type=seconds, default=20.0, help="talk after the promotion")
    parser.add_argument(
        "--backoff-cap", type=seconds, default=2.0, help="longest reconnect wait (2s)"
    )
    parser.add_argument("--store-timeout", type=seconds, default=2.0, help="the nodes' (2s)")
    parser.add_argument(
        "--settle-timeout", type=seconds, default=120.0, help="bound on the final settling"
    )
    flap_throughput.add_options(parser, phones=20, says=50, rounds=3, warmup=3)  # the cost
    parser.add_argument("--no-cost", action="store_true", help="skip the cost phase")
    parser.add_argument("--event-loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    results.add_option(parser, "failover")
    parser.add_argument("--timeout", type=seconds, default=3600.0, help="bound on the run")
    # The fleet's rehearsal model: fast enough that says come often, paced like a reply.
    parser.set_defaults(run=run, rehearsal_latency=0.05, rehearsal_rate=200.0)


def start(root: Path, args: argparse.Namespace, *, standby: bool, serve: list[str]) -> procs.Server:
    options = ["--standby"] if standby else []
    return flap_cluster.start(root, args.nodes, args.event_loop, serve, options)


def standby_pgdata(cluster: procs.Server) -> Path:
    assert cluster.data_dir is not None
    return cluster.data_dir / "standby" / "pgdata"


def readings(cluster: procs.Server, nodes: int) -> dict[str, float]:
    """The nodes' and the primary's CPU seconds so far (flap_cluster's), and the standby's."""
    out = {k: v for k, v in flap_cluster.readings(cluster, nodes).items() if k in SIDES}
    out["standby"] = postgres_cpu_s(standby_pgdata(cluster))
    return out


def postgres_cpu_s(pgdata: Path) -> float:
    """CPU seconds of the postmaster of `pgdata` and its processes; 0 if none runs."""
    try:
        postmaster = psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0]))
        return sum(float(sum(p.cpu_times()[:2])) for p in [postmaster, *postmaster.children()])
    except (OSError, ValueError, psutil.Error):
        return 0.0


def cost_figures(rounds: list[Throughput]) -> dict[str, Any]:
    timed = [r for r in rounds if r.turns and r.seconds > 0]
    per_turn = {
        side: sorted(r.readings_s[side] / r.turns * 1000 for r in timed)[len(timed) // 2]
        for side in SIDES
    }
    return {
        "turns_per_s": round(sorted(r.turns / r.seconds for r in timed)[len(timed) // 2], 1),
        "turn_ms": percentiles([ms for r in timed for ms in r.turn_ms]),
        "cpu_ms_per_turn": {side: round(ms, 3) for side, ms in per_turn.items()},
        "errors": sum(sum(r.errors.values()) for r in rounds),
    }


async def cost(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Throughput rounds through a cluster with a synchronous standby and one without."""
    serve = list(flap_cluster.NODE_OPTIONS)
    clusters = {
        label: start(root / label.replace(" ", "-"), args, standby=label == "standby", serve=serve)
        for label in ("no standby", "standby")
    }
    try:
        for cluster in clusters.values():
            await flap_cluster.wait_ready(cluster, args.nodes)
        targets = {
            label: (cluster.base_url, partial(readings, cluster, args.nodes))
            for label, cluster in clusters.items()
        }
        rounds = await in_turn(targets, args, "failover cost")
    finally:
        for cluster in clusters.values():
            await asyncio.to_thread(procs.stop, cluster)
    figures = {label: cost_figures(rounds[label]) for label in clusters}
    one, two = (figures[label]["turns_per_s"] for label in clusters)
    return {"by_cluster": figures, "turns_ratio": round(two / one, 3) if one else None}


async def promote(cluster: procs.Server) -> int:
    assert cluster.data_dir is not None
    command = [procs.stillhere_command(), "db", "--promote", "--data"]
    proc = await asyncio.create_subprocess_exec(
        *command, str(cluster.data_dir / "standby"), stdout=subprocess.DEVNULL
    )
    async with asyncio.timeout(PROMOTE_TIMEOUT_S):
        return await proc.wait()


def kill_primary(cluster: procs.Server) -> None:
    assert cluster.pgdata is not None
    postmaster = psutil.Process(int((cluster.pgdata / "postmaster.pid").read_text().split()[0]))
    for process in [postmaster, *postmaster.children()]:
        process.kill()


def ack_waits(phones: Fleet, since: float) -> list[float]:
    """For each say acked after `since` (the promotion), seconds from `since` or from the
    say if later, to its ack: how long PostgreSQL's absence held it. Says whose link
    dropped before their reply are left out: their wait is the phone's tunnel's."""
    ledger = phones.ledger
    return [
        at - max(since, say.at)
        for id_, at in ledger.ack_at.items()
        if at > since
        and (say := ledger.says.get(id_)) is not None
        and say.link_up
        and not say.dropped_meanwhile
    ]


def lost_conversation(phones: Fleet, since: float) -> int:
    """Phones that, reconnecting after `since`, were welcomed into another conversation
    than the one they had (a phone whose link stayed up kept its conversation)."""
    return len(
        {
            w.phone
            for w in phones.ledger.welcomes
            if w.at > since and w.reconnect and w.conversation != w.expected
        }
    )


async def fail_over(args: argparse.Namespace, root: Path, run: int) -> dict[str, Any]:
    serve = ["--rehearsal-latency", f"{args.rehearsal_latency}s"]
    serve += [
        "--rehearsal-rate",
        str(args.rehearsal_rate),
        "--store-timeout",
        f"{args.store_timeout}s",
    ]
    cluster = start(root / f"run-{run}", args, standby=True, serve=serve)
    rng = random.Random(args.seed * 1000 + run)
    phones = fleet(args, cluster.base_url, args.clients, args.seed + run)
    try:
        await flap_cluster.wait_ready(cluster, args.nodes)
        await phones.ramp(50)
        phones.start_scripts(now() + FOREVER_S)
        await asyncio.sleep(args.warm + rng.uniform(0, args.window))
        killed = now()
        await asyncio.to_thread(kill_primary, cluster)
        await asyncio.sleep(args.detect)
        promoted_code, promoted = await promote(cluster), now()
        await asyncio.sleep(args.after)
        await phones.stop_scripts()
        unsettled = await back_since(phones, killed, args.settle_timeout)
        await phones.close()
        ledger = await ledgers(cluster, [phones], standby_pgdata(cluster))  # the new primary
    finally:
        await phones.close()
        await asyncio.to_thread(procs.stop, cluster)
    return {
        "kill_at_s": round(killed, 2),
        "promote_exit": promoted_code,
        "promoted_after_s": round(promoted - killed, 2),
        "ack_wait_after_promotion_s": percentiles(ack_waits(phones, promoted)),
        "phones": len(phones.runs),
        "phones_lost_conversation": lost_conversation(phones, killed),
        "unsettled": unsettled,
        "ledger": ledger,
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="stillhere-failover-"))
    try:
        async with asyncio.timeout(args.timeout):
            report: dict[str, Any] = {"cost": None if args.no_cost else await cost(args, root)}
            report["runs"] = [await fail_over(args, root, run) for run in range(args.runs)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.update(nodes=args.nodes, clients=args.clients, seed=args.seed, detect_s=args.detect)
    report["summary"] = summary(report["runs"])
    return report


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the runs: the ledger's counts added up, the waits' median and worst run."""
    waits = [got["ack_wait_after_promotion_s"] for got in runs]
    p99s = sorted(w["p99"] for w in waits if w["p99"] is not None)
    p50s = sorted(w["p50"] for w in waits if w["p50"] is not None)
    promoted = sorted(got["promoted_after_s"] for got in runs)
    return {
        **{key: sum(got["ledger"][key] for got in runs) for key in MUST_BE_ZERO[:4]},
        "phones_lost_conversation": sum(got["phones_lost_conversation"] for got in runs),
        "unsettled": sum(got["unsettled"] for got in runs),
        "says": sum(got["ledger"]["says"] for got in runs),
        "wait_p50_s": p50s[len(p50s) // 2] if p50s else None,
        "wait_p99_s": p99s[len(p99s) // 2] if p99s else None,
        "wait_p99_worst_s": p99s[-1] if p99s else None,
        "promoted_after_s": promoted[len(promoted) // 2] if promoted else None,
    }


def problems(report: dict[str, Any]) -> list[str]:
    found = []
    for i, got in enumerate(report["runs"], 1):
        counts = {**got["ledger"], **got}
        found += [f"run {i}: {key} = {counts[key]}" for key in MUST_BE_ZERO if counts[key]]
        if got["promote_exit"] != 0:
            found.append(f"run {i}: stillhere db --promote exited {got['promote_exit']}")
        p99 = got["ack_wait_after_promotion_s"]["p99"]
        if p99 is None or p99 > RESUME_P99_TARGET_S:
            found.append(
                f"run {i}: promotion -> first ack p99 {p99} s, target {RESUME_P99_TARGET_S}"
            )
    return found


def table(report: dict[str, Any]) -> str:
    lines = [f"{report['nodes']} nodes behind HAProxy, {report['clients']} flapping phones"]
    if report["cost"] is not None:
        for label, got in report["cost"]["by_cluster"].items():
            cpu, turn = got["cpu_ms_per_turn"], got["turn_ms"]
            lines.append(
                f"{label:<11} {got['turns_per_s']} turns/s, turn p50 {turn['p50']} ms p99 "
                f"{turn['p99']} ms; CPU ms/turn nodes {cpu['nodes']}, primary "
                f"{cpu['postgres']}, standby {cpu['standby']}"
            )
        lines.append(f"standby / no standby, turns/s: {report['cost']['turns_ratio']}")
    for i, got in enumerate(report["runs"], 1):
        ack, ledger = got["ack_wait_after_promotion_s"], got["ledger"]
        lines.append(
            f"run {i}: promoted {got['promoted_after_s']} s after the kill; a say's wait past "
            f"it p50 {ack['p50']} s p99 {ack['p99']} s (n {ack['n']}); phones "
            f"given another conversation {got['phones_lost_conversation']} of {got['phones']}; "
            f"acked lost {ledger['acked_says_lost']}"
            f" of {ledger['says']}, stored twice {ledger['stored_twice']}, seq repeated "
            f"{ledger['seq_repeated']}"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    """0 when no failover lost or doubled anything and the target held; 1 if not; 2 if the
    run could not finish."""
    return await procs.finish(
        "failover",
        measure(args),
        args,
        table,
        lambda report: procs.exit_code(problems(report)),
    )
