"""A private certificate authority and server certificates, made by the system's `openssl`
(the project has no X.509 library of its own), for runs over TLS: `bench flap --tls`, and
the tests. EC P-256 keys, a CA with the key usages a strict verifier wants, and server
certificates for `127.0.0.1`, `localhost` and `stillhere.test` (a name the browser tests
map to 127.0.0.1). Clients trust the authority's file (`ca_file`): verification stays on."""

from __future__ import annotations

import base64
import hashlib
import secrets
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL = shutil.which("openssl")
TEST_HOST = "stillhere.test"
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
_SERVER_EXTENSIONS = (
    f"subjectAltName=DNS:{TEST_HOST},DNS:localhost,IP:127.0.0.1\n"
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature\n"
    "extendedKeyUsage=serverAuth\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid,issuer\n"
)


class OpensslFailed(Exception):
    """openssl is missing, or refused; the message is its own."""


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    if OPENSSL is None:
        raise OpensslFailed("no openssl command (apt-get install openssl)")
    done = subprocess.run([OPENSSL, *args], input=stdin, capture_output=True, timeout=30)
    if done.returncode != 0:
        raise OpensslFailed(done.stderr.decode(errors="replace").strip())
    return done.stdout


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, in PEM files."""

    cert: Path
    key: Path

    def spki_hash(self) -> str:
        """Base64 SHA-256 of the public key, as Chromium's `--ignore-certificate-errors-
        spki-list` takes it."""
        public = _openssl("x509", "-in", str(self.cert), "-pubkey", "-noout")
        der = _openssl("pkey", "-pubin", "-outform", "der", stdin=public)
        return base64.b64encode(hashlib.sha256(der).digest()).decode()

    def fingerprint(self) -> str:
        """SHA-256 of the certificate's DER, to tell which certificate a server presents."""
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(self.cert.read_text())).hexdigest()

    def joined(self, path: Path) -> Path:
        """Certificate and key in one PEM file (HAProxy's form)."""
        path.write_bytes(self.cert.read_bytes() + self.key.read_bytes())
        return path


@dataclass(frozen=True)
class Authority:
    """A test certificate authority: its own certificate and key, and `issue` for servers."""

    pair: Pair
    folder: Path

    @classmethod
    def make(cls, folder: Path, name: str = "ca") -> Authority:
        folder.mkdir(parents=True, exist_ok=True)
        cert, key = folder / f"{name}.pem", folder / f"{name}.key"
        _openssl(
            "req", "-x509", *_EC, "-keyout", str(key), "-out", str(cert), "-days", "2",
            "-subj", f"/CN=stillhere test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        return cls(Pair(cert, key), folder)

    @property
    def ca_file(self) -> Path:
        return self.pair.cert

    def issue(self, name: str) -> Pair:
        """A server certificate `name`.pem and key `name`.key, signed by this authority."""
        cert, key = self.folder / f"{name}.pem", self.folder / f"{name}.key"
        request, extensions = self.folder / f"{name}.csr", self.folder / f"{name}.ext"
        extensions.write_text(_SERVER_EXTENSIONS)
        _openssl("req", *_EC, "-keyout", str(key), "-out", str(request), "-subj", f"/CN={name}")
        _openssl(
            "x509", "-req", "-in", str(request), "-CA", str(self.pair.cert),
            "-CAkey", str(self.pair.key), "-set_serial", str(secrets.randbits(63) + 1),
            "-days", "2", "-out", str(cert), "-extfile", str(extensions),
        )  # fmt: skip
        return Pair(cert, key)

    def client_context(self) -> ssl.SSLContext:
        """A client's context that trusts this authority only, verification on."""
        return ssl.create_default_context(cafile=str(self.ca_file))
