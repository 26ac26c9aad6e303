"""`stillhere serve` says where it listens: one line with the ports it actually bound."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.test_restart import START_TIMEOUT, free_port, spawn_serve

TOKEN = "admin-token-for-tests-0123456789abcdef"
LINE = re.compile(
    r"INFO stillhere\.server: listening on http://127\.0\.0\.1:(\d+)/ "
    r"\(WebSocket ws://127\.0\.0\.1:(\d+)/v1/ws, events http://127\.0\.0\.1:(\d+)/v1/events\), "
    r"live view http://127\.0\.0\.1:(\d+)/$",
    re.MULTILINE,
)


@contextlib.asynccontextmanager
async def serving(dsn: str, tmp_path: Path) -> AsyncIterator[Path]:
    """`stillhere serve` on ports of the system's choosing, its admin API on; its log file."""
    log_path = tmp_path / "serve.log"
    options = ["--db", dsn, "--data-dir", str(tmp_path / "data"), "--secret", "s"]
    options += ["--port", "0", "--admin-port", "0", "--admin-token", TOKEN]
    proc = await spawn_serve(options, log_path)
    try:
        yield log_path
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), START_TIMEOUT)


async def listening(log_path: Path) -> re.Match[str]:
    """The listening line, once the server has logged it."""
    async with asyncio.timeout(START_TIMEOUT):
        while not (found := LINE.search(log_path.read_text(errors="replace"))):
            await asyncio.sleep(0.1)
    return found


async def test_serve_logs_one_line_with_the_ports_it_bound(dsn: str, tmp_path: Path) -> None:
    async with serving(dsn, tmp_path) as log_path:
        line = await listening(log_path)
        main, ws, events, admin = (int(port) for port in line.groups())
        assert main == ws == events != admin
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"ws://127.0.0.1:{main}/v1/ws") as client:
                await client.send_json({"type": "hello", "v": 1, "device": "device-" + "0" * 32})
                assert (await client.receive_json(timeout=15))["type"] == "welcome"
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with http.get(f"http://127.0.0.1:{admin}/admin/actors", headers=auth) as got:
                assert got.status == 200
            async with http.get(f"http://127.0.0.1:{admin}/") as live_view:
                assert live_view.status == 200  # the page, which asks for the token
                assert live_view.content_type == "text/html"
        text = log_path.read_text(errors="replace")
        assert text.count("listening on ") == 1  # the live view's URL is in it, not apart
        assert TOKEN not in text


async def test_a_request_line_too_long_is_one_info_line_without_the_query(
    dsn: str, tmp_path: Path
) -> None:
    """aiohttp refuses a request line over 8190 bytes before any handler; it logged that as
    an ERROR with a traceback and the line's start, an EventSource's device secret with it
    (found by `stillhere-bench fuzz`)."""
    secret = "device-secret-in-a-query-" + "0" * 16
    async with serving(dsn, tmp_path) as log_path:
        main = int((await listening(log_path)).group(1))
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{main}/v1/events"
            params = {"device": secret, "pad": "x" * 9000}
            async with http.get(url, params=params) as refused:
                assert refused.status == 400
            async with http.get(url, params={"device": "d" * 30}) as still:
                assert still.status == 200  # the server goes on
        async with asyncio.timeout(START_TIMEOUT):
            while "refused a request it could not read" not in log_path.read_text():
                await asyncio.sleep(0.1)
        text = log_path.read_text(errors="replace")
    assert "INFO aiohttp.server: refused a request it could not read: HTTP 400, LineTooLong" in text
    assert secret not in text and "Traceback" not in text and " ERROR " not in text


async def refused_start(options: list[str], log_path: Path) -> tuple[int, list[str]]:
    """`stillhere serve OPTIONS` that must not start: its exit code and its log's lines."""
    proc = await spawn_serve(options, log_path)
    code = await asyncio.wait_for(proc.wait(), START_TIMEOUT)
    return code, log_path.read_text(errors="replace").splitlines()


def said_once(lines: list[str], *needles: str) -> None:
    """The error is the log's last line, holding each of `needles`; nothing claimed to be
    ready or listening, and no traceback."""
    assert lines and all(needle in lines[-1] for needle in needles), lines
    assert lines[-1].startswith("stillhere serve: "), lines
    text = "\n".join(lines)
    assert "Traceback" not in text and "stillhere ready" not in text and "listening on" not in text


async def test_a_port_in_use_is_one_line_before_anything_starts(dsn: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        options = ["--db", dsn, "--data-dir", str(tmp_path / "data"), "--port", str(port)]
        code, lines = await refused_start(options, tmp_path / "serve.log")
    assert code == 2
    said_once(lines, "--port", f"127.0.0.1:{port}", "Address already in use")
    assert lines == lines[-1:], "the port is bound before anything else starts"


async def test_an_admin_port_in_use_is_one_line_too(dsn: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        admin = str(taken.getsockname()[1])
        options = ["--db", dsn, "--data-dir", str(tmp_path / "data"), "--port", "0"]
        options += ["--admin-token", TOKEN, "--admin-port", admin]
        code, lines = await refused_start(options, tmp_path / "serve.log")
    assert code == 2
    said_once(lines, "--admin-port", f"127.0.0.1:{admin}", "Address already in use")


@pytest.mark.parametrize(
    ("given", "needles"),
    [
        ("postgresql://someone:pw-in-dsn@127.0.0.1:{free}/x", ["--db", "someone:***@", "refused"]),
        ("notadsn", ["--db notadsn", "not a PostgreSQL DSN"]),
    ],
    ids=["refused", "malformed"],
)
async def test_a_db_that_cannot_be_used_is_one_line_naming_db(
    given: str, needles: list[str], tmp_path: Path
) -> None:
    options = ["--db", given.format(free=free_port()), "--port", "0"]
    code, lines = await refused_start([*options, "--data-dir", str(tmp_path)], tmp_path / "log")
    assert code == 2
    said_once(lines, *needles)
    assert "pw-in-dsn" not in "\n".join(lines)
