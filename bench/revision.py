"""Another revision of this repository, runnable as `stillhere` beside this checkout, for
`python -m bench.against --rev REV`.

The revision is checked out in a temporary git worktree and run by this checkout's Python
with the worktree first on its path (`-P`: not the folder a server is started in, which is
this checkout), so no second environment is built: the revision must need no dependency
this one lacks. Its `stillhere` entry point is read from its own pyproject.toml."""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.procs import PROJECT


class RevisionError(Exception):
    """git could not name or check out the revision; the message says why."""


@dataclass(frozen=True, slots=True)
class Revision:
    commit: str
    tree: Path  # the worktree, for as long as the revision is checked out
    executable: str  # its `stillhere`


def commit_of(rev: str) -> str:
    """The commit `rev` names in this repository."""
    return _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()


@contextlib.contextmanager
def checked_out(rev: str) -> Iterator[Revision]:
    """`rev` in a temporary worktree with its `stillhere`; both gone afterwards."""
    commit = commit_of(rev)
    root = Path(tempfile.mkdtemp(prefix="stillhere-rev-"))
    tree = root / "tree"
    try:
        _git("worktree", "add", "--detach", str(tree), commit)
        try:
            yield Revision(commit, tree, _executable(root, tree))
        finally:
            _git("worktree", "remove", "--force", str(tree))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _executable(root: Path, tree: Path) -> str:
    scripts = tomllib.loads((tree / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["stillhere"].split(":")
    code = f"import sys; sys.argv[0] = 'stillhere'; from {module} import {function}; "
    code += f"sys.exit({function}())"
    script = root / "stillhere"
    script.write_text(
        f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(tree))} "
        f'exec {shlex.quote(sys.executable)} -P -c {shlex.quote(code)} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(PROJECT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        why = done.stderr.strip() or "not a revision of this repository"
        raise RevisionError(f"git {args[0]}: {why}")
    return done.stdout
