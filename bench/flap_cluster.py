"""`stillhere-bench flap --cluster N`: what N nodes behind HAProxy give against one node.

Two `stillhere cluster`s run at once on this machine, one with a single node and one with
N, each with its own embedded PostgreSQL and HAProxy, so the two differ only in the number
of nodes. The fixed throughput phase (bench/flap_throughput.py: M phones, K says each,
zero-latency rehearsal model) goes through each one's HAProxy in turn, round after round,
so each round finds the machine as the other did. Per cluster: turns/s (the median round)
and the CPU milliseconds per turn of the nodes, HAProxy, PostgreSQL and the phones (this
process); and how the machine's cores were spent over the rounds: each node's, HAProxy's,
PostgreSQL's, the phones', the other processes' (work sharing the machine), the hypervisor's
steal and what stayed idle. Idle near zero means the machine, not the nodes, set the pace;
the phones at a core or more, that they did.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from bench import procs, results
from bench.flap_throughput import Throughput, in_turn

# The nodes' options in the throughput phase, as bench flap gives its single server: a
# zero-latency model, and the per-link frame limit out of the way.
NODE_OPTIONS = ["--rehearsal-latency", "0s", "--rehearsal-rate", "0"]
NODE_OPTIONS += ["--frames-per-s", "100000", "--frame-burst", "100000"]
# The phones used this share of a core or more: they may be what limits turns/s.
PHONES_BOUND_CORES = 0.9
SIDES = ("nodes", "haproxy", "postgres", "bench")
# The machine's CPU seconds (psutil.cpu_times, all cores): busy (guests are counted in user
# time already), taken by the hypervisor, idle (waiting on a disk included).
MACHINE = ("busy", "steal", "idle")


def start(
    root: Path,
    nodes: int,
    event_loop: str,
    serve: Sequence[str] = NODE_OPTIONS,
    options: Sequence[str] = (),
) -> procs.Server:
    """`stillhere cluster --nodes NODES OPTIONS` in `root`, on free ports, not yet ready;
    `serve`: the nodes' options. With `--standby`, PostgreSQL and its standby take the two
    ports after the nodes'."""
    root.mkdir(parents=True, exist_ok=True)
    port = procs.free_ports(1 + 2 * nodes + 2 * ("--standby" in options))
    command = [procs.stillhere_command(), "cluster", "--nodes", str(nodes), "--port", str(port)]
    command += ["--data", str(root / "data"), *options]
    command += ["--", *serve, "--event-loop", event_loop]
    log_path = root / "cluster.log"
    proc = procs.spawn(command, log_path)
    return procs.Server(f"cluster-{nodes}", proc, port, root / "data", log_path)


async def wait_ready(cluster: procs.Server, nodes: int) -> None:
    """Until HAProxy and every node behind it accept a WebSocket."""
    await procs.wait_ready(cluster)
    for i in range(1, nodes + 1):
        await procs.wait_ready(node(cluster, i))


def node(cluster: procs.Server, i: int) -> procs.Server:
    """node-`i` of `cluster`, reached directly (its port follows HAProxy's)."""
    return procs.Server(f"node-{i}", cluster.proc, cluster.port + i, None, cluster.log_path)


