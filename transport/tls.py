"""TLS for `serve`'s listeners: the certificate and key of `--tls-cert`/`--tls-key`, in one
SSLContext that every listener shares, reloaded from disk on SIGHUP.

The context is the standard library's for a server (`ssl.create_default_context` with
`Purpose.CLIENT_AUTH`: its ciphers, no compression, session tickets), TLS 1.2 at least.
A renewal (certbot, cert-manager) writes new files and sends SIGHUP: `load_cert_chain` on
the live context changes what new handshakes present, and the links already open keep
their session. The files are checked on a scratch context first, so a certificate that does
not load (a half-written file, a key of another certificate) leaves the old one in place:
loading straight into the live context could swap the certificate in before finding the
key does not match.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("stillhere.server")

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


class CertificateError(Exception):
    """The certificate or its key does not load; the message names the file and why."""


class _Encrypted(Exception):
    """The key asks for a passphrase: `serve` has none to give."""


def _no_passphrase() -> bytes:
    raise _Encrypted


def _new_context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = MINIMUM_VERSION
    return context


def _check(cert: Path, key: Path) -> None:
    """Raise CertificateError unless `cert` and `key` load together, naming the culprit."""
    for path in (cert, key):
        try:
            path.read_bytes()
        except OSError as unreadable:
            raise CertificateError(f"cannot read {path}: {unreadable.strerror}") from None
    try:
        ssl.create_default_context(cafile=str(cert))
    except ssl.SSLError:
        raise CertificateError(f"{cert} holds no certificate in PEM form") from None
    try:
        _new_context().load_cert_chain(cert, key, password=_no_passphrase)
    except _Encrypted:
        raise CertificateError(f"{key} is encrypted: give the key without a passphrase") from None
    except ssl.SSLError as wrong:
        if wrong.reason == "KEY_VALUES_MISMATCH":
            raise CertificateError(f"the key in {key} is not the key of {cert}") from None
        raise CertificateError(f"{key} holds no private key in PEM form") from None


@dataclass(frozen=True, slots=True)
class Certificate:
    """The listeners' SSLContext and the files it was loaded from."""

    cert: Path
    key: Path
    context: ssl.SSLContext

    @classmethod
    def load(cls, cert: Path, key: Path) -> Certificate:
        """The context with `cert` and `key` loaded; CertificateError if they do not load."""
        _check(cert, key)
        context = _new_context()
        context.load_cert_chain(cert, key)
        return cls(cert, key, context)

    def reload(self) -> bool:
        """Load the files again into the live context (SIGHUP); on failure, log why and keep
        the certificate in use. Whether the new one is in."""
        try:
            _check(self.cert, self.key)
            self.context.load_cert_chain(self.cert, self.key)
        except CertificateError as wrong:
            log.error("TLS certificate not reloaded, the one in use stays: %s", wrong)
            return False
        log.info("TLS certificate reloaded from %s", self.cert)
        return True
