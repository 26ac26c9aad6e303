"""docs/configuration.md, written from `serve`'s option table (transport/config.py's `GROUPS`),
so that the page, `stillhere serve --help` and the parser never disagree:

    python -m cli.configuration > docs/configuration.md

tests/test_configuration_doc.py fails while the committed page differs from what this writes.
"""

from __future__ import annotations

import sys

from transport.config import GROUPS, Group, Option, default_of, shown_default

HEADER = """\
# Configuration

`stillhere serve`'s options, in the groups `stillhere serve --help` shows them. Each is
also an environment variable `STILLHERE_<NAME>` (`--resume-window` is
`STILLHERE_RESUME_WINDOW`); an option on the command line wins over its variable. Durations
take `250ms`, `90s`, `30m`, `2h`, `7d` or a number of seconds; sizes take `65536`, `64KiB`,
`1MiB`. Why each default is what it is: [architecture.md](architecture.md).

This page is written from the option table in `transport/config.py`; after changing an
option, run `python -m cli.configuration > docs/configuration.md` (a test fails until then).
The other commands' options: `stillhere COMMAND --help`."""


def _default(option: Option) -> str:
    """The default as code, or what no value means in words."""
    value = default_of(option)
    shown = shown_default(option, value)
    return shown if value in (None, ()) else f"`{shown}`"


def _row(option: Option) -> str:
    what = f"{option.help}. {option.more}" if option.more else option.help
    return f"| `--{option.name}` | {_default(option)} | {what} |"


def _section(group: Group) -> list[str]:
    title = group.title[0].upper() + group.title[1:]
    head = ["", f"## {title}", "", group.about, "", "| option | default | what it does |"]
    return [*head, "|---|---|---|", *(_row(option) for option in group.options)]


def markdown() -> str:
    lines = [HEADER]
    for group in GROUPS:
        lines += _section(group)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
