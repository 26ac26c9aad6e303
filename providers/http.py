"""What the OpenAI-compatible clients share: one lazily made session, bearer headers, error
messages that never carry the key, and one translation of network failures into codes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

import aiohttp

# Enough of an error body to tell "overloaded" from "model not found" in a log line,
# short enough that an HTML error page does not flood it.
BODY_EXCERPT = 200

ErrorType = Callable[[str, str], Exception]  # ModelError, EmbeddingError: (code, message)
E = TypeVar("E", bound=Exception)


class ApiClient:
    def __init__(self, endpoint: str, key: str | None, timeout: aiohttp.ClientTimeout) -> None:
        self.endpoint = endpoint
        self._key = key or None
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        # Created on first use because a ClientSession binds to the running loop, and the
        # client is usually constructed before the server's loop starts.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def headers(self, accept: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": accept}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def scrub(self, text: str) -> str:
        # Error bodies sometimes quote the credential back ("Incorrect API key provided:
        # sk-..."), and error messages end up in logs and on phones.
        return text.replace(self._key, "[redacted]") if self._key else text

    def http_error(self, error: Callable[[str, str], E], status: int, raw: bytes) -> E:
        return error(
            f"http_{status}", self.scrub(f"{self.endpoint} answered {status}: {excerpt(raw)}")
        )

    @contextlib.contextmanager
    def network_failures(self, error: ErrorType) -> Iterator[None]:
        """Timeouts and unreachable servers, as coded errors naming the endpoint."""
        try:
            yield
        except TimeoutError as exc:  # before ClientError: aiohttp's timeouts are both
            raise error(
                "timeout", self.scrub(f"{self.endpoint} timed out: {describe(exc)}")
            ) from None
        except aiohttp.ClientError as exc:
            # Refused, reset or dropped before an answer began: the call can only be retried.
            raise error(
                "connect", self.scrub(f"cannot reach {self.endpoint}: {describe(exc)}")
            ) from None

    @contextlib.contextmanager
    def answer_cut(self, error: ErrorType) -> Iterator[None]:
        """Inside `network_failures`, once an answer began: the endpoint was reached, so a
        connection lost now is `stream_cut`, not `connect` (a stall stays a `timeout`)."""
        try:
            yield
        except TimeoutError:
            raise
        except aiohttp.ClientError as exc:
            raise error(
                "stream_cut",
                self.scrub(f"{self.endpoint} broke off its answer: {describe(exc)}"),
            ) from None


def excerpt(payload: bytes) -> str:
    return payload[:BODY_EXCERPT].decode("utf-8", "replace")


def describe(exc: BaseException) -> str:
    # Some aiohttp timeouts stringify to nothing; the class name still says what happened.
    return str(exc) or type(exc).__name__
