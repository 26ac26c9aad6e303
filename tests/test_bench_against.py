"""`python -m bench.against`, small: two real servers, one from another executable, timed
round by round. It asserts that the other executable is what serves the other side (a
wrapper that sends a delta per word, where this checkout's window sends two a reply) and
that the rounds are paired; never timings. A round is some 90 turns: fewer can take less
than one tick of the process CPU clock, and a round with no CPU reading has no ratio."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import against
from bench.procs import PROJECT, stillhere_command
from bench.revision import checked_out, commit_of

needs_git = pytest.mark.skipif(not (PROJECT / ".git").exists(), reason="not a git checkout")


@pytest.mark.timeout(110)
async def test_the_other_executable_serves_the_other_side(tmp_path: Path) -> None:
    other = tmp_path / "stillhere"
    other.write_text(f'#!/bin/sh\nexec {stillhere_command()} "$@" --delta-window 0\n')
    other.chmod(0o755)
    args = against.parse_args(
        [
            str(other), "--throughput-phones", "3", "--throughput-says", "30",
            "--throughput-rounds", "2", "--throughput-warmup", "1",
        ]
    )  # fmt: skip
    result = await against.measure(args, args.against)

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


@needs_git
@pytest.mark.timeout(110)
def test_a_revision_runs_from_its_own_worktree_which_goes_afterwards() -> None:
    with checked_out("HEAD") as revision:
        assert revision.commit == commit_of("HEAD")
        main = revision.tree / "cli" / "main.py"
        main.write_text(main.read_text() + '\nprint("the worktree\'s own")\n')
        shown = subprocess.run(
            [revision.executable, "--help"], capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("the worktree's own\n")
        assert "usage: stillhere" in shown.stdout
    assert not revision.tree.parent.exists()
    listed = subprocess.run(
        ["git", "-C", str(PROJECT), "worktree", "list"], capture_output=True, text=True
    )
    assert str(revision.tree) not in listed.stdout


@needs_git
def test_a_revision_is_named_by_its_commit_and_an_unknown_one_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = against.parse_args(["--rev", "HEAD"])
    assert args.against == f"HEAD ({commit_of('HEAD')[:12]})"
    with pytest.raises(SystemExit) as refused:
        against.parse_args(["--rev", "no-such-revision"])
    assert refused.value.code == 2
    assert "--rev no-such-revision: git rev-parse" in capsys.readouterr().err
