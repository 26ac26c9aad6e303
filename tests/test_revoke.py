"""Account tokens' expiry and clock-skew allowance, `stillhere token --expires`, and
`stillhere revoke`: refused at the next hello and request, live links closed at once."""

from __future__ import annotations

import argparse
import hmac
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import jwt
import orjson
import pytest

from cli.main import _parser, main
from storage import notices
from tests.conftest import Harness, Phone, eventually
from transport import admin
from transport.admin import AdminExposed
from transport.identity import TOKEN_LEEWAY_S, Identity, Unauthorized

SECRET = "test-secret-of-at-least-32-bytes"  # the harness's


def _token(account: str, **claims: Any) -> str:
    now = int(time.time())
    return jwt.encode({"sub": account, "iat": now, "exp": now + 3600, **claims}, SECRET)


def test_expiry_is_enforced_with_the_documented_allowance() -> None:
    identity = Identity(SECRET)
    now = int(time.time())
    within = _token("anna", exp=now - TOKEN_LEEWAY_S // 2)
    assert identity.verify(within) == "anna"  # a clock a little behind is forgiven
    for claims, why in (
        ({"exp": now - TOKEN_LEEWAY_S - 5}, "expired"),
        ({"iat": now + TOKEN_LEEWAY_S + 60}, "not valid yet"),
        ({"nbf": now + TOKEN_LEEWAY_S + 60}, "not valid yet"),
    ):
        with pytest.raises(Unauthorized, match=why):
            identity.verify(_token("anna", **claims))


def test_token_expires_takes_a_duration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "anna", "--secret", SECRET, "--expires", "7d"]) == 0
    claims = jwt.decode(capsys.readouterr().out.strip(), SECRET, algorithms=["HS256"])
    assert (claims["sub"], claims["exp"] - claims["iat"]) == ("anna", 7 * 24 * 3600)
    with pytest.raises(SystemExit):
        main(["token", "anna", "--secret", SECRET, "--expires", "soon"])


async def _revoke(harness: Harness, *who: str) -> str:
    """Run `stillhere revoke` against the harness's database; what it printed is checked
    by the caller through its effects."""
    args: argparse.Namespace = _parser().parse_args(
        ["revoke", *who, "--db", harness.dsn, "--secret", SECRET]
    )
    assert await args.run(args) == 0
    return args.person or Identity(SECRET).account_key(args.account)


async def _hello(harness: Harness, **credentials: Any) -> tuple[dict[str, Any], int | None]:
    """A hello's first answer and how the link then closed."""
    async with harness.http.ws_connect(harness.url("/v1/ws")) as ws:
        await ws.send_str(orjson.dumps({"type": "hello", "v": 1, **credentials}).decode())
        first = orjson.loads((await ws.receive(timeout=10)).data)
        await ws.receive(timeout=10)
        return first, ws.close_code


async def _closed_with(phone: Phone) -> int | None:
    assert phone.ws is not None
    await eventually(lambda: phone.ws is not None and phone.ws.closed)
    return phone.ws.close_code


