"""HAProxy for `stillhere cluster`: found on the system, configured from deploy/haproxy.cfg.

The cluster runs Debian's HAProxy rather than a balancer of its own: the same configuration
file is the one an operator puts in front of nodes on many machines (deploy/README.md), so
what the cluster runs is what that file says. The cluster fills in the address it listens
on (the `stillhere` frontend's `bind`, with TLS when given a certificate) and the nodes
(the `server` lines between the `# nodes: begin` and `# nodes: end` markers), leaves out
the HTTP-to-HTTPS redirect (between the `# redirect:` markers: the cluster has one port),
and has HAProxy check the result before starting it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from transport.tls import Certificate

TEMPLATE = Path(__file__).resolve().parent.parent / "deploy" / "haproxy.cfg"
INSTALL_HINT = "apt-get install haproxy"
# Where Debian puts it, often off a user's PATH.
SYSTEM_DIRS = ("/usr/sbin", "/usr/local/sbin")

_BIND = re.compile(r"^(?P<indent>[ \t]+)bind \S+.*$", re.MULTILINE)
_REDIRECT = re.compile(r"^# redirect: begin\n.*?^# redirect: end\n+", re.MULTILINE | re.DOTALL)
# HTTP/1.1 only: a WebSocket upgrades from it.
TLS_BIND = "ssl crt {pem} alpn http/1.1"
_NODES = re.compile(
    r"^(?P<indent>[ \t]+)# nodes: begin\n.*?^[ \t]+# nodes: end$", re.MULTILINE | re.DOTALL
)


class HAProxyMissing(Exception):
    """No HAProxy to run."""


class BadConfig(Exception):
    """HAProxy refused the configuration; the message is its own."""


@dataclass(frozen=True, slots=True)
class Backend:
    """One node as HAProxy reaches it."""

    name: str
    host: str
    port: int


def find(given: str | None = None) -> str:
    """The haproxy executable: `given`, else on PATH or in the system's sbin folders."""
    if given is not None:
        found = shutil.which(given)
    else:
        search = os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_DIRS])
        found = shutil.which("haproxy", path=search)
    if found is None:
        where = given or "haproxy (on PATH, /usr/sbin or /usr/local/sbin)"
        raise HAProxyMissing(
            f"{where} not found: stillhere cluster runs HAProxy in front of the nodes; "
            f"install Debian's package with `{INSTALL_HINT}`"
        )
    return found


def fill(template: str, bind: str, nodes: list[Backend], pem: Path | None = None) -> str:
    """The template with its frontend bound to `bind` (host:port), speaking TLS with the
    certificate and key in `pem` if given, without the redirect, and `nodes` as servers."""
    text = _REDIRECT.sub("", template)
    if len(_BIND.findall(text)) != 1 or _NODES.search(text) is None:
        raise BadConfig(
            "the template needs one `bind` line besides the redirect's, and the `# nodes:` markers"
        )
    listen = bind if pem is None else f"{bind} {TLS_BIND.format(pem=pem)}"
    text = _BIND.sub(lambda m: f"{m['indent']}bind {listen}", text)

    def servers(found: re.Match[str]) -> str:
        indent = found["indent"]
        lines = [f"{indent}server {n.name} {n.host}:{n.port}" for n in nodes]
        return "\n".join([f"{indent}# nodes: begin", *lines, f"{indent}# nodes: end"])

    return _NODES.sub(servers, text)


def write_pem(cert: Path, key: Path, pem: Path) -> None:
    """The certificate chain and its key in one file, HAProxy's form, readable by its owner
    only; CertificateError (naming the file) if they do not load together."""
    Certificate.load(cert, key)
    fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(cert.read_bytes().rstrip(b"\n") + b"\n" + key.read_bytes())


def check(haproxy: str, config: Path) -> None:
    """Raise BadConfig with HAProxy's own words unless `haproxy -c` accepts `config`."""
    checked = subprocess.run(
        [haproxy, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30
    )
    if checked.returncode != 0:
        raise BadConfig((checked.stdout + checked.stderr).strip() or f"exit {checked.returncode}")


def command(haproxy: str, config: Path) -> list[str]:
    """HAProxy in the foreground (`-db`), as a supervised child: SIGTERM stops it."""
    return [haproxy, "-db", "-f", str(config)]
