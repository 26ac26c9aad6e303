"""`stillhere serve --tls-cert --tls-key` as a process: SIGHUP reloads the certificate while
a link stays up, new links (the admin API's too, with `--admin-tls on`) see the new one, a
renewal that does not load leaves the one in use; a certificate that does not load at
start-up is one line and exit 2."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from cli.inspect import InspectError, inspect
from client import Phone
from tests.browser_support import Served, serving
from tests.test_restart import ROOT, STILLHERE, free_port
from tests.test_tls import talk
from tests.tls_support import Authority, Pair, authority, needs_openssl

__all__ = ["authority"]  # the fixture
pytestmark = needs_openssl
LOG_WAIT_S = 30.0
ADMIN_TOKEN = "admin-token-of-the-tls-tests"


def presented_to_a_new_link(served: Served, authority: Authority, port: int | None = None) -> str:
    """The fingerprint of the certificate a new connection is shown, verified (on the main
    port, or on `port`)."""
    port = port or urlsplit(served.base).port
    assert port is not None
    context = authority.client_context()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def install(pair: Pair, cert: Path, key: Path) -> None:
    """A renewal as certbot makes it: the new files in place of the old."""
    cert.write_bytes(pair.cert.read_bytes())
    key.write_bytes(pair.key.read_bytes())


async def logged(served: Served, line: str, times: int = 1) -> None:
    async with asyncio.timeout(LOG_WAIT_S):
        while served.log().count(line) < times:
            await asyncio.sleep(0.05)


async def renewals(
    served: Served, authority: Authority, cert: Path, key: Path, admin_port: int
) -> None:
    first = Pair(cert, key).fingerprint()
    async with Phone(served.base, ca_file=authority.ca_file) as phone:
        await talk(phone)
        assert presented_to_a_new_link(served, authority) == first
        renewed = authority.issue("renewed")
        install(renewed, cert, key)
        served.process.send_signal(signal.SIGHUP)
        await logged(served, f"TLS certificate reloaded from {cert}")
        assert presented_to_a_new_link(served, authority) == renewed.fingerprint()
        assert presented_to_a_new_link(served, authority, admin_port) == renewed.fingerprint()
        await talk(phone)  # the link made before the renewal goes on
        cert.write_text(cert.read_text()[:100])  # a renewal written half
        served.process.send_signal(signal.SIGHUP)
        await logged(served, f"the one in use stays: {cert} holds no certificate in PEM form")
        assert presented_to_a_new_link(served, authority) == renewed.fingerprint()
        await talk(phone)
        assert (phone.links, phone.reconnects) == (1, 0)
    assert served.process.poll() is None


def test_sighup_reloads_the_certificate_and_links_stay_up(
    postgres: str, tmp_path: Path, authority: Authority
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    install(authority.issue("first"), cert, key)
    admin_port = free_port()
    options = ["--tls-cert", str(cert), "--tls-key", str(key), "--embed-local", "minilm"]
    options += ["--admin-token", ADMIN_TOKEN, "--admin-tls", "on", "--admin-port", str(admin_port)]
    with serving(postgres, tmp_path, options, authority.client_context()) as served:
        assert f"listening on {served.base}/ (WebSocket wss://" in served.log()
        assert f"live view https://127.0.0.1:{admin_port}/" in served.log()
        admin = urllib.request.Request(
            f"https://127.0.0.1:{admin_port}/admin/sweeps",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        with urllib.request.urlopen(admin, timeout=10, context=served.tls) as answer:
            assert answer.status == 200
        admin_url = f"https://127.0.0.1:{admin_port}"
        assert inspect(admin_url, ADMIN_TOKEN, None, ca_file=authority.ca_file) == "no live actors"
        with pytest.raises(InspectError, match="CERTIFICATE_VERIFY_FAILED"):
            inspect(admin_url, ADMIN_TOKEN, None)  # the system's authorities: not this one
        asyncio.run(renewals(served, authority, cert, key, admin_port))


def serve_exit(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(STILLHERE), "serve", "--port", "0", *options],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_a_certificate_that_does_not_load_stops_the_start_in_one_line(
    authority: Authority, tmp_path: Path
) -> None:
    pair = authority.issue("start")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    refused = serve_exit("--tls-cert", str(junk), "--tls-key", str(pair.key))
    assert refused.returncode == 2
    assert refused.stderr == (
        f"stillhere serve: TLS certificate: {junk} holds no certificate in PEM form\n"
    )
    alone = serve_exit("--tls-cert", str(pair.cert))
    assert alone.returncode == 2
    assert "--tls-cert and --tls-key go together" in alone.stderr
    admin = serve_exit("--admin-tls", "on", "--admin-token", "t")
    assert admin.returncode == 2
    assert "--admin-tls on needs --tls-cert and --tls-key" in admin.stderr
