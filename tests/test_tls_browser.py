"""The app in a secure context: Chromium opens it over HTTPS from `stillhere serve
--tls-cert`, the test's certificate trusted by the browser (its public key pinned with
`--ignore-certificate-errors-spki-list`), and links up over `wss://` ("Connected"), with
HSTS, and notifications granted. Over plain HTTP from a name that is not this
computer, the page says which features the browser withholds and why; from 127.0.0.1
(a secure context too) it says nothing."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from tests.browser_support import (
    CHROMIUM,
    Served,
    Tab,
    _Elsewhere,
    open_tab,
    server,
    serving,
    tabs,
)
from tests.tls_support import TEST_HOST, Authority, Pair, authority, needs_openssl

__all__ = ["authority", "server", "tabs"]  # the fixtures
pytestmark = needs_openssl
PLAIN_HOST = "plain.test"  # a name apart: HSTS learnt for TEST_HOST would upgrade it


@pytest.fixture(scope="module")
def certificate(authority: Authority) -> Pair:
    return authority.issue("app")


@pytest.fixture(scope="module")
def secure_server(
    postgres: str, tmp_path_factory: pytest.TempPathFactory, authority: Authority, certificate: Pair
) -> Iterator[Served]:
    options = ["--tls-cert", str(certificate.cert), "--tls-key", str(certificate.key)]
    options += ["--embed-local", "minilm"]
    folder = tmp_path_factory.mktemp("secure")
    with serving(postgres, folder, options, authority.client_context()) as served:
        yield served


@pytest.fixture(scope="module")
def browser(certificate: Pair) -> Iterator[Browser]:
    """Chromium trusting the test's certificate, with both test names on 127.0.0.1."""
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM}: install Debian's chromium package (.ci/run does)")
    args = [
        f"--ignore-certificate-errors-spki-list={certificate.spki_hash()}",
        f"--host-resolver-rules=MAP {TEST_HOST} 127.0.0.1, MAP {PLAIN_HOST} 127.0.0.1",
    ]
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)
        yield launched
        launched.close()


def at(served: Served, host: str) -> str:
    """The server's page, reached by the name `host`."""
    parts = urlsplit(served.base)
    return f"{parts.scheme}://{host}:{parts.port}/"


def test_the_app_over_https_links_up_in_a_secure_context(
    browser: Browser, tabs: list[Tab], secure_server: Served
) -> None:
    tab = open_tab(browser, tabs, "")
    answer = tab.page.goto(at(secure_server, TEST_HOST))
    assert answer is not None and answer.ok
    assert answer.headers["strict-transport-security"] == "max-age=63072000"
    expect(tab.page.get_by_role("status")).to_have_text("Connected")
    assert tab.page.evaluate("window.isSecureContext") is True
    expect(tab.page.get_by_role("note", name="Insecure page")).to_be_hidden()
    tab.context.grant_permissions(["notifications"], origin=at(secure_server, TEST_HOST)[:-1])
    tab.page.get_by_role("button", name="Settings").click()
    tab.page.get_by_role("button", name="Allow reminder notifications").click()
    assert tab.page.evaluate("Notification.permission") == "granted"


def test_over_plain_http_from_afar_the_app_says_what_is_withheld(
    browser: Browser, tabs: list[Tab], server: Served
) -> None:
    tab = open_tab(browser, tabs, "")
    with pytest.raises(PlaywrightError, match="can't be granted"):  # what the page says
        tab.context.grant_permissions(["notifications"], origin=at(server, PLAIN_HOST)[:-1])
    tab.page.goto(at(server, PLAIN_HOST))
    expect(tab.page.get_by_role("status")).to_have_text("Connected")
    assert tab.page.evaluate("window.isSecureContext") is False
    notice = tab.page.get_by_role("note", name="Insecure page")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("withholds reminder notifications")
    expect(notice).to_contain_text("Open it over https://")
    tab.page.get_by_role("button", name="Settings").click()
    expect(tab.page.get_by_role("button", name="Allow reminder notifications")).to_be_disabled()
    local = open_tab(browser, tabs, server.base + "/")
    expect(local.page.get_by_role("status")).to_have_text("Connected")
    expect(local.page.get_by_role("note", name="Insecure page")).to_be_hidden()


def test_another_certificate_is_refused(browser: Browser, authority: Authority) -> None:
    """The browser accepts the test's certificate only, not its authority's others: the
    pin makes the links above verified, not unchecked."""
    other = authority.issue("other")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(other.cert, other.key)
    site = ThreadingHTTPServer(("127.0.0.1", 0), _Elsewhere)
    site.socket = context.wrap_socket(site.socket, server_side=True)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    page_context = browser.new_context()
    try:
        with pytest.raises(PlaywrightError, match="ERR_CERT_AUTHORITY_INVALID"):
            page_context.new_page().goto(f"https://{TEST_HOST}:{site.server_address[1]}/")
    finally:
        page_context.close()
        site.shutdown()
        site.server_close()
