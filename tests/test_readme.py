"""The README's examples work as a newcomer runs them: each code block that talks to a
server (Python, or shell that names the server's address) is run against a real
`stillhere serve`, twice, as someone trying it twice would; each run must finish."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.test_restart import ROOT, ServerProcess

README = ROOT / "README.md"
ADDRESS = "127.0.0.1:8765"  # where the README's server listens
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
STARTS_A_SERVER = re.compile(r"\bstillhere (serve|cluster)\b|apt-get")
RUN_TIMEOUT_S = 60.0
RUNS = 2


def examples() -> list[tuple[str, str]]:
    """(language, code) of each block that talks to the README's server without starting
    one: every Python block, and the shell blocks that name its address."""
    found: list[tuple[str, str]] = []
    for language, code in BLOCK.findall(README.read_text()):
        if language == "python" or (
            language in ("bash", "sh", "shell")
            and ADDRESS in code
            and not STARTS_A_SERVER.search(code)
        ):
            found.append((language, code))
    return found


EXAMPLES = examples()
IDS = [f"{language}-{n}" for n, (language, _) in enumerate(EXAMPLES, 1)]


def test_the_readme_has_examples_to_run() -> None:
    assert any(language == "python" for language, _ in EXAMPLES), "no example was found"


@pytest.fixture
async def served(dsn: str, tmp_path: Path) -> AsyncIterator[ServerProcess]:
    server = ServerProcess(dsn, tmp_path / "data", tmp_path / "serve.log")
    async with aiohttp.ClientSession() as http:
        await server.start(http)
    yield server
    await server.kill()


async def run(language: str, code: str, port: int) -> tuple[int | None, str]:
    """The example with the server's address swapped in: its exit code (None: it did not
    finish in time) and its output."""
    code = code.replace(ADDRESS, f"127.0.0.1:{port}")
    argv = [sys.executable, "-c", code] if language == "python" else ["bash", "-c", code]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        output, _ = await proc.communicate()
        return None, output.decode(errors="replace")
    return proc.returncode, output.decode(errors="replace")


@pytest.mark.timeout(RUNS * RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize(("language", "code"), EXAMPLES, ids=IDS)
async def test_a_readme_example_runs_twice(served: ServerProcess, language: str, code: str) -> None:
    for attempt in range(1, RUNS + 1):
        code_, output = await run(language, code, served.port)
        assert code_ == 0, f"run {attempt} ended with {code_} (None: hung):\n{output}"
        assert "Traceback" not in output, output
