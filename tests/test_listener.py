"""The listening site: every waiting connection is accepted at one wake-up, on uvloop too,
and `serve` stops cleanly on SIGTERM. (Timings are in bench/README.md, not asserted here.)"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import time

import pytest
from aiohttp import web

from providers.event_loop import LOOPS, run
from transport import listener
from transport.listener import AcceptingSite, serve

WAITING = 50


class CountingSite(AcceptingSite):
    """Records how many connections each wake-up accepted."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, backlog: int) -> None:
        super().__init__(runner, host, port, backlog=backlog)
        self.batches: list[int] = []

    def _accept_waiting(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        before = len(self._accepting)
        super()._accept_waiting(loop, sock)
        self.batches.append(len(self._accepting) - before)


def _app() -> web.Application:
    async def ping(_: web.Request) -> web.Response:
        return web.Response(text="pong")

    app = web.Application()
    app.router.add_get("/ping", ping)
    return app


async def _ask(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await reader.read()
    writer.close()
    return answer


async def _burst() -> tuple[list[int], list[bytes]]:
    runner = web.AppRunner(_app())
    await runner.setup()
    site = CountingSite(runner, "127.0.0.1", 0, backlog=128)
    await site.start()
    port = runner.addresses[0][1]
    try:
        # The kernel completes every handshake while the loop is held, as under load.
        waiting = [socket.create_connection(("127.0.0.1", port)) for _ in range(WAITING)]
        time.sleep(0.2)
        await asyncio.sleep(0.05)  # one wake-up of the listening socket
        batches = list(site.batches)
        for conn in waiting:
            conn.close()
        answers = await asyncio.gather(*(_ask(port) for _ in range(5)))
        return batches, answers
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("kind", list(LOOPS))
def test_every_waiting_connection_is_accepted_at_one_wake_up(kind: str) -> None:
    batches, answers = run(_burst(), kind)
    assert batches[0] == WAITING, batches  # libuv alone takes one per turn of the loop
    assert all(a.startswith(b"HTTP/1.1 200") and a.endswith(b"pong") for a in answers)


class _OutOfDescriptors:
    """A listening socket whose first accept fails as when the process has no fd left."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock, self.failed = sock, False

    def fileno(self) -> int:
        return self._sock.fileno()

    def accept(self) -> tuple[socket.socket, object]:
        if not self.failed:
            self.failed = True
            raise OSError(errno.EMFILE, "Too many open files")
        return self._sock.accept()


async def _pause_then_resume(monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setattr(listener, "ACCEPT_RETRY_S", 0.1)
    runner = web.AppRunner(_app())
    await runner.setup()
    site = AcceptingSite(runner, "127.0.0.1", 0, backlog=128)
    await site.start()
    loop = asyncio.get_running_loop()
    assert site._server is not None
    real = site._server.sockets[0]
    flaky = _OutOfDescriptors(real)
    loop.remove_reader(real.fileno())
    loop.add_reader(real.fileno(), site._accept_waiting, loop, flaky)
    try:
        # The first accept fails: accepting pauses, then resumes on the real socket.
        return await asyncio.wait_for(_ask(runner.addresses[0][1]), timeout=10)
    finally:
        await runner.cleanup()


def test_accepting_pauses_when_out_of_descriptors_then_resumes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert run(_pause_then_resume(monkeypatch), "uvloop").endswith(b"pong")
    assert "accepting paused for 0.1 s: [Errno 24] Too many open files" in caplog.text


async def _serve_then_stop() -> bytes:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serving = asyncio.get_running_loop().create_task(serve(_app(), "127.0.0.1", port, backlog=16))
    for _ in range(100):
        try:
            answer = await _ask(port)
            break
        except OSError:
            await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(serving, timeout=10)
    with pytest.raises(OSError):  # the socket is closed: nobody listens any more
        await _ask(port)
    return answer


def test_serve_answers_until_sigterm_then_stops() -> None:
    assert run(_serve_then_stop(), "uvloop").endswith(b"pong")


async def _send_buffers(send_buffer: int) -> int:
    """The kernel send buffer of a connection the site accepted, as the server sees it."""

    async def sndbuf(request: web.Request) -> web.Response:
        sock = request.transport.get_extra_info("socket")  # type: ignore[union-attr]
        return web.Response(text=str(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)))

    app = web.Application()
    app.router.add_get("/ping", sndbuf)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await AcceptingSite(runner, "127.0.0.1", 0, backlog=16, send_buffer=send_buffer).start()
        answer = await asyncio.wait_for(_ask(runner.addresses[0][1]), timeout=10)
        return int(answer.rsplit(b"\r\n\r\n", 1)[1])
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("kind", LOOPS)
def test_the_socket_send_buffer_is_fixed_when_asked(kind: str) -> None:
    """Linux doubles what is set (for its bookkeeping) and never autotunes it after."""
    assert run(_send_buffers(32 * 1024), kind) == 2 * 32 * 1024
    assert run(_send_buffers(0), kind) != 2 * 32 * 1024  # the kernel's own size
