"""Secrets never leave: a whole server scenario (turns, a model and an embeddings API that
fail and quote the key back, refusals, the admin API, /metrics, `serve --help`) with every
secret set, everything captured (logs at DEBUG, frames, error bodies, admin answers,
metrics, output) and searched for each secret."""

from __future__ import annotations

import logging
import secrets
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import pytest

from cli.main import main
from tests.conftest import Harness, Phone
from tests.fakes import embeddings_server
from tests.fakes.embeddings_server import FakeEmbeddings
from tests.fakes.openai_server import Fail, FakeOpenAI, Reply
from transport.identity import TOKEN_LEEWAY_S

SERVER_SECRET = "test-secret-of-at-least-32-bytes"  # the harness's
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


def with_password(dsn: str, password: str) -> str:
    """The DSN with a password (the embedded server trusts local connections: unused)."""
    parts = urlsplit(dsn)
    user, _, host = parts.netloc.rpartition("@")
    netloc = f"{user.split(':')[0] or 'postgres'}:{password}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


class Captured:
    """Everything the scenario saw leave the server."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, value: Any) -> None:
        self.parts.append(value if isinstance(value, str) else orjson.dumps(value).decode())

    async def answer(self, harness: Harness, method: str, url: str, **kw: Any) -> int:
        async with harness.http.request(method, url, **kw) as response:
            self.add(await response.text())
            self.add(str(dict(response.headers)))
            return response.status


async def test_no_secret_reaches_logs_metrics_errors_or_the_admin_api(
    harness: Harness,
    fake_llm: FakeOpenAI,
    fake_embeddings: FakeEmbeddings,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    keys = {name: f"sk-{name}-{secrets.token_hex(12)}" for name in ("llm", "analysis", "embed")}
    admin_token = "admin-" + secrets.token_urlsafe(24)
    password = "pw-" + secrets.token_hex(12)
    device = secrets.token_urlsafe(24)
    harness.dsn = with_password(harness.dsn, password)
    await harness.start(
        llm_url=fake_llm.url,
        llm_key=keys["llm"],
        analysis_url=fake_llm.url,
        analysis_key=keys["analysis"],
        embed_url=fake_embeddings.url,
        embed_model="fake",
        embed_key=keys["embed"],
        admin_token=admin_token,
        admin_port=0,
        llm_timeout=5.0,
    )
    token = harness.server.identity.issue("hannah")
    expired = harness.server.identity.issue("hannah", ttl_s=-TOKEN_LEEWAY_S - 10)
    seen = Captured()

    # Turns: one answered, one whose model refuses the key and quotes it back, one that
    # remembers (the embeddings API refuses too, quoting its key).
    fake_llm.queue(
        Reply("Noted."),
        Fail(401, f"Incorrect API key provided: {keys['llm']}"),
        Reply("", tool_calls=[("remember", {"text": "Owen lives in Bristol", "type": "fact"})]),
        Reply("I will remember that."),
    )
    fake_embeddings.queue(*[embeddings_server.Fail(401, "invalid key {key}")] * 3)
    phone = await harness.phone(device)
    by_token = Phone(harness, None)  # type: ignore[arg-type]
    await by_token.connect(token=token)
    for text in ("Hello there", "And now?", "Remember that Owen lives in Bristol"):
        await phone.say(text)
        await phone.reply()
    await by_token.say("From the account")
    await by_token.reply()
    await harness.recorded()

    # Refusals of every kind.
    for credentials in ({"token": expired}, {"token": token + "x"}, {"device": device[:10]}):
        async with harness.http.ws_connect(harness.url("/v1/ws")) as ws:
            await ws.send_str(orjson.dumps({"type": "hello", "v": 1, **credentials}).decode())
            seen.add((await ws.receive(timeout=10)).data)
    auth = {"Authorization": f"Bearer {token}"}
    await seen.answer(harness, "POST", harness.url("/v1/say"), data=b"{not json", headers=auth)
    await seen.answer(harness, "GET", harness.url("/v1/events"), params={"token": expired})
    await seen.answer(harness, "POST", harness.url("/v1/memories"), json={"text": 3}, headers=auth)
    await seen.answer(
        harness, "GET", harness.url("/v1/memories"), headers={"X-Stillhere-Device": device}
    )

    # The admin API, with and without its token; /metrics.
    admin = f"http://127.0.0.1:{harness.server.admin_port}/admin"
    person = harness.person(phone)
    good = {"Authorization": f"Bearer {admin_token}"}
    for path in ("/actors", f"/actors/{person}", f"/actors/{person}/turns", "/sweeps"):
        assert await seen.answer(harness, "GET", admin + path, headers=good) == 200
    await seen.answer(harness, "GET", admin + "/actors", headers={"Authorization": "Bearer no"})
    await seen.answer(harness, "GET", harness.url("/metrics"))

    seen.parts += [str(f) for f in phone.frames + by_token.frames]
    await phone.close()
    await by_token.close()
    await harness.stop()

    for name, value in {**keys, "admin": admin_token, "password": password}.items():
        monkeypatch.setenv(f"STILLHERE_{name.upper()}_KEY", value)
    monkeypatch.setenv("STILLHERE_SECRET", SERVER_SECRET)
    monkeypatch.setenv("STILLHERE_ADMIN_TOKEN", admin_token)
    monkeypatch.setenv("STILLHERE_DB", harness.dsn)
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out, err = capsys.readouterr()

    everything = "\n".join([caplog.text, out, err, *seen.parts])
    assert "Incorrect API key" in caplog.text or "401" in caplog.text  # the failure was seen
    assert "/admin/actors" in caplog.text and "stillhere_" in everything  # so were the rest
    used = {
        "device secret": device,
        "account token": token,
        "token signature": token.rsplit(".", 1)[1],
        "expired token": expired,
        "server secret": SERVER_SECRET,
        "admin token": admin_token,
        "DSN password": password,
        **{f"{name} API key": key for name, key in keys.items()},
    }
    # Help texts wrap long words across lines: a secret split there is still shown.
    flat = "".join(everything.split())
    leaked = [name for name, value in used.items() if value in everything or value in flat]
    assert leaked == []
