"""Decide the CI's dependency audit from `pip-audit -f json` on stdin.

Fails (exit 1) on a known vulnerability that has a fixed version to move to; lists the
ones without a fix and goes on. When pip-audit could audit nothing (no report at all, or
every dependency skipped: its vulnerability database, PyPI's JSON API or OSV, was out of
reach), it says so in capitals and goes on, unless STILLHERE_AUDIT_REQUIRED=1 makes that
a failure too (exit 2): a run that audited nothing must never pass as a clean audit.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

EDITABLE = "distribution marked as editable"  # the project itself, not a dependency


def decide(report: dict[str, Any] | None, required: bool) -> tuple[int, list[str]]:
    """The exit status and the lines to print."""
    if report is None:
        return _not_audited("pip-audit gave no report (its error is above)", required)
    deps = [d for d in report.get("dependencies", []) if d.get("skip_reason") != EDITABLE]
    skipped = [d for d in deps if "skip_reason" in d]
    if deps and len(skipped) == len(deps):
        first = skipped[0]["skip_reason"]
        return _not_audited(f"none of {len(deps)} dependencies audited ({first})", required)
    fixable, unfixed = [], []
    for dep in deps:
        for vuln in dep.get("vulns", []):
            line = f"{dep['name']} {dep.get('version', '?')}: {vuln['id']}"
            if vuln.get("fix_versions"):
                fixable.append(f"{line}, fixed in {', '.join(vuln['fix_versions'])}")
            else:
                unfixed.append(f"{line}, no fix yet")
    lines = [f"dependency audit: {len(deps) - len(skipped)} of {len(deps)} dependencies audited"]
    lines += [f"  not audited: {d['name']}: {d['skip_reason']}" for d in skipped]
    lines += [f"  known vulnerability (no fix available, not failing): {u}" for u in unfixed]
    if fixable:
        lines += [f"  KNOWN VULNERABILITY WITH A FIX: {f}" for f in fixable]
        return 1, [*lines, "dependency audit FAILED: upgrade the packages above"]
    return 0, [*lines, "dependency audit passed: no known vulnerability with a fix"]


def _not_audited(why: str, required: bool) -> tuple[int, list[str]]:
    lines = [
        f"DEPENDENCIES NOT AUDITED: {why}.",
        "pip-audit needs network access to PyPI's JSON API (or OSV) for its advisories.",
    ]
    if required:
        return 2, [*lines, "failing: STILLHERE_AUDIT_REQUIRED=1"]
    return 0, [*lines, "going on without the audit (STILLHERE_AUDIT_REQUIRED=1 makes it fail)"]


def main() -> int:
    raw = sys.stdin.read()
    try:
        report = json.loads(raw) if raw.strip() else None
    except json.JSONDecodeError:
        report = None
    status, lines = decide(report, os.environ.get("STILLHERE_AUDIT_REQUIRED") == "1")
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
