"""`stillhere-bench flap --cluster N`, small: two real clusters (1 node and 2) behind
Debian's HAProxy, every turn answered, every side's CPU read. No timing is asserted: the
figures are the bench's to report (bench/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import flap, flap_cluster
from tests.test_deploy import needs_haproxy


@needs_haproxy
@pytest.mark.timeout(300)
async def test_the_cluster_bench_times_one_node_and_two_through_haproxy(tmp_path: Path) -> None:
    args = flap.parse_args(
        [
            "--cluster", "2", "--throughput-phones", "10", "--throughput-says", "10",
            "--throughput-rounds", "2", "--throughput-warmup", "1", "--event-loop", "asyncio",
        ]
    )  # fmt: skip
    report = await flap_cluster.measure(args, tmp_path)

    assert list(report["by_nodes"]) == ["1 node", "2 nodes"]
    for label, got in report["by_nodes"].items():
        assert got["errors"] == 0, label
        assert len(got["rounds_turns_per_s"]) == 2 and got["turns_per_s"] > 0, label
        for side in ("nodes", "postgres", "bench"):  # (HAProxy's may be under a clock tick)
            assert got["cpu_ms_per_turn"][side] > 0, (label, side)
        # Every core of the machine is accounted for over a round: each node's, HAProxy's,
        # PostgreSQL's, the phones', other processes', the hypervisor's steal and idle.
        nodes = [f"node-{i}" for i in range(1, (2 if label == "2 nodes" else 1) + 1)]
        parts = [*nodes, "haproxy", "postgres", "phones", "others", "steal", "idle"]
        assert list(got["cores"]) == parts, label
        # (A node may be idle in so short a round: the conversations' routing chose the other.)
        assert sum(got["cores"][node] for node in nodes) > 0, label
        # None is left out. The processes' readings, each to a clock tick, may sum above the
        # machine's busy time in so short a round (then "others" is 0), so no upper bound.
        assert sum(got["cores"].values()) >= 0.8 * report["cores"], label
    assert report["turns_ratio"] > 0
    printed = flap_cluster.table(report)
    assert "2 nodes / 1 node, turns/s:" in printed and "node-2 " in printed
    for cluster in ("n1", "n2"):  # each stopped cleanly, its PostgreSQL with it
        log = (tmp_path / cluster / "cluster.log").read_text()
        assert "cluster stopped" in log and "embedded PostgreSQL stopped" in log


def test_the_cluster_bench_needs_two_nodes_or_more() -> None:
    with pytest.raises(SystemExit):
        flap.parse_args(["--cluster", "1"])
