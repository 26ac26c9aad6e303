"""A process `stillhere cluster` keeps running: started, restarted when it dies, stopped.

Each child runs in a session of its own, so a Ctrl-C in the terminal reaches only the
cluster, which then stops the children in its own order (nodes first, so that they drain,
then HAProxy, then PostgreSQL). Each is also asked by the kernel to receive SIGTERM if the
cluster itself dies (`PR_SET_PDEATHSIG`), so a `kill -9` of the cluster leaves no node
running without a supervisor.

A child that dies is started again after a pause that doubles while it keeps dying young
(1 s, 2 s, ... up to `MAX_PAUSE_S`), so a node that cannot start does not spin.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import time
from pathlib import Path

log = logging.getLogger("stillhere.cluster")

FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0
# A child that ran this long before dying was not failing to start: its pause starts over.
SETTLED_S = 10.0
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the cluster's process dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Child:
    """One supervised process; `run()` keeps it running until `stop()`."""

    def __init__(self, name: str, argv: list[str], *, env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        """Start it, and start it again each time it exits, until `stop()`."""
        pause = FIRST_PAUSE_S
        while not self._stopping.is_set():
            started = time.monotonic()
            code = await self._start_and_wait()
            if self._stopping.is_set():
                return
            pause = FIRST_PAUSE_S if time.monotonic() - started >= SETTLED_S else pause
            log.warning(
                "%s exited (%s); starting it again in %g s (log %s)",
                self.name,
                _status(code),
                pause,
                self.log_path,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), pause)
            pause = min(pause * 2, MAX_PAUSE_S)

    async def stop(self, timeout: float) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; its exit status (None if it was not running)."""
        self._stopping.set()
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return None  # between two starts
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            log.warning("%s did not stop within %g s: killed", self.name, timeout)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            code = await proc.wait()
        log.info("%s stopped (%s)", self.name, _status(code))
        return code

    async def _start_and_wait(self) -> int:
        with self.log_path.open("ab") as output:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.starts += 1
        log.info("%s started (pid %d, log %s)", self.name, self.proc.pid, self.log_path)
        return await self.proc.wait()


def _status(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"
