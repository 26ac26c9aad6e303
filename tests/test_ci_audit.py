"""The CI's dependency audit (.ci/audit.py) on pip-audit reports: it fails on a known
vulnerability with a fix, and never passes a run that audited nothing as clean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

AUDIT = Path(__file__).parents[1] / ".ci" / "audit.py"
AIOHTTP = {"name": "aiohttp", "version": "3.9.0"}
CLEAN = {"name": "orjson", "version": "3.10.0", "vulns": []}
SELF = {"name": "stillhere", "skip_reason": "distribution marked as editable"}


def audit(report: Any, *, required: bool = False) -> tuple[int, str]:
    stdin = report if isinstance(report, str) else json.dumps(report)
    env = {"STILLHERE_AUDIT_REQUIRED": "1"} if required else {}
    done = subprocess.run(
        [sys.executable, str(AUDIT)], input=stdin, capture_output=True, text=True, env=env
    )
    return done.returncode, done.stdout


def vuln(fix: list[str]) -> dict[str, Any]:
    return {"id": "GHSA-test", "fix_versions": fix, "aliases": [], "description": "x"}


@pytest.mark.parametrize(
    ("deps", "status", "said"),
    [
        ([SELF, CLEAN], 0, "no known vulnerability with a fix"),
        (
            [CLEAN, {**AIOHTTP, "vulns": [vuln(["3.9.4"])]}],
            1,
            "aiohttp 3.9.0: GHSA-test, fixed in 3.9.4",
        ),
        ([CLEAN, {**AIOHTTP, "vulns": [vuln([])]}], 0, "no fix available, not failing"),
        ([SELF, {"name": "orjson", "skip_reason": "not found on PyPI"}], 0, "NOT AUDITED"),
    ],
)
def test_the_audit_decides_from_the_report(deps: list[Any], status: int, said: str) -> None:
    got, out = audit({"dependencies": deps, "fixes": []})
    assert got == status
    assert said in out


def test_an_audit_that_could_not_run_is_said_and_fails_when_required() -> None:
    for report in ("", "Traceback (most recent call last): ..."):
        assert audit(report)[0] == 0
        status, out = audit(report, required=True)
        assert (status, "DEPENDENCIES NOT AUDITED" in out) == (2, True)
    skipped = {"dependencies": [{"name": "orjson", "skip_reason": "not found"}], "fixes": []}
    assert audit(skipped, required=True)[0] == 2
