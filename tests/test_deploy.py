"""The files in deploy/ are what HAProxy and nginx accept: checked by the real programs,
Debian's packages, as the example stands and as `stillhere cluster` fills it in."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cli import haproxy
from tests.test_restart import free_port
from tests.tls_support import Authority, needs_openssl

try:
    HAPROXY: str | None = haproxy.find()
except haproxy.HAProxyMissing:
    HAPROXY = None
needs_haproxy = pytest.mark.skipif(
    HAPROXY is None,
    reason="HAProxy is not installed (.ci/run installs it: apt-get install haproxy)",
)
NGINX = shutil.which("nginx", path="/usr/sbin:/usr/local/sbin:/usr/bin")
NGINX_CONF = haproxy.TEMPLATE.parent / "nginx.conf"
EXAMPLE_PEM = "/etc/haproxy/certs/stillhere.pem"  # the examples' placeholders
EXAMPLE_CHAIN = "/etc/letsencrypt/live/stillhere.example.org/fullchain.pem"
EXAMPLE_KEY = "/etc/letsencrypt/live/stillhere.example.org/privkey.pem"


@needs_haproxy
@needs_openssl
def test_the_deploy_config_and_filled_ones_pass_haproxy_check(tmp_path: Path) -> None:
    """The example as it stands, its certificate's placeholder path made real (HAProxy
    loads it to check); filled in by the cluster, with TLS and without."""
    assert HAPROXY is not None
    pem = Authority.make(tmp_path / "ca").issue("edge").joined(tmp_path / "edge.pem")
    example = tmp_path / "example.cfg"
    template = haproxy.TEMPLATE.read_text()
    assert template.count(EXAMPLE_PEM) == 1
    example.write_text(template.replace(EXAMPLE_PEM, str(pem)))
    haproxy.check(HAPROXY, example)
    assert "http-request redirect scheme https code 301" in template
    nodes = [haproxy.Backend(f"node-{i}", "127.0.0.1", 9000 + i) for i in range(1, 4)]
    config = tmp_path / "haproxy.cfg"
    with_tls = haproxy.fill(template, "127.0.0.1:9000", nodes, pem)
    config.write_text(with_tls)
    haproxy.check(HAPROXY, config)
    assert f"    bind 127.0.0.1:9000 ssl crt {pem} alpn http/1.1\n" in with_tls
    filled = haproxy.fill(template, "127.0.0.1:9000", nodes)
    config.write_text(filled)
    haproxy.check(HAPROXY, config)
    assert "    bind 127.0.0.1:9000\n" in filled
    assert "http-request redirect" not in filled and "bind :80" not in filled  # one port
    assert "server node-3 127.0.0.1:9003\n" in filled
    assert "192.0.2." not in filled  # the example's servers are gone
    config.write_text(filled.replace("balance url_param r", "balance no-such-algorithm"))
    with pytest.raises(haproxy.BadConfig, match="balance only supports"):
        haproxy.check(HAPROXY, config)


def test_a_template_without_its_markers_is_refused() -> None:
    text = haproxy.TEMPLATE.read_text().replace("# nodes: end", "")
    with pytest.raises(haproxy.BadConfig, match="markers"):
        haproxy.fill(text, "127.0.0.1:9000", [])


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")
@needs_openssl
def test_the_nginx_example_passes_nginx_check(tmp_path: Path) -> None:
    """deploy/nginx.conf goes in nginx's `http` block: checked inside a minimal main file,
    its certificate's placeholder paths made real (nginx loads them to check)."""
    pair = Authority.make(tmp_path / "ca").issue("edge")
    example = NGINX_CONF.read_text()
    for placeholder, real in ((EXAMPLE_CHAIN, pair.cert), (EXAMPLE_KEY, pair.key)):
        assert example.count(placeholder) == 1
        example = example.replace(placeholder, str(real))
    (tmp_path / "stillhere.conf").write_text(example)
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"pid {tmp_path / 'nginx.pid'};\nerror_log stderr;\nevents {{}}\n"
        f"http {{\n    access_log off;\n    include {tmp_path / 'stillhere.conf'};\n}}\n"
    )
    checked = subprocess.run(
        [str(NGINX), "-t", "-c", str(main)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stderr
    assert "hash $arg_r consistent;" in NGINX_CONF.read_text()


class _Node(BaseHTTPRequestHandler):
    """A stand-in node: answers every GET with the forwarding headers it was sent (each
    header's lines joined, as HAProxy may add a line of its own)."""

    def do_GET(self) -> None:
        names = ("X-Forwarded-For", "X-Forwarded-Proto", "Host")
        body = json.dumps({h: ",".join(self.headers.get_all(h) or []) for h in names}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


@needs_haproxy
@needs_openssl
def test_the_example_redirects_to_https_and_tells_the_node_who_asked(tmp_path: Path) -> None:
    """deploy/haproxy.cfg as it stands, run by HAProxy with its ports and node changed:
    plain HTTP is redirected to HTTPS; over HTTPS the answer carries HSTS, and the node is
    told the scheme and the client's address, appended after one the client wrote."""
    assert HAPROXY is not None
    authority = Authority.make(tmp_path / "ca")
    pem = authority.issue("edge").joined(tmp_path / "edge.pem")
    node = ThreadingHTTPServer(("127.0.0.1", 0), _Node)
    threading.Thread(target=node.serve_forever, daemon=True).start()
    plain, secure = free_port(), free_port()
    config = re.sub(
        r"# nodes: begin\n.*# nodes: end",
        f"server node-1 127.0.0.1:{node.server_address[1]}",
        haproxy.TEMPLATE.read_text(),
        flags=re.DOTALL,
    )
    config = config.replace("bind :80", f"bind 127.0.0.1:{plain}")
    config = config.replace(
        f"bind :443 ssl crt {EXAMPLE_PEM}", f"bind 127.0.0.1:{secure} ssl crt {pem}"
    )
    (tmp_path / "haproxy.cfg").write_text(config)
    running = subprocess.Popen(
        haproxy.command(HAPROXY, tmp_path / "haproxy.cfg"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        opener = urllib.request.build_opener(_NoRedirects)
        redirected = _until_up(lambda: opener.open(f"http://127.0.0.1:{plain}/app/x?r=1"))
        assert redirected.code == 301
        assert redirected.headers["Location"] == f"https://127.0.0.1:{plain}/app/x?r=1"
        context = authority.client_context()
        forged = urllib.request.Request(
            f"https://localhost:{secure}/readyz", headers={"X-Forwarded-For": "203.0.113.9"}
        )
        with urllib.request.urlopen(forged, timeout=10, context=context) as answer:
            assert answer.headers["Strict-Transport-Security"] == "max-age=63072000"
            seen = json.loads(answer.read())
        assert seen["X-Forwarded-Proto"] == "https"
        assert seen["X-Forwarded-For"].replace(" ", "") == "203.0.113.9,127.0.0.1"
        assert seen["Host"] == f"localhost:{secure}"
    finally:
        running.terminate()
        running.wait(10)
        node.shutdown()
        node.server_close()


def _until_up(request: Any) -> Any:
    """`request()`'s answer (an HTTPError is one), once HAProxy listens."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return request()
        except urllib.error.HTTPError as answer:
            return answer
        except OSError:
            assert time.monotonic() < deadline, "HAProxy did not listen"
            time.sleep(0.1)
