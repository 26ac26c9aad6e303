"""TLS on the main listener (the real `AcceptingSite`, in this process): a conversation over
`wss://` and over SSE on `https://` with the certificate verified, refused by a client that
does not trust the server's authority, HSTS over HTTPS only, a TLS session resumed; and a
certificate that does not load, at start or on reload."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from actors.clock import ManualClock
from client import Phone
from tests.conftest import Harness
from tests.test_client import answered
from tests.tls_support import Authority, authority, needs_openssl, presented
from transport.app import build_app, runner_options
from transport.config import Settings
from transport.listener import AcceptingSite
from transport.server import SERVER_KEY, Server
from transport.tls import Certificate, CertificateError

__all__ = ["authority"]  # the fixture
pytestmark = needs_openssl


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    """Another authority: the server's certificate is not one of its."""
    return Authority.make(tmp_path_factory.mktemp("stranger"), "stranger")


@dataclass
class TlsServer:
    base: str  # https://127.0.0.1:PORT
    server: Server


@pytest.fixture
async def tls_server(
    dsn: str, clock: ManualClock, tmp_path: Path, authority: Authority
) -> AsyncIterator[TlsServer]:
    pair = authority.issue("server")
    settings = Settings(
        db=dsn, data_dir=tmp_path, secret="test-secret-of-at-least-32-bytes", tls_cert=pair.cert,
        tls_key=pair.key,
    )  # fmt: skip
    certificate = Certificate.load(pair.cert, pair.key)
    app = build_app(settings, clock, certificate)
    runner = web.AppRunner(app, **runner_options(settings))
    await runner.setup()
    site = AcceptingSite(runner, "127.0.0.1", 0, backlog=128, ssl_context=certificate.context)
    await site.start()
    try:
        yield TlsServer(f"https://127.0.0.1:{runner.addresses[0][1]}", app[SERVER_KEY])
    finally:
        await runner.cleanup()


async def talk(phone: Phone) -> None:
    """A say answered, over whatever link the phone has."""
    said = phone.say("hello over TLS")
    await phone.wait_until(lambda: answered(phone, said), 20)


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_conversation_over_tls_with_the_certificate_verified(
    tls_server: TlsServer, authority: Authority, transport: str
) -> None:
    async with Phone(tls_server.base, transport=transport, ca_file=authority.ca_file) as phone:
        await talk(phone)
        assert phone.welcome is not None and not phone.welcome.get("resumed")


async def test_a_client_that_does_not_trust_the_authority_is_refused(
    tls_server: TlsServer, stranger: Authority
) -> None:
    """Verification is on by default: with the system's authorities, as with another CA,
    the handshake fails and nothing reaches the server's conversations."""
    for verify in (stranger.client_context(), True):
        connector = aiohttp.TCPConnector(ssl=verify)
        async with aiohttp.ClientSession(connector=connector) as http:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await http.ws_connect(tls_server.base + "/v1/ws")
    phone = Phone(tls_server.base, ca_file=stranger.ca_file, start_timeout=2)
    with pytest.raises(TimeoutError):
        await phone.start()
    assert phone.links == 0
    assert tls_server.server.directory.lives() == []


async def test_https_answers_carry_hsts_and_plain_ones_do_not(
    tls_server: TlsServer, authority: Authority, harness: Harness
) -> None:
    connector = aiohttp.TCPConnector(ssl=authority.client_context())
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.get(tls_server.base + "/") as page,
    ):
        assert page.status == 200
        assert page.headers["Strict-Transport-Security"] == "max-age=63072000"
    await harness.start()
    async with harness.http.get(harness.url("/")) as plain:
        assert plain.status == 200
        assert "Strict-Transport-Security" not in plain.headers


def test_a_certificate_that_does_not_load_names_its_file(
    authority: Authority, stranger: Authority, tmp_path: Path
) -> None:
    pair = authority.issue("named")
    other = stranger.issue("other")
    half = tmp_path / "half.pem"
    half.write_text(pair.cert.read_text()[:200])
    with pytest.raises(CertificateError, match=f"^{half} holds no certificate"):
        Certificate.load(half, pair.key)
    with pytest.raises(CertificateError, match=f"^the key in {other.key} is not the key of"):
        Certificate.load(pair.cert, other.key)
    with pytest.raises(CertificateError, match=f"^cannot read {tmp_path / 'gone.key'}"):
        Certificate.load(pair.cert, tmp_path / "gone.key")


def test_a_failed_reload_keeps_the_certificate_in_use(
    authority: Authority, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = authority.issue("first"), authority.issue("second")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    certificate = Certificate.load(cert, key)
    cert.write_bytes(second.cert.read_bytes())  # a renewal half done: its key not yet written
    assert not certificate.reload()
    assert f"TLS certificate not reloaded, the one in use stays: the key in {key}" in caplog.text
    assert presented(certificate.context, authority) == first.fingerprint()
    key.write_bytes(second.key.read_bytes())
    assert certificate.reload()
    assert presented(certificate.context, authority) == second.fingerprint()


def _get_page(port: int, context: ssl.SSLContext, session: ssl.SSLSession | None) -> ssl.SSLSocket:
    """`GET /` over a new TLS connection (offering `session` to resume), read to the end:
    TLS 1.3 session tickets arrive after the handshake, with the first data."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    tls = context.wrap_socket(raw, server_hostname="localhost", session=session)
    tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    while tls.recv(65536):
        pass
    return tls


async def test_a_reconnecting_client_resumes_its_tls_session(
    tls_server: TlsServer, authority: Authority
) -> None:
    """The server hands out session tickets: a client that offers one on its next
    connection resumes the session (no certificate, no full key exchange)."""
    port = urlsplit(tls_server.base).port
    assert port is not None
    context = authority.client_context()
    first = await asyncio.to_thread(_get_page, port, context, None)
    assert first.version() in ("TLSv1.2", "TLSv1.3") and not first.session_reused
    again = await asyncio.to_thread(_get_page, port, context, first.session)
    assert again.session_reused
    for tls in (first, again):
        tls.close()
