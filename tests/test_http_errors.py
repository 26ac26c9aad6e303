"""Every answer of the main and admin listeners is JSON with a code: unknown routes, wrong
methods, oversized bodies and unexpected failures included, over real HTTP."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson
import pytest

from actors.directory import Directory
from tests.conftest import Harness
from transport.identity import Identity

TOKEN = "admin-token-for-tests-0123456789abcdef"
FAILURE = "injected failure 7f3a"


async def _answer(
    harness: Harness, method: str, url: str, **kwargs: Any
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with harness.http.request(method, url, **kwargs) as response:
        assert response.content_type == "application/json", await response.text()
        return response.status, orjson.loads(await response.read()), dict(response.headers)


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/no/such/page", 404, "not_found"),
        ("POST", "/v1/nothing-here", 404, "not_found"),
        ("GET", "/v1/say", 405, "method_not_allowed"),
        ("DELETE", "/v1/memories", 405, "method_not_allowed"),
        ("PUT", "/metrics", 405, "method_not_allowed"),
    ],
)
async def test_unknown_routes_and_methods_answer_json_with_a_code(
    harness: Harness, method: str, path: str, status: int, code: str
) -> None:
    await harness.start()
    got, body, headers = await _answer(harness, method, harness.url(path))

    assert (got, body["type"], body["code"]) == (status, "error", code)
    assert path in body["message"]
    if status == 405:
        assert method in body["message"] and headers["Allow"]


async def test_an_unexpected_failure_is_a_coded_500_without_a_traceback(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await harness.start()

    def broken(self: Identity, **credentials: Any) -> str:
        raise RuntimeError(FAILURE)

    monkeypatch.setattr(Identity, "person", broken)
    status, body, _ = await _answer(
        harness, "GET", harness.url("/v1/memories"), headers={"X-Stillhere-Device": "d" * 24}
    )

    assert (status, body["code"]) == (500, "internal_error")
    assert FAILURE not in str(body) and "Traceback" not in str(body)
    assert FAILURE in caplog.text  # the operator sees what failed, in the log


async def test_the_admin_listener_answers_json_for_every_error(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await harness.start(admin_token=TOKEN, admin_port=0)
    url = f"http://127.0.0.1:{harness.server.admin_port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}

    missing = await _answer(harness, "GET", url + "/nowhere", headers=auth)
    wrong_method = await _answer(
        harness, "DELETE", url + "/admin/sweeps", headers=auth, data=b"[" * 300_000
    )

    def broken(self: Directory) -> list[Any]:
        raise RuntimeError(FAILURE)

    monkeypatch.setattr(Directory, "lives", broken)
    failed = await _answer(harness, "GET", url + "/admin/actors", headers=auth)

    assert [(s, b["code"]) for s, b, _ in (missing, wrong_method, failed)] == [
        (404, "not_found"),
        (405, "method_not_allowed"),
        (500, "internal_error"),
    ]
    assert wrong_method[2]["Allow"] == "GET, HEAD"
    assert FAILURE not in str(failed[1]) and "Traceback" not in str(failed[1])


TABLES = ("conversations", "turns", "events", "cards", "rules")
NUL_TEXT = "tea\x00 with milk"


async def _rows(db: asyncpg.Connection) -> list[int]:
    return [await db.fetchval(f"SELECT count(*) FROM {table}") for table in TABLES]


@pytest.mark.parametrize(
    ("path", "body", "code", "words"),
    [
        ("/v1/say", {"id": "s1", "text": NUL_TEXT}, "invalid_text", "a say's `text` holds a NUL"),
        ("/v1/say", {"id": "s\x002", "text": "hi"}, "invalid_id", "a say's `id` holds a NUL"),
        ("/v1/say", {"id": "s3", "text": 7}, "invalid_text", "must be a string, not a number"),
        ("/v1/memories", {"text": NUL_TEXT}, "invalid_field", "text holds a NUL"),
        (
            "/v1/memories",
            {"text": "ok", "people": ["o\x00"]},
            "invalid_field",
            "people holds a NUL",
        ),
        ("/v1/memories", {"text": " "}, "invalid_field", "text holds only whitespace"),
        ("/v1/rules", {"text": NUL_TEXT}, "invalid_field", "text holds a NUL"),
        ("/v1/rules", {}, "invalid_field", "text is missing"),
    ],
)
async def test_a_refused_text_is_told_what_is_wrong_with_it_and_nothing_is_stored(
    harness: Harness, db: asyncpg.Connection, path: str, body: dict[str, Any], code: str, words: str
) -> None:
    await harness.start()
    before = await _rows(db)
    status, answer, _ = await _answer(
        harness, "POST", harness.url(path), json=body, headers={"X-Stillhere-Device": "d" * 24}
    )

    assert (status, answer["code"]) == (400, code)
    assert words in answer["message"]
    assert await _rows(db) == before


async def test_a_say_holding_a_nul_on_the_websocket_is_told_so(harness: Harness) -> None:
    await harness.start()
    phone = await harness.phone()
    await phone.send({"type": "say", "id": "s1", "text": NUL_TEXT})
    error = await phone.expect("error")
    assert (error["code"], error["id"]) == ("invalid_text", "s1")
    assert error["message"] == (
        "a say's `text` holds a NUL character (U+0000) at 3, which no text here may hold"
    )


DEPTH = 5000  # far past any parser's nesting limit, far under every size limit
BAD_BODIES = {
    "not json": b"{not json",
    "not utf-8": b"\xff\xfe\x00{",
    "a list": b"[1, 2]",
    "deeply nested": b"[" * DEPTH + b"]" * DEPTH,
    "deeply nested field": b'{"text": ' + b'{"a": ' * DEPTH + b"1" + b"}" * DEPTH + b"}",
    "oversized": orjson.dumps({"text": "x" * 300_000, "id": "big"}),
}
# Well-formed, but every field a route may read is of the wrong type: refused where the
# route reads fields; `interrupt` and `leave` read none, and answer as for an empty body.
WRONG_TYPES = orjson.dumps({"text": [1], "id": {"a": 1}, "ids": "all", "action": 7, "q": 2})
FIELDLESS = ("/v1/interrupt", "/v1/leave")


def _body_routes() -> list[tuple[str, str]]:
    """Every route of the main listener that takes a body, with its path filled in."""
    from transport.app import build_app
    from transport.config import Settings

    filled = {"{id}": "0e1c5d0a-1b2c-4d3e-8f40-516273849a0b"}
    routes = []
    for route in build_app(Settings()).router.routes():
        if route.method in ("POST", "PUT", "PATCH", "DELETE"):
            path = route.resource.canonical if route.resource else ""
            for name, value in filled.items():
                path = path.replace(name, value)
            routes.append((route.method, path))
    return routes


@pytest.mark.parametrize(("method", "path"), _body_routes(), ids=lambda v: str(v))
async def test_every_body_taking_route_refuses_bad_bodies_with_a_code_and_stores_nothing(
    harness: Harness, db: asyncpg.Connection, method: str, path: str
) -> None:
    await harness.start()
    device = {"X-Stillhere-Device": "d" * 24, "Content-Type": "application/json"}
    before = await _rows(db)
    answers = {}
    for name, raw in BAD_BODIES.items():
        status, body, _ = await _answer(
            harness, method, harness.url(path), data=raw, headers=device
        )
        answers[name] = (status, body["code"])
        assert body["type"] == "error" and body["message"] and "Traceback" not in body["message"]
    status, body, _ = await _answer(
        harness, method, harness.url(path), data=WRONG_TYPES, headers=device
    )
    if path not in FIELDLESS:
        answers["wrong types"] = (status, body["code"])
    assert all(400 <= status < 500 for status, _ in answers.values()), answers
    assert await _rows(db) == before
