"""`stillhere cluster`: real PostgreSQL, real node processes and Debian's HAProxy in front.

Routes stick to one node and spread over all of them, a hello through HAProxy is welcomed
on every node with the one shared secret, a node killed with SIGKILL is started again and
served again, and SIGINT stops every process the cluster started."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import psutil
import pytest

from bench.procs import command_line, free_ports
from tests.conftest import INSTANT_OPTIONS
from tests.test_db_command import gone
from tests.test_deploy import HAPROXY, needs_haproxy
from tests.test_restart import ROOT, STILLHERE
from transport.identity import Identity

NODES = 2
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 90.0


@dataclass
class Cluster:
    proc: subprocess.Popen[bytes]
    port: int
    data: Path
    log: Path
    scheme: str = "http"  # https with --tls-cert

    @property
    def base(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def node(self, name: str) -> psutil.Process:
        """The live process of node `name`."""
        for child in psutil.Process(self.proc.pid).children():
            with_name = f"--node-id {name} " in " ".join(command_line(child)) + " "
            if with_name and not gone(child):
                return child
        raise LookupError(name)

    def postmaster(self) -> psutil.Process:
        pid = int((self.data / "pgdata" / "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)

    def everything(self) -> list[psutil.Process]:
        """The cluster, its children and the postmaster with its own."""
        top = psutil.Process(self.proc.pid)
        postmaster = self.postmaster()
        return [top, *top.children(recursive=True), postmaster, *postmaster.children()]


def start_cluster(
    tmp: Path, log_name: str = "cluster.log", *serve: str, options: Sequence[str] = ()
) -> Cluster:
    """`stillhere cluster OPTIONS` in `tmp`, ready; `serve`: options for every node's serve.
    With `--standby`, PostgreSQL and its standby take two more ports, after the nodes'."""
    port = free_ports(1 + 2 * NODES + 2 * ("--standby" in options))
    log = tmp / log_name
    with log.open("wb") as output:
        proc = subprocess.Popen(
            [
                str(STILLHERE),
                "cluster",
                "--nodes",
                str(NODES),
                "--port",
                str(port),
                "--data-dir",
                str(tmp / "data"),
                "--stop-timeout",
                "30s",
                *options,
                "--",
                *INSTANT_OPTIONS,  # the test's own options come after, and win
                *serve,
            ],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            cwd=ROOT,
        )
    cluster = Cluster(proc, port, tmp / "data", log, "https" if "--tls-cert" in options else "http")
    deadline = time.monotonic() + START_TIMEOUT_S
    while "cluster ready" not in cluster.output():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_cluster(cluster)
            raise AssertionError(f"the cluster did not come up:\n{cluster.output()}")
        time.sleep(0.2)
    return cluster


def every_node_in(cluster: Cluster) -> None:
    """Wait until HAProxy sends routes to every node: "cluster ready" means one node is up
    behind it, and HAProxy's checks bring in the others a moment apart."""
    seen: set[str] = set()
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(seen) < NODES:
        if time.monotonic() > deadline:
            stop_cluster(cluster)
            raise AssertionError(f"HAProxy reached only {sorted(seen)}:\n{cluster.output()}")
        url = f"{cluster.base}/readyz?r={uuid.uuid4().hex[:16]}"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                seen.add(answer.headers["X-Served-By"])
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)  # no node ready for an instant: HAProxy answers 503


def stop_cluster(cluster: Cluster) -> int:
    if cluster.proc.poll() is None:
        cluster.proc.send_signal(signal.SIGINT)
    try:
        return cluster.proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        for process in cluster.everything():
            process.kill()
        raise


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if HAPROXY is None:
        pytest.skip("HAProxy is not installed (apt-get install haproxy)")
    running = start_cluster(tmp_path_factory.mktemp("cluster"))
    every_node_in(running)
    yield running
    stop_cluster(running)


async def served_by(http: aiohttp.ClientSession, cluster: Cluster, route: str) -> str:
    """Which node answered `/readyz?r=route` through HAProxy (200 only)."""
    async with http.get(f"{cluster.base}/readyz", params={"r": route}) as answer:
        assert answer.status == 200, await answer.text()
        header = answer.headers["X-Served-By"]
        body = orjson.loads(await answer.read())
    if "node" in body:  # the node's own word, once /readyz carries it
        assert body["node"] == header
    return header


async def routes_to_each_node(http: aiohttp.ClientSession, cluster: Cluster) -> dict[str, str]:
    """A route that HAProxy sends to each node. A node's readiness may fail for an instant
    on a busy machine (its PostgreSQL check answers late): that route is skipped."""
    found: dict[str, str] = {}
    for _ in range(200):
        route = uuid.uuid4().hex[:16]
        with contextlib.suppress(AssertionError):
            found.setdefault(await served_by(http, cluster, route), route)
        if len(found) == NODES:
            return found
    raise AssertionError(f"routes reached only {sorted(found)}")