async def test_a_revoked_account_is_cut_off_and_refused_until_lifted(
    harness: Harness, db: asyncpg.Connection
) -> None:
    await harness.start()
    anna, other = Phone(harness, None), await harness.phone()  # type: ignore[arg-type]
    await anna.connect(token=_token("anna"))
    await anna.say("Remember that the boiler man comes at nine")
    await anna.reply()
    person = await _revoke(harness, "anna")
    error = await anna.expect("error")
    assert (error["code"], await _closed_with(anna)) == ("revoked", 4403)
    assert await db.fetchval("SELECT count(*) FROM revocations WHERE person = $1", person) == 1

    first, code = await _hello(harness, token=_token("anna"))  # a fresh token changes nothing
    assert (first["code"], code) == ("revoked", 4403)
    headers = {"Authorization": f"Bearer {_token('anna')}"}
    async with harness.http.get(harness.url("/v1/memories"), headers=headers) as response:
        assert (response.status, (await response.json())["code"]) == (403, "revoked")
    async with harness.http.post(
        harness.url("/v1/say"), headers=headers, json={"id": "s9", "text": "hello?"}
    ) as response:
        assert (response.status, (await response.json())["code"]) == (403, "revoked")
    async with harness.http.get(harness.url("/v1/events"), headers=headers) as response:
        assert (response.status, (await response.json())["code"]) == (403, "revoked")
    assert await db.fetchval("SELECT count(*) FROM turns WHERE client_id = 's9'") == 0

    await other.say("Still here?")  # nobody else is touched
    assert (await other.reply())["text"]

    await _revoke(harness, "anna", "--lift")
    await eventually(lambda: person not in harness.server.identity.revoked)
    back = Phone(harness, None)  # type: ignore[arg-type]
    welcome = await back.connect(token=_token("anna"))
    assert welcome["resumed"] is True  # the conversation was kept, only the person refused
    await back.close()
    await other.close()


async def test_a_device_is_revoked_by_its_person_key(harness: Harness) -> None:
    await harness.start()
    phone = await harness.phone()
    await _revoke(harness, "--person", harness.person(phone))
    assert (await phone.expect("error"))["code"] == "revoked"
    first, code = await _hello(harness, device=phone.device)
    assert (first["code"], code) == ("revoked", 4403)


async def test_a_revocation_made_while_the_listener_was_down_is_not_missed(
    harness: Harness, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notices, "RECONNECT_S", 0.05)
    await harness.start()
    phone = await harness.phone()
    listening = (
        "SELECT pid FROM pg_stat_activity"
        " WHERE application_name = $1 AND datname = current_database()"
    )
    pids = [row["pid"] for row in await db.fetch(listening, notices.APPLICATION_NAME)]
    assert len(pids) == 1
    # Revoked in the same instant the listener is cut: its NOTIFY reaches nobody.
    await db.execute("SELECT pg_terminate_backend($1)", pids[0])
    person = harness.person(phone)
    await db.execute("INSERT INTO revocations (person) VALUES ($1)", person)
    assert (await phone.expect("error"))["code"] == "revoked"  # read again on reconnecting
    assert await _closed_with(phone) == 4403


async def test_the_admin_api_refuses_a_non_loopback_address_unless_allowed(
    harness: Harness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    constant_time = hmac.compare_digest

    def compare_digest(given: bytes, expected: bytes) -> bool:
        compared.append((given, expected))
        return constant_time(given, expected)

    monkeypatch.setattr(admin.hmac, "compare_digest", compare_digest)
    with pytest.raises(SystemExit):
        main(["serve", "--admin-token", "t" * 32, "--admin-host", "0.0.0.0"])
    assert "--admin-remote on" in capsys.readouterr().err
    with pytest.raises(AdminExposed):
        await harness.start(admin_token="t" * 32, admin_host="0.0.0.0", admin_port=0)
    await harness.stop()
    await harness.start(admin_token="t" * 32, admin_host="0.0.0.0", admin_port=0, admin_remote=True)
    assert harness.server.admin_port
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{harness.server.admin_port}/admin/actors",
            headers={"Authorization": "Bearer " + "t" * 32},
        ) as response,
    ):
        assert response.status == 200
    assert compared == [(b"t" * 32, b"t" * 32)]  # the token, compared in constant time


async def test_an_account_is_not_revoked_under_a_secret_made_up_on_the_spot(
    harness: Harness, db: asyncpg.Connection, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await harness.start()
    args = _parser().parse_args(
        ["revoke", "anna", "--db", harness.dsn, "--data-dir", str(tmp_path / "none")]
    )
    assert await args.run(args) == 2
    assert "no --secret" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()  # no secret made, nothing stored
    assert await db.fetchval("SELECT count(*) FROM revocations") == 0
