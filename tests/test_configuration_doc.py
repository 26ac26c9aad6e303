"""docs/configuration.md is `serve`'s option table as the parser has it: written from the one
table in transport/config.py, every option there, every default one the option takes back."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from cli import serve
from cli.configuration import markdown
from transport.config import GROUPS, default_of, shown_default

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"


def serve_parser() -> argparse.ArgumentParser:
    commands = argparse.ArgumentParser(prog="stillhere").add_subparsers()
    serve.add_parser(commands)
    parser: argparse.ArgumentParser = commands.choices["serve"]
    return parser


def serve_help(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    return serve_parser().format_help()


def test_the_page_is_what_the_option_table_writes() -> None:
    assert PAGE.read_text(encoding="utf-8") == markdown(), (
        "docs/configuration.md is stale: run `python -m cli.configuration > docs/configuration.md`"
    )


def test_the_page_and_the_help_name_the_same_options(monkeypatch: pytest.MonkeyPatch) -> None:
    in_help = set(re.findall(r"^\s+(--[a-z-]+)", serve_help(monkeypatch), re.MULTILINE))
    in_page = set(re.findall(r"^\| `(--[a-z-]+)`", PAGE.read_text(encoding="utf-8"), re.MULTILINE))
    assert in_help - {"--help"} == in_page
    assert {"--embed-local", "--resume-window", "--link-buffer", "--admin-token"} <= in_page


def test_every_shown_default_is_one_the_option_takes_back() -> None:
    """`30m`, `64KiB`, `on`, `stop,wait,...`: typed back, each is the default itself."""
    checked = 0
    for option in (option for group in GROUPS for option in group.options):
        value = default_of(option)
        if value in (None, ()):
            continue  # shown in words: what no value means
        typed_back = option.kind(shown_default(option, value))
        assert typed_back == (tuple(value) if isinstance(value, tuple) else value), option.name
        checked += 1
    assert checked > 50


def test_the_help_is_grouped_with_a_short_usage_and_durations_as_durations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = serve_help(monkeypatch)
    assert text.startswith("usage: stillhere serve [options]\n\n")
    titles = re.findall(r"^([a-z][a-z ]+):$", text, re.MULTILINE)
    assert titles == ["options", *(group.title for group in GROUPS)]
    words = " ".join(text.split())
    assert "--resume-window TIME a hello within this much of the last activity resumes" in words
    assert "resumes the conversation (default 30m)" in words
    assert "--link-buffer BYTES bytes held" in words and "(default 1MiB)" in words
    assert "--embed-local pair|minilm|use" in words
    assert "1800" not in text and "None" not in text


def test_the_help_shows_a_default_from_the_environment_and_never_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STILLHERE_RESUME_WINDOW", "90s")
    monkeypatch.setenv("STILLHERE_ADMIN_TOKEN", "admin-secret-in-env")
    monkeypatch.setenv("STILLHERE_DB", "postgresql://me:pg-secret@db/stillhere")
    text = serve_help(monkeypatch)
    assert "(default 90s)" in text and "(default set, not shown)" in text
    assert "(default postgresql://me:***@db/stillhere)" in " ".join(text.split())
    assert "admin-secret-in-env" not in text and "pg-secret" not in text


_DOC_ROW = re.compile(r"^\| `--([a-z-]+)`(?: / `STILLHERE_[A-Z_]+`)? \| `([^`]+)` \|", re.MULTILINE)


def test_other_pages_quoting_a_default_quote_the_parser_s() -> None:
    """A page that shows one option's default in a table of its own (protocol.md's settings
    that clients notice, context.md's) shows the one the parser has."""
    options = {option.name: option for group in GROUPS for option in group.options}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    quoted = [
        (page.name, options[name], text)
        for page in pages
        if page != PAGE
        for name, text in _DOC_ROW.findall(page.read_text(encoding="utf-8"))
        if name in options
    ]
    assert len(quoted) > 5
    for page, option, text in quoted:
        assert option.kind(text) == default_of(option), f"{page}: --{option.name} {text}"
