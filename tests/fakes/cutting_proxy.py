"""A TCP proxy that plays the train tunnel: it cuts links and refuses new ones on command.

Placed between a client and the real server (127.0.0.1 only, or a unix socket such as the
embedded PostgreSQL's: then it plays a database that drops off the network), it forwards
bytes both ways until told to:

- `cut()`: abort every live connection on both sides at once: an RST each way, no
  WebSocket close frame, no end of the event stream, exactly what neither end chose;
- `refuse()`: from now on every new connection is accepted and aborted at once (the phone
  sees its attempt fail, fast), until `allow()`;
- `blackhole()`: new connections are accepted and then left silent, so only the client's
  own timeout ends the attempt (a tunnel that swallows packets), until `allow()`;
- `mute()`: bytes from the server are thrown away, on every connection, until `unmute()`,
  while the client's bytes still get through: a say reaches the server and is stored, but
  its ack never reaches the phone. The streams are then corrupt: `cut()` them.

Cutting at the TCP level rather than in the client is the point: the client code under test
finds out about the drop the way it would on a train.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("tests.cutting_proxy")

CHUNK = 65536


class CuttingProxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        host: str = "127.0.0.1",
        *,
        target_socket: str | None = None,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.target_socket = target_socket  # a unix socket to forward to, instead
        self.host = host
        self.port = 0
        self.mode = "allow"  # allow | refuse | blackhole
        self.muted = False
        self.accepted = 0  # connections that reached the proxy
        self.refused = 0  # of which refused or black-holed
        self.cuts = 0  # connections cut by cut()
        self._server: asyncio.Server | None = None
        self._live: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._held: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        self._abort_held()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> CuttingProxy:
        return await self.start()

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}"

    @property
    def live(self) -> int:
        """Connections being forwarded right now."""
        return len(self._live)

    # -- commands -------------------------------------------------------------------------

    def cut(self) -> int:
        """Abort every live connection, both sides; how many were cut."""
        pairs, self._live = self._live, set()
        for client, upstream in pairs:
            client.transport.abort()
            upstream.transport.abort()
        self.cuts += len(pairs)
        if pairs:
            log.debug("cut %d connections", len(pairs))
        return len(pairs)

    def refuse(self) -> None:
        """New connections fail at once (live ones are untouched: cut() them)."""
        self.mode = "refuse"

    def blackhole(self) -> None:
        """New connections open but nothing ever passes."""
        self.mode = "blackhole"

    def mute(self) -> None:
        """Drop everything the server sends from now on (the uplink keeps working)."""
        self.muted = True

    def unmute(self) -> None:
        self.muted = False

    def allow(self) -> None:
        """Let new connections through again; black-holed ones are dropped."""
        self.mode = "allow"
        self._abort_held()

    def tunnel(self) -> int:
        """Enter the tunnel: cut everything and refuse; `allow()` leaves it."""
        self.refuse()
        return self.cut()

    # -- forwarding -----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "refuse":
            self.refused += 1
            writer.transport.abort()
            return
        if self.mode == "blackhole":
            self.refused += 1
            self._held.add(writer)
            return
        try:
            up_reader, up_writer = await self._connect()
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._live.add(pair)
        pumps = [
            self._spawn(self._pump(reader, up_writer)),
            self._spawn(self._pump(up_reader, writer, downlink=True)),
        ]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        # One side is finished: close the other gracefully, unless it was cut.
        await asyncio.wait(pumps)
        if pair in self._live:
            self._live.discard(pair)
            for side in pair:
                side.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.target_socket is not None:
            return await asyncio.open_unix_connection(self.target_socket)
        return await asyncio.open_connection(self.target_host, self.target_port)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, downlink: bool = False
    ) -> None:
        try:
            while data := await reader.read(CHUNK):
                if downlink and self.muted:
                    continue
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # pass the half-close on, as TCP would
        except (ConnectionError, OSError):
            writer.transport.abort()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _abort_held(self) -> None:
        held, self._held = self._held, set()
        for writer in held:
            writer.transport.abort()
