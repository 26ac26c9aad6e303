"""What the TLS tests share: the certificate authority fixture (bench/certificates.py makes
it with the system's `openssl`), and the certificate a server presents in a handshake."""

from __future__ import annotations

import contextlib
import hashlib
import ssl

import pytest

from bench.certificates import OPENSSL, TEST_HOST, Authority, Pair

__all__ = ["TEST_HOST", "Authority", "Pair"]
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="no openssl (apt-get install openssl)")


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    """The test's certificate authority (a module's tests share it)."""
    return Authority.make(tmp_path_factory.mktemp("ca"))


def presented(context: ssl.SSLContext, authority: Authority) -> str:
    """The fingerprint of the certificate a server with `context` presents in a handshake
    (in memory, no socket) to a client that trusts `authority`."""
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = context.wrap_bio(server_in, server_out, server_side=True)
    client = authority.client_context().wrap_bio(client_in, client_out, server_hostname=TEST_HOST)
    for _ in range(10):
        for side in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        peer = client.getpeercert(binary_form=True) if client.version() else None
        if peer is not None:
            return hashlib.sha256(peer).hexdigest()
    raise AssertionError("the in-memory handshake did not finish")
