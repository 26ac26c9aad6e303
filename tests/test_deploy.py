"""The files in deploy/ are what HAProxy and nginx accept: checked by the real programs,
Debian's packages, as the example stands and as `stillhere cluster` fills it in."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cli import haproxy

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


@needs_haproxy
def test_the_deploy_config_and_a_filled_one_pass_haproxy_check(tmp_path: Path) -> None:
    assert HAPROXY is not None
    haproxy.check(HAPROXY, haproxy.TEMPLATE)
    nodes = [haproxy.Backend(f"node-{i}", "127.0.0.1", 9000 + i) for i in range(1, 4)]
    filled = haproxy.fill(haproxy.TEMPLATE.read_text(), "127.0.0.1:9000", nodes)
    config = tmp_path / "haproxy.cfg"
    config.write_text(filled)
    haproxy.check(HAPROXY, config)
    assert "    bind 127.0.0.1:9000\n" in filled
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
def test_the_nginx_example_passes_nginx_check(tmp_path: Path) -> None:
    """deploy/nginx.conf goes in nginx's `http` block: checked inside a minimal main file."""
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"pid {tmp_path / 'nginx.pid'};\nerror_log stderr;\nevents {{}}\n"
        f"http {{\n    access_log off;\n    include {NGINX_CONF};\n}}\n"
    )
    checked = subprocess.run(
        [str(NGINX), "-t", "-c", str(main)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stderr
    assert "hash $arg_r consistent;" in NGINX_CONF.read_text()
