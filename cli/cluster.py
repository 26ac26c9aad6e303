"""`stillhere cluster`: several nodes on one machine, behind HAProxy, supervised together.

One process has one core; this uses them all. It runs the embedded PostgreSQL of DATA_DIR,
N `stillhere serve` nodes on it (node-1 ... node-N, on ports of their own on 127.0.0.1)
and HAProxy in front on --host:--port, routing each person to the node that holds their
conversation (deploy/haproxy.cfg). With --tls-cert and --tls-key, HAProxy speaks HTTPS and
WSS (the two joined into DATA/haproxy.pem, HAProxy's form) and the nodes behind it plain
HTTP, trusting HAProxy's X-Forwarded-For. A node or HAProxy that dies is started again. SIGINT
(Ctrl-C) or SIGTERM stops the nodes (SIGTERM: each drains as `serve` does), then HAProxy,
then PostgreSQL.

Every node signs and checks tokens and device keys with one secret: STILLHERE_SECRET if
set, else DATA_DIR/secret (made once). It reaches the nodes through their environment, never a
command line. Options after `--` go to every node's `serve` (as do STILLHERE_* variables);
the cluster sets --db, --host, --port, --admin-port, --node-id, --data-dir and --secret
itself.
Each child's output is kept in DATA_DIR/logs/NAME.log.

With --standby, PostgreSQL listens on 127.0.0.1 (DB_PORT) and a synchronous standby of it
runs beside it (`stillhere db --standby-of`, in DATA_DIR/standby, on DB_PORT+1); the nodes
get both hosts in one DSN and follow whichever accepts writes. `stillhere db --promote
--data-dir DATA_DIR/standby` promotes the standby when the primary is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from cli import haproxy
from cli.db import add_data_option
from cli.supervise import Child
from storage import replication
from storage.embedded import EmbeddedPostgres, InUse
from transport.config import Settings, env_value, longer_than_zero, positive
from transport.identity import load_or_create_secret
from transport.tls import Certificate, CertificateError

log = logging.getLogger("stillhere.cluster")

NODE_HOST = "127.0.0.1"
# The options the cluster gives each node itself; a node given them twice would be ambiguous.
RESERVED = (
    "--db", "--port", "--admin-port", "--node-id", "--data-dir", "--secret", "--host",
    "--tls-cert", "--tls-key",
)  # fmt: skip
# HAProxy reaches the nodes from this address: their X-Forwarded-For is believed from it.
TRUSTED = "127.0.0.1"
NODE_UNSET = frozenset({"STILLHERE_TLS_CERT", "STILLHERE_TLS_KEY"})
HAPROXY_STOP_S = 10.0
READY_WAIT_S = 300.0  # a first start runs initdb and loads the local models
READY_POLL_S = 0.5
STANDBY_NAME = "stillhere_standby"


def add_parser(commands: Any) -> None:
    cluster = commands.add_parser(
        "cluster",
        help="run PostgreSQL, N nodes and HAProxy in front, supervised together",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cluster.add_argument("--nodes", type=positive, default=2, help="nodes to run (default 2)")
    cluster.add_argument(
        "--port", type=int, default=Settings().port, help="HAProxy's port (default 8765)"
    )
    cluster.add_argument(
        "--host", default=Settings().host, help="HAProxy's address (default 127.0.0.1)"
    )
    add_data_option(cluster, "PostgreSQL, the secret, the nodes' folders and the logs")
    cluster.add_argument(
        "--node-ports",
        type=int,
        help="node-i listens on NODE_PORTS+i-1 on 127.0.0.1, its admin API (if on) on "
        "NODE_PORTS+N+i-1 (default --port + 1)",
    )
    cluster.add_argument(
        "--stop-timeout",
        type=longer_than_zero,
        default=30.0,
        help="on stop, how long nodes may drain before they are killed (default 30s; "
        "above the nodes' --drain-timeout)",
    )
    cluster.add_argument(
        "--standby",
        action="store_true",
        help="run a synchronous standby of PostgreSQL too, the nodes on both (see above)",
    )
    cluster.add_argument(
        "--db-port",
        type=int,
        help="with --standby: PostgreSQL's TCP port, the standby's the next one "
        "(default: after the nodes' admin ports)",
    )
    cluster.add_argument(
        "--haproxy", help="the haproxy executable (default: found on PATH or in /usr/sbin)"
    )
    for name, what in (("cert", "PEM certificate (chain)"), ("key", "PEM private key")):
        cluster.add_argument(
            f"--tls-{name}",
            type=Path,
            default=env_value(f"tls-{name}"),
            help=f"{what} HAProxy serves HTTPS and WSS with (env STILLHERE_TLS_{name.upper()})",
        )
    cluster.add_argument(
        "serve_options",
        nargs=argparse.REMAINDER,
        metavar="-- SERVE_OPTIONS",
        help="options for every node's `stillhere serve`, after --",
    )
    cluster.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    extra = [o for o in args.serve_options if o != "--"]
    reserved = sorted({o.split("=")[0] for o in extra} & set(RESERVED))
    if reserved:
        print(f"stillhere cluster: the cluster sets {', '.join(reserved)} itself", file=sys.stderr)
        return 2
    if (args.tls_cert is None) != (args.tls_key is None):
        print("stillhere cluster: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    try:
        executable = haproxy.find(args.haproxy)
        if args.tls_cert is not None:
            Certificate.load(args.tls_cert, args.tls_key)
    except (haproxy.HAProxyMissing, CertificateError) as refused:
        print(f"stillhere cluster: {refused}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args, executable, extra))
    except (InUse, haproxy.BadConfig, replication.ReplicationError) as refused:
        print(f"stillhere cluster: {refused}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace, executable: str, extra: list[str]) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signo in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signo, _stop_on, signo, stopping)
    data: Path = args.data_dir
    postgres = await asyncio.to_thread(EmbeddedPostgres, data, alone=True)
    try:
        dsn, standby = await _database(args, postgres)
        nodes = _nodes(args, dsn, extra)
        front = _haproxy(args, executable, nodes)
        running = [asyncio.create_task(child.run()) for child in (*nodes, front)]
        running += [task for _, task in standby]
        watch = asyncio.create_task(_announce_ready(args, stopping))
        await stopping.wait()
        watch.cancel()
        await asyncio.gather(*(node.stop(args.stop_timeout) for node in nodes))
        await front.stop(HAPROXY_STOP_S)
        for child, _ in standby:
            await child.stop(HAPROXY_STOP_S)
        await asyncio.gather(*running)
    finally:
        await asyncio.to_thread(postgres.stop)
    log.info("cluster stopped")
    return 0


def _stop_on(signo: int, stopping: asyncio.Event) -> None:
    log.info(
        "stopping on %s: nodes first, then HAProxy, then PostgreSQL", signal.Signals(signo).name
    )
    stopping.set()


async def _database(
    args: argparse.Namespace, postgres: EmbeddedPostgres
) -> tuple[str, list[tuple[Child, asyncio.Task[None]]]]:
    """The nodes' DSN, and the standby's child running, synchronous, if asked for one."""
    if not args.standby:
        return postgres.dsn, []
    first = args.db_port or (args.node_ports or args.port + 1) + 2 * args.nodes
    primary = await asyncio.to_thread(postgres.listen, NODE_HOST, first, remote=False)
    argv = [sys.executable, "-m", "cli.main", "db", "--data-dir", str(args.data_dir / "standby")]
    argv += ["--port", str(first + 1), "--standby-of", primary, "--standby-name", STANDBY_NAME]
    log_path = args.data_dir / "logs" / "standby.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    standby = Child("standby", argv, env=dict(os.environ), log_path=log_path)
    task = asyncio.create_task(standby.run())
    try:  # no node acks a say on one disk
        await replication.wait_synchronous(primary, STANDBY_NAME, READY_WAIT_S)
    except BaseException:
        await standby.stop(HAPROXY_STOP_S)
        await task
        raise
    hosts = f"{NODE_HOST}:{first},{NODE_HOST}:{first + 1}"
    return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write", [
        (standby, task)
    ]


def _nodes(args: argparse.Namespace, dsn: str, extra: list[str]) -> list[Child]:
    data: Path = args.data_dir
    env = {k: v for k, v in os.environ.items() if k not in NODE_UNSET}  # TLS is HAProxy's
    env["STILLHERE_SECRET"] = env_value("secret") or load_or_create_secret(data)
    first = args.node_ports if args.node_ports is not None else args.port + 1
    (data / "logs").mkdir(parents=True, exist_ok=True)
    nodes = []
    for i in range(1, args.nodes + 1):
        name = f"node-{i}"
        argv = [sys.executable, "-m", "cli.main", "serve", "--db", dsn]
        argv += ["--host", NODE_HOST, "--port", str(first + i - 1), "--node-id", name]
        argv += ["--admin-port", str(first + args.nodes + i - 1), "--trusted-proxies", TRUSTED]
        argv += ["--data-dir", str(data / name), *extra]
        nodes.append(Child(name, argv, env=env, log_path=data / "logs" / f"{name}.log"))
    return nodes


def _haproxy(args: argparse.Namespace, executable: str, nodes: list[Child]) -> Child:
    """HAProxy's child, its configuration written to DATA_DIR/haproxy.cfg and checked."""
    data: Path = args.data_dir
    backends = [
        haproxy.Backend(node.name, NODE_HOST, int(node.argv[node.argv.index("--port") + 1]))
        for node in nodes
    ]
    config = data / "haproxy.cfg"
    bind = f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}"
    pem = None
    if args.tls_cert is not None:
        pem = data / "haproxy.pem"
        haproxy.write_pem(args.tls_cert, args.tls_key, pem)
    config.write_text(haproxy.fill(haproxy.TEMPLATE.read_text(), bind, backends, pem))
    haproxy.check(executable, config)
    command = haproxy.command(executable, config)
    return Child("haproxy", command, env=dict(os.environ), log_path=data / "logs" / "haproxy.log")


async def _announce_ready(args: argparse.Namespace, stopping: asyncio.Event) -> None:
    """Log once HAProxy's `/readyz` answers 200 (a node behind it is ready)."""
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    scheme = "http" if args.tls_cert is None else "https"
    url = f"{scheme}://{host}:{args.port}/readyz"
    # The cluster asks its own HAProxy, by address: the certificate names the public host.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as http:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(READY_WAIT_S):
                while not stopping.is_set():
                    with contextlib.suppress(aiohttp.ClientError, OSError):
                        async with http.get(url) as answer:
                            if answer.status == 200:
                                log.info(
                                    "cluster ready: %s://%s:%d/ (%d nodes behind HAProxy)",
                                    scheme,
                                    host,
                                    args.port,
                                    args.nodes,
                                )
                                return
                    await asyncio.sleep(READY_POLL_S)
            return
        log.warning(
            "no node ready behind HAProxy after %g s: see %s", READY_WAIT_S, args.data_dir / "logs"
        )
