"""`python -m bench.against`, small: two real servers, one from another executable, timed
round by round. It asserts that the other executable is what serves the other side (a
wrapper that sends a delta per word, where this checkout's window sends two a reply) and
that the rounds are paired; never timings."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import against
from bench.procs import stillhere_command


@pytest.mark.timeout(110)
async def test_the_other_executable_serves_the_other_side(tmp_path: Path) -> None:
    other = tmp_path / "stillhere"
    other.write_text(f'#!/bin/sh\nexec {stillhere_command()} "$@" --delta-window 0\n')
    other.chmod(0o755)
    args = against.parse_args(
        [
            str(other), "--throughput-phones", "3", "--throughput-says", "3",
            "--throughput-rounds", "2", "--throughput-warmup", "1",
        ]
    )  # fmt: skip
    result = await against.measure(args)

    this, theirs = result["servers"]["this"], result["servers"]["against"]
    assert this["errors"] == {} and theirs["errors"] == {}
    # A zero-latency reply within this checkout's window: its first word, then the rest.
    assert this["deltas_per_reply"] == 2
    assert theirs["deltas_per_reply"] > 5, "a delta per word of an echoed say"
    for key in ("cpu_per_turn_ratio", "turns_per_s_ratio"):
        assert len(result[key]["rounds"]) == 2 and result[key]["median"] > 0
    assert "this / against" in against.table(result)


def test_the_other_side_must_be_an_executable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        against.parse_args([str(tmp_path / "stillhere")])
    assert refused.value.code == 2
    assert "not an executable" in capsys.readouterr().err