def readings(cluster: procs.Server, nodes: int) -> dict[str, float]:
    """CPU seconds so far of the nodes (together and each), HAProxy, PostgreSQL, this process
    (the phones), and of the machine."""
    out = dict.fromkeys((*SIDES, *node_names(nodes)), 0.0) | machine_s()
    out["bench"] = _cpu_s(psutil.Process())
    with contextlib.suppress(psutil.Error, OSError, ValueError):
        for child in cluster.ps().children():
            command = procs.command_line(child)
            if child.name() == "haproxy":
                out["haproxy"] += _cpu_s(child)
            elif "--node-id" in command:  # not a standby's `stillhere db`
                out["nodes"] += _cpu_s(child)
                out[command[command.index("--node-id") + 1]] += _cpu_s(child)
        assert cluster.pgdata is not None
        pid = int((cluster.pgdata / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        out["postgres"] = _cpu_s(postmaster) + sum(_cpu_s(c) for c in postmaster.children())
    return out


def node_names(nodes: int) -> list[str]:
    """The nodes' names, as `stillhere cluster` gives them (--node-id)."""
    return [f"node-{i}" for i in range(1, nodes + 1)]


def machine_s() -> dict[str, float]:
    """The machine's busy, stolen and idle CPU seconds so far, all cores together."""
    times = psutil.cpu_times()
    steal = getattr(times, "steal", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    guests = getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    return {"busy": sum(times) - idle - steal - guests, "steal": steal, "idle": idle}


def _cpu_s(process: psutil.Process) -> float:
    with contextlib.suppress(psutil.Error):
        times = process.cpu_times()
        return float(times.user + times.system)
    return 0.0


def cores(r: Throughput, nodes: int) -> dict[str, float]:
    """The cores each part of the machine used over a round, on average: each node,
    HAProxy, PostgreSQL, the phones, every other process, the hypervisor's steal, idle."""
    used = {part: r.readings_s[part] / r.seconds for part in (*node_names(nodes), *SIDES)}
    used["phones"] = used.pop("bench")
    ours = used.pop("nodes") + used["haproxy"] + used["postgres"] + used["phones"]
    used["others"] = max(0.0, r.readings_s["busy"] / r.seconds - ours)
    used |= {part: r.readings_s[part] / r.seconds for part in ("steal", "idle")}
    return used


def _median(values: list[float], digits: int) -> float | None:
    return round(sorted(values)[len(values) // 2], digits) if values else None


def figures(rounds: list[Throughput], nodes: int) -> dict[str, Any]:
    """Turns/s (the median round), CPU ms per turn of each side, the cores each part of the
    machine used (in the median round)."""
    timed = [r for r in rounds if r.turns and r.seconds > 0]
    phones_cores = _median([r.readings_s["bench"] / r.seconds for r in timed], 2)
    # One round's parts, so that they add up to the machine: the median round by turns/s.
    middle = sorted(timed, key=lambda r: r.turns / r.seconds)[len(timed) // 2] if timed else None
    return {
        "turns_per_s": _median([r.turns / r.seconds for r in timed], 1),
        "rounds_turns_per_s": [round(r.turns_per_s or 0.0, 1) for r in rounds],
        "cpu_ms_per_turn": {
            side: _median([r.readings_s[side] / r.turns * 1000 for r in timed], 3) for side in SIDES
        },
        "phones_cores": phones_cores,
        "cores": {part: round(v, 2) for part, v in cores(middle, nodes).items()} if middle else {},
        "phones_bound": phones_cores is not None and phones_cores >= PHONES_BOUND_CORES,
        "errors": sum(sum(r.errors.values()) for r in rounds),
    }


async def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Both clusters started at once, timed in turn; the report."""
    sizes = {"1 node": 1, f"{args.cluster} nodes": args.cluster}
    clusters = {label: start(root / f"n{n}", n, args.event_loop) for label, n in sizes.items()}
    try:
        for label, cluster in clusters.items():
            await wait_ready(cluster, sizes[label])
        targets = {
            label: (cluster.base_url, partial(readings, cluster, sizes[label]))
            for label, cluster in clusters.items()
        }
        rounds = await in_turn(targets, args, "cluster throughput")
    finally:
        for cluster in clusters.values():
            await procs.stopped(cluster)
    report: dict[str, Any] = {
        "cluster": args.cluster,
        "phones": args.throughput_phones,
        "says": args.throughput_says,
        "rounds": args.throughput_rounds,
        "cores": psutil.cpu_count(),
        "load_average": [round(x, 2) for x in psutil.getloadavg()],
        "by_nodes": {label: figures(rounds[label], sizes[label]) for label in clusters},
    }
    one, many = (report["by_nodes"][label]["turns_per_s"] for label in clusters)
    report["turns_ratio"] = round(many / one, 2) if one and many else None
    for label, got in report["by_nodes"].items():
        got["ceiling_turns_per_s"] = ceiling(got["cpu_ms_per_turn"], sizes[label], report["cores"])
    one, many = (report["by_nodes"][label]["ceiling_turns_per_s"] for label in clusters)
    report["ceiling_ratio"] = round(many / one, 2) if one and many else None
    return report


def ceiling(cpu_ms_per_turn: dict[str, float | None], nodes: int, cores: int) -> float | None:
    """The turns/s this cluster would reach with the machine to itself, from its CPU per
    turn: every core busy with its parts (nodes, HAProxy, PostgreSQL, phones), or each node
    on one core (a node's Python runs one thread at a time), whichever comes first."""
    if any(ms is None or ms <= 0 for ms in cpu_ms_per_turn.values()):
        return None
    whole = cores * 1000.0 / sum(cpu_ms_per_turn.values())  # type: ignore[arg-type]
    per_node = nodes * 1000.0 / cpu_ms_per_turn["nodes"]  # type: ignore[operator]
    return round(min(whole, per_node), 1)


def table(report: dict[str, Any]) -> str:
    lines = [
        f"cluster throughput: {report['phones']} phones x {report['says']} says, "
        f"{report['rounds']} rounds, through HAProxy, on {report['cores']} cores",
        f"{'':<10}{'turns/s':>9}  {'CPU ms per turn: nodes':>22}{'haproxy':>9}"
        f"{'postgres':>10}{'phones':>8}  {'phones cores':>12}",
    ]
    for label, got in report["by_nodes"].items():
        cpu = got["cpu_ms_per_turn"]
        bound = " (phones-bound)" if got["phones_bound"] else ""
        lines.append(
            f"{label:<10}{got['turns_per_s']!s:>9}  {cpu['nodes']!s:>22}{cpu['haproxy']!s:>9}"
            f"{cpu['postgres']!s:>10}{cpu['bench']!s:>8}  {got['phones_cores']!s:>12}{bound}"
        )
    lines.append(f"{report['cluster']} nodes / 1 node, turns/s: {report['turns_ratio']}")
    lines.append(f"cores used in the median round, of {report['cores']}:")
    for label, got in report["by_nodes"].items():
        used = got["cores"]
        lines.append(f"{label:<10}" + "  ".join(f"{k} {v}" for k, v in used.items()))
    lines.append(
        "with the machine to itself (from CPU per turn), turns/s: "
        + ", ".join(f"{k} {v['ceiling_turns_per_s']}" for k, v in report["by_nodes"].items())
        + f"; ratio {report['ceiling_ratio']}"
    )
    lines.append(f"load average at the end: {report['load_average']}")
    return "\n".join(lines)


async def run(args: argparse.Namespace, root: Path) -> int:
    """The cluster comparison, printed (and written to --json); 1 if a turn failed."""
    started = time.perf_counter()
    report = await measure(args, root)
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(table(report))
    results.save(args, report)
    return 1 if any(got["errors"] for got in report["by_nodes"].values()) else 0
