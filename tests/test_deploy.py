"""The files in deploy/ are what HAProxy and nginx accept: checked by the real programs,
Debian's packages, as the example stands and as `stillhere cluster` fills it in."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cli import haproxy
from tests.tls_support import Authority, needs_openssl

try:
    HAPROXY: str | None = haproxy.find()
except haproxy.HAProxyMissing:
    HAPROXY = None
needs_haproxy = pytest.mark.skipif(
    HAPROXY is None, reason="HAProxy is not installed (apt-get install haproxy)"
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
