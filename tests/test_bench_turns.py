"""The turn-handling bench, small: two real servers (reply matching and the echo guard on and
off) on the tests' PostgreSQL, an analysis model over HTTP, short delays. It asserts the
report's shape and what turn handling must do (ask the analysis for the question answered
with a question, on the `on` server only, and never for the easy case), never speed."""

from __future__ import annotations

import pytest

from bench import turns


@pytest.mark.timeout(120)
async def test_the_report_has_both_scenarios_both_modes_and_what_was_asked(dsn: str) -> None:
    args = turns.parse_args(
        ["--rounds", "3", "--context-ms", "20", "--analysis-ms", "20", "--db", dsn]
    )
    result = await turns.run(args)

    assert (result["rounds"], result["context_ms"], result["analysis_ms"]) == (3, 20.0, 20.0)
    assert set(result["scenarios"]) == {"asked", "easy"}
    for figures in result["scenarios"].values():
        for mode in ("on", "matching", "off"):
            assert figures["first_delta_ms"][mode]["n"] == 3
            assert {"p50", "p99", "max"} <= set(figures["first_delta_ms"][mode])
        assert set(figures["added_ms"]) == set(figures["echo_guard_ms"]) == {"p50", "p99"}
        assert figures["target_met"] == (figures["added_ms"]["p50"] <= figures["target_p50_ms"])
    # One request a round from each server that matches replies; none for the easy case.
    assert result["scenarios"]["asked"]["analysis_requests"] == 6
    assert result["scenarios"]["easy"]["analysis_requests"] == 0
    assert "added p50" in turns.table(result)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        turns.parse_args(["--rounds", "0"])
    with pytest.raises(SystemExit):
        turns.parse_args(["--analysis-ms", "-1"])
