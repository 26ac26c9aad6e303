"""The paced bench, small: two real servers with different delta windows, bare phones.

It asserts what the windows must do to the frames (a delta per word against a first word
and then the rest in one), and that the CPU readings are there; never timings.
"""

from __future__ import annotations

import argparse

import pytest

from bench import paced


@pytest.mark.timeout(110)
async def test_each_window_is_timed_with_its_deltas_counted() -> None:
    args = paced.parse_args(
        [
            "--windows", "0,10s", "--phones", "3", "--says", "2", "--rounds", "1",
            "--rehearsal-latency", "0s", "--rehearsal-rate", "50",
        ]
    )  # fmt: skip
    result = await paced.run(args)

    per_piece, held = result["windows"]["0"], result["windows"]["10s"]
    assert result["baseline"] == "0" and per_piece["cpu_over_baseline"] == 1.0
    for figures in (per_piece, held):
        assert figures["turns"] == 6 and figures["errors"] == 0
        assert figures["server_cpu_ms_per_turn"] > 0
        assert figures["turn_ms"]["n"] == 6
    # A 10 s window outlasts every reply: its first word goes at once, the rest at the end.
    assert held["deltas_per_reply"] == 2
    assert per_piece["deltas_per_reply"] > 5, "a delta per word of an echoed say"
    assert held["cpu_over_baseline"] is not None
    assert "deltas/reply" in paced.table(result)


@pytest.mark.parametrize("windows", ["100ms", "20ms,soon"])
def test_windows_need_a_baseline_and_durations(windows: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        paced._windows(windows)


def test_counts_below_one_are_refused() -> None:
    with pytest.raises(SystemExit):
        paced.parse_args(["--phones", "0"])
