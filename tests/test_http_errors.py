"""Every answer of the main and admin listeners is JSON with a code: unknown routes, wrong
methods, oversized bodies and unexpected failures included, over real HTTP."""

from __future__ import annotations

from typing import Any

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
    wrong_method = await _answer(harness, "DELETE", url + "/admin/sweeps", headers=auth)

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
