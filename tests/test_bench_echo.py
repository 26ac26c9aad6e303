"""The echo bench, small: two real servers (guard on and off) on the tests' PostgreSQL, a
scripted model over HTTP, a few non-echo replies. It asserts the report's shape and what the
guard must do to these replies (hold them, the first delta later with it on), never speed."""

from __future__ import annotations

import pytest

from bench import echo


@pytest.mark.timeout(60)
async def test_the_report_has_both_modes_and_the_hold_back(dsn: str) -> None:
    args = echo.parse_args(["--limit", "3", "--rounds", "2", "--rate", "200", "--db", dsn])
    result = await echo.run(args)

    assert (result["cases"], result["rounds"], result["rate_words_per_s"]) == (3, 2, 200.0)
    for mode in ("on", "off"):
        figures = result["first_delta_ms"][mode]
        assert figures["n"] == 6 and {"p50", "p99", "max"} <= set(figures)
    assert set(result["hold_ms"]) == {"p50", "p99"}
    # The first cases start like the person's message: each is held a few words.
    assert result["held_words"]["replies_held"] == 3 and result["held_words"]["max"] >= 2
    assert "hold-back (on - off)" in echo.table(result)


def test_only_non_echo_replies_to_one_message_are_benched() -> None:
    cases = echo.bench_cases(echo.CASES, None)
    assert len(cases) >= 30
    assert all(c.row["reply"] == c.row["shown"] and len(c.row["turns"]) == 1 for c in cases)
