"""Who a link belongs to: refused credentials, accounts vs devices, isolation, no secrets kept."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest

from cli.main import main
from tests.conftest import Harness, Phone
from transport.identity import TOKEN_LEEWAY_S, Identity, Unauthorized

TABLES = ("conversations", "turns", "events", "cards", "reminders")
# The short secrets are the test's own; PyJWT would warn about each one.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


async def token_phone(harness: Harness, token: str, **hello: Any) -> Phone:
    """A phone that presents only an account token (no device secret)."""
    phone = Phone(harness, None)  # type: ignore[arg-type]
    await phone.connect(token=token, **hello)
    return phone


def server_identity(harness: Harness) -> Identity:
    """The running server's own signer, so its tokens are the ones it accepts."""
    return harness.server.identity


# Credentials, given the server's signer.
REFUSED: list[tuple[str, Callable[[Identity], dict[str, Any]]]] = [
    ("no credentials", lambda _: {}),
    ("null credentials", lambda _: {"device": None, "token": None}),
    ("device secret of 21 chars", lambda _: {"device": "d" * 21}),
    ("device secret not a string", lambda _: {"device": list("d" * 30)}),
    ("garbage token", lambda _: {"token": "not.a.token"}),
    (
        "token of another secret",
        lambda _: {"token": Identity("another-secret-of-at-least-32-bytes").issue("hannah")},
    ),
    ("expired token", lambda ours: {"token": ours.issue("hannah", ttl_s=-TOKEN_LEEWAY_S - 10)}),
    ("bad token beside a good device", lambda _: {"token": "garbage", "device": "d" * 30}),
]


@pytest.mark.parametrize("make", [c[1] for c in REFUSED], ids=[c[0] for c in REFUSED])
async def test_bad_credentials_are_refused_and_the_link_closed(
    harness: Harness, db: asyncpg.Connection, make: Callable[[Identity], dict[str, Any]]
) -> None:
    await harness.start()
    credentials = make(server_identity(harness))
    async with harness.http.ws_connect(harness.url("/v1/ws")) as ws:
        await ws.send_str(orjson.dumps({"type": "hello", "v": 1, **credentials}).decode())
        first = await ws.receive(timeout=10)
        assert first.type == aiohttp.WSMsgType.TEXT
        error = orjson.loads(first.data)
        assert (error["type"], error["code"]) == ("error", "unauthorized")
        closing = await ws.receive(timeout=10)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert await db.fetchval("SELECT count(*) FROM conversations") == 0


async def test_an_account_token_resumes_across_links_and_differs_from_a_device(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start()
    account = "hannah.jones@example.org"  # long enough to pass for a device secret too
    token = server_identity(harness).issue(account)
    first = await token_phone(harness, token)
    assert first.welcome["resumed"] is False
    await first.say("Hello from the kitchen")
    await first.reply()
    await first.close()

    second = await token_phone(harness, token)
    assert second.welcome["resumed"] is True
    assert second.welcome["conversation"] == first.welcome["conversation"]
    assert "Hello from the kitchen" in [t["text"] for t in second.welcome["history"]]

    for device in (account, token):  # the account's name, or its token, as a device secret
        other = await harness.phone(device)
        assert other.welcome["resumed"] is False
        assert other.welcome["conversation"] != first.welcome["conversation"]
        assert other.welcome["history"] == []
    assert await db.fetchval("SELECT count(DISTINCT person) FROM conversations") == 3


async def test_no_one_can_attach_to_another_persons_conversation(harness: Harness) -> None:
    """B names A's conversation and last_seq 0: B gets its own, and none of A's events."""
    await harness.start()
    alice = await harness.phone()
    await alice.say("Note that Owen arrives Friday evening.")
    card = await alice.expect("card")
    said = (await alice.reply())["text"]
    theirs = alice.welcome["conversation"]

    bob = await harness.phone(conversation=theirs, last_seq=0)
    assert bob.welcome["conversation"] != theirs
    assert bob.welcome["resumed"] is False
    assert (bob.welcome["history"], bob.welcome["cards"]) == ([], [])
    await bob.send({"type": "ping"})
    await bob.expect("pong")
    await bob.say("Bob was here")
    await bob.reply()
    seen_by_bob = orjson.dumps(bob.frames).decode()
    for text in ("Owen arrives Friday", card["card"]["text"], said, card["card"]["id"]):
        assert text not in seen_by_bob

    await alice.send({"type": "ping"})
    await alice.expect("pong")
    assert "Bob was here" not in orjson.dumps(alice.frames).decode()


async def settled(db: asyncpg.Connection, seq: int) -> None:
    async with asyncio.timeout(10):
        while await db.fetchval("SELECT coalesce(max(seq), 0) FROM events") < seq:
            await asyncio.sleep(0.02)


async def test_secrets_never_in_the_clear(
    harness: Harness, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither a device secret nor a token reaches the logs or any table."""
    caplog.set_level(logging.DEBUG)
    await harness.start()
    device = secrets.token_urlsafe(24)
    token = server_identity(harness).issue("hannah")
    expired = server_identity(harness).issue("hannah", ttl_s=-TOKEN_LEEWAY_S - 10)

    by_device = await harness.phone(device)
    await by_device.say("Note that Owen arrives Friday evening.")
    await by_device.reply()
    await by_device.say("Remind me to get the spare bed out on Thursday.")
    await by_device.expect("reminder")
    await by_device.reply()
    by_token = await token_phone(harness, token)
    await by_token.say("Hello there")
    await by_token.reply()
    async with harness.http.ws_connect(harness.url("/v1/ws")) as ws:
        await ws.send_json({"type": "hello", "v": 1, "token": expired})
        assert (await ws.receive_json(timeout=10))["code"] == "unauthorized"
    await by_device.send({"type": "leave"})
    await by_device.expect("bye")
    await settled(db, by_token.last_seq)

    assert await db.fetchval("SELECT count(*) FROM reminders") == 1  # the dump is not empty
    rows = [r[0] for t in TABLES for r in await db.fetch(f"SELECT t::text FROM {t} t")]
    dump = "\n".join(rows)
    logs = caplog.text
    for secret in (device, token, expired, token.rsplit(".", 1)[1]):
        assert secret not in dump
        assert secret not in logs


def test_token_command_prints_a_token_for_the_account(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    secret = "a-development-secret-of-32-bytes+"
    assert main(["token", "hannah", "--secret", secret]) == 0
    printed = capsys.readouterr().out.strip()
    assert Identity(secret).verify(printed) == "hannah"
    with pytest.raises(Unauthorized):
        Identity("not-" + secret).verify(printed)