@needs_haproxy
async def test_a_route_sticks_to_one_node_and_routes_spread_over_all(cluster: Cluster) -> None:
    async with aiohttp.ClientSession() as http:
        first = {}
        for _ in range(40):
            route = uuid.uuid4().hex[:16]
            first[route] = await served_by(http, cluster, route)
        for route, node in first.items():
            assert await served_by(http, cluster, route) == node
    assert set(first.values()) == {f"node-{i}" for i in range(1, NODES + 1)}


@needs_haproxy
async def test_a_hello_through_haproxy_is_welcomed_on_every_node_with_one_secret(
    cluster: Cluster,
) -> None:
    """An account token made with the cluster's secret verifies on each node, and each
    credential is one person wherever it lands: the second node takes up the conversation
    the first one started, and answers a say in it."""
    token = Identity((cluster.data / "secret").read_text().strip()).issue("anna")
    async with aiohttp.ClientSession() as http:
        routes = await routes_to_each_node(http, cluster)
        for credential in ({"token": token}, {"device": "device-" + uuid.uuid4().hex}):
            conversations = set()
            for node, route in routes.items():
                url = f"ws://127.0.0.1:{cluster.port}/v1/ws?r={route}"
                async with http.ws_connect(url) as ws:
                    assert ws._response.headers["X-Served-By"] == node
                    await ws.send_json({"type": "hello", "v": 1, **credential})
                    welcome = await ws.receive_json(timeout=30)
                    assert welcome["type"] == "welcome", (node, welcome)
                    conversations.add(welcome["conversation"])
                    await ws.send_json({"type": "say", "id": node, "text": f"Hello {node}"})
                    async with asyncio.timeout(30):
                        while (await ws.receive_json())["type"] != "reply.end":
                            pass
            assert len(conversations) == 1, credential


@needs_haproxy
async def test_a_node_killed_is_started_again_and_served_again(cluster: Cluster) -> None:
    async with aiohttp.ClientSession() as http:
        route = (await routes_to_each_node(http, cluster))["node-1"]
        killed = cluster.node("node-1")
        killed.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert time.monotonic() < deadline, cluster.output()
            try:
                if await served_by(http, cluster, route) == "node-1":
                    break
            except AssertionError:
                pass  # no node ready for an instant: HAProxy answers 503
            await asyncio.sleep(0.2)
        assert cluster.node("node-1").pid != killed.pid
    assert "node-1 exited (signal SIGKILL); starting it again" in cluster.output()


@needs_haproxy
def test_sigint_stops_every_process_of_the_cluster(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    processes = cluster.everything()
    names = " ".join(p.name() for p in processes)
    assert "haproxy" in names and "postgres" in names
    assert stop_cluster(cluster) == 0
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert [p for p in alive if not gone(p)] == []
    out = cluster.output()
    order = [out.index(f"node-{i} stopped") for i in range(1, NODES + 1)]
    assert max(order) < out.index("haproxy stopped") < out.index("embedded PostgreSQL stopped")


def refused(tmp_path: Path, *options: str) -> str:
    """`stillhere cluster OPTIONS` exits 2 having started nothing; what it said."""
    done = subprocess.run(
        [str(STILLHERE), "cluster", "--data", str(tmp_path / "data"), *options],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert not (tmp_path / "data").exists()
    return done.stderr


def test_a_missing_haproxy_is_a_clear_error_and_starts_nothing(tmp_path: Path) -> None:
    said = refused(tmp_path, "--haproxy", str(tmp_path / "no-haproxy"))
    assert "apt-get install haproxy" in said


def test_options_the_cluster_sets_are_refused_after_the_separator(tmp_path: Path) -> None:
    said = refused(tmp_path, "--", "--rehearsal-rate", "0", "--secret=visible", "--port", "1")
    assert "the cluster sets --port, --secret itself" in said


@needs_haproxy
def test_a_cluster_killed_leaves_no_node_and_the_next_one_adopts_its_postgresql(
    tmp_path: Path,
) -> None:
    """SIGKILL gives the cluster no time to stop anything: its nodes and HAProxy are told by
    the kernel (SIGTERM) and exit; PostgreSQL, a daemon of its own, is left running, and the
    next cluster on the same folder adopts it and stops it on its own clean stop."""
    first = start_cluster(tmp_path, "first.log")
    children = psutil.Process(first.proc.pid).children()
    postmaster = first.postmaster()
    first.proc.kill()
    first.proc.wait(STOP_TIMEOUT_S)
    _, alive = psutil.wait_procs(children, timeout=STOP_TIMEOUT_S)
    assert [p for p in alive if not gone(p)] == []
    assert postmaster.is_running()
    second = start_cluster(tmp_path, "second.log")
    assert second.postmaster().pid == postmaster.pid
    assert stop_cluster(second) == 0
    assert gone(postmaster)
    assert "embedded PostgreSQL adopted" in second.output()
