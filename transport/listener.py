"""The listening socket, and a way to serve an aiohttp app that accepts without delay.

libuv, under uvloop, accepts one connection per turn of the event loop (it stopped accepting
in a loop in 2022: libuv pull request 3696). A loop busy with 2,000 phones turns every 10
to 50 ms, so a burst of reconnecting phones waited in the kernel's accept queue for one to
several seconds, their TCP handshake long done: in a `bench flap` run, SSE resumes (whose
timing starts before the connection) had a p95 of 2.5 s while the server answered each
hello in under 100 ms.
A stand-alone check: with a loop turning every 10 ms, 100 waiting connections took 1.03 s
to accept on uvloop, 0.04 s on asyncio's loop.

`AcceptingSite` accepts every waiting connection each time the socket is ready (at most
`backlog` at once, as asyncio's own loop does), then hands each to the loop as an accepted
socket: uvloop's transports serve them as before.

With `--socket-send-buffer`, each accepted socket's kernel send buffer is fixed at that
size instead of growing with the connection (up to `net.ipv4.tcp_wmem`'s maximum, 4 MB by
default): a phone that stops reading then holds that much kernel memory at most, beside
what `--link-buffer` lets the server hold. A chat's replies need little of it.

Each link holds a descriptor, so the server raises its own descriptor limit (the soft
RLIMIT_NOFILE) to the hard one as it starts: a shell's default soft limit, 1024 on many
systems, would otherwise cap a node at about that many phones. Past the hard limit it
cannot go (raising that takes CAP_SYS_RESOURCE, or `ulimit -Hn` before starting); what
it is, is logged.

With `--tls-cert`, each accepted socket is wrapped in TLS (transport/tls.py) before aiohttp
sees it; a handshake not done within `--hello-timeout` closes the connection, as a hello
not sent in time does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from transport.tls import Certificate

log = logging.getLogger("stillhere.server")


class StartupError(Exception):
    """A start that cannot go on, said in one line: what failed, the option that names it
    and what to do (`stillhere serve` prints it and exits with code 2)."""


# After an accept fails for want of resources (descriptors, memory), the socket stays ready:
# accepting again at once would spin. asyncio's own loop waits this long too.
ACCEPT_RETRY_S = 1.0


class _Listening(asyncio.AbstractServer):
    """The listening socket as the runner sees a site's server: its address, and close."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self._loop = loop
        self._sock: socket.socket | None = sock

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self._sock is None else (self._sock,)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        if self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    async def wait_closed(self) -> None:
        return None


class AcceptingSite(web.BaseSite):
    """A TCP site that accepts every waiting connection whenever its socket is ready."""

    __slots__ = ("_accepting", "_handshake_timeout", "_host", "_port", "_send_buffer", "_sock")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        backlog: int,
        send_buffer: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        handshake_timeout: float = 10.0,
        sock: socket.socket | None = None,
    ) -> None:
        super().__init__(runner, backlog=backlog, ssl_context=ssl_context)
        self._host, self._port = host, port
        self._send_buffer = send_buffer  # SO_SNDBUF of each accepted socket; 0: the kernel's
        self._handshake_timeout = handshake_timeout  # of TLS, with an ssl_context
        self._sock = sock  # bound and listening already (`listen`), or bound by `start`
        self._accepting: set[asyncio.Task[Any]] = set()

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        sock = self._sock or await listen(self._host, self._port, self._backlog)
        self._port = sock.getsockname()[1]
        self._server = _Listening(loop, sock)
        loop.add_reader(sock.fileno(), self._accept_waiting, loop, sock)

    def _accept_waiting(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        for _ in range(self._backlog):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the phone gave up before it was accepted
            except OSError as failed:  # out of descriptors, say
                log.warning("accepting paused for %g s: %s", ACCEPT_RETRY_S, failed)
                loop.remove_reader(sock.fileno())
                loop.call_later(ACCEPT_RETRY_S, self._resume, loop, sock)
                return
            conn.setblocking(False)
            if self._send_buffer:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
            task = loop.create_task(self._serve(loop, conn))
            self._accepting.add(task)
            task.add_done_callback(self._accepting.discard)

    def _resume(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        if self._server is not None and self._server.is_serving():  # not closed meanwhile
            loop.add_reader(sock.fileno(), self._accept_waiting, loop, sock)

    async def _serve(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        factory = self._runner.server
        if factory is None:  # shutting down
            conn.close()
            return
        tls: dict[str, Any] = {}
        if self._ssl_context is not None:
            tls = {"ssl": self._ssl_context, "ssl_handshake_timeout": self._handshake_timeout}
        try:
            await loop.connect_accepted_socket(factory, conn, **tls)
        except (OSError, TimeoutError) as failed:  # the phone left, or its handshake failed
            log.info("an accepted connection could not be served: %s", str(failed) or repr(failed))
            conn.close()


def reason(failed: OSError) -> str:
    """What the system said, without the address Python adds to it."""
    return os.strerror(failed.errno) if failed.errno else str(failed)


async def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A non-blocking socket listening on `host:port`; StartupError if it cannot be."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        sock = socket.create_server((host, port), family=infos[0][0], backlog=backlog)
    except OSError as failed:
        raise StartupError(
            f"cannot listen on {host}:{port} (--host, --port): {reason(failed)}; "
            "stop what uses that port, or choose another --port"
        ) from failed
    sock.setblocking(False)
    return sock


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise this process's soft descriptor limit to its hard one; (soft, hard) after
    ((-1, -1) where there are no such limits: Windows)."""
    try:
        import resource
    except ImportError:
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    backlog: int,
    send_buffer: int = 0,
    on_listening: Callable[[int], None] | None = None,
    drain: Callable[[web.Application], Awaitable[None]] | None = None,
    certificate: Certificate | None = None,
    handshake_timeout: float = 10.0,
    **runner_options: Any,
) -> None:
    """Serve `app` on `host:port` until SIGINT or SIGTERM, then shut it down cleanly (what
    `web.run_app` does, with `AcceptingSite` in place of its TCP site). `on_listening` is
    called with the bound port (the one the system chose, for port 0) once it accepts.
    `drain` runs after the signal while the site still accepts (a load balancer's health
    checks are answered meanwhile), before the runner closes the site and the app.
    With a `certificate`, the site speaks TLS and SIGHUP reloads the certificate.
    The port is bound first, before the app starts (its models and database), so a port in
    use is said at once; connections made meanwhile wait in the backlog."""
    soft, hard = raise_descriptor_limit()
    sock = await listen(host, port, backlog)
    log.info("descriptor limit %d (hard limit %d): at most about that many links", soft, hard)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if certificate is not None:
        loop.add_signal_handler(signal.SIGHUP, certificate.reload)
    runner = web.AppRunner(app, handle_signals=False, **runner_options)
    try:
        await runner.setup()
    except BaseException:
        sock.close()
        raise
    try:
        site = AcceptingSite(
            runner,
            host,
            port,
            backlog=backlog,
            send_buffer=send_buffer,
            ssl_context=None if certificate is None else certificate.context,
            handshake_timeout=handshake_timeout,
            sock=sock,
        )
        await site.start()
        if on_listening is not None:
            on_listening(runner.addresses[0][1])
        await stop.wait()
        if drain is not None:
            await drain(app)
    finally:
        await runner.cleanup()
