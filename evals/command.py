"""What the `stillhere eval` commands share: the `eval` command itself, labelled data read
as JSON lines, and the report's way out (`--json`: printed alone, or written to a file
beside the table)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from providers.analysis import DEFAULT_TIMEOUT_S as DEFAULT_ANALYSIS_TIMEOUT_S
from providers.analysis import AnalysisModel, FailureHook
from transport.config import env_value, longer_than_zero


def add_eval_command(subparsers: Any) -> Any:
    """Add `eval` to the `stillhere` command; return its commands, for each eval to join."""
    evaluate = subparsers.add_parser("eval", help="measure stillhere against labelled data")
    return evaluate.add_subparsers(dest="eval_command", required=True)


def add_command(commands: Any, name: str, help: str, doc: str | None) -> argparse.ArgumentParser:
    """One eval command, its module's `doc` as its description, with `--json`."""
    command = commands.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    command.add_argument(
        "--json",
        nargs="?",
        const="-",
        dest="json_out",
        help="print the report as JSON, or write it to the file given",
    )
    return command


def add_analysis_options(command: argparse.ArgumentParser, url_help: str) -> None:
    """The analysis model an eval asks, as `serve` takes it (`url_help`: what it is for)."""
    command.add_argument("--analysis-url", default=env_value("analysis-url"), help=url_help)
    command.add_argument(
        "--analysis-model",
        default=env_value("analysis-model") or "default",
        help="model name sent to the analysis API (env STILLHERE_ANALYSIS_MODEL)",
    )
    command.add_argument(
        "--analysis-key",
        default=env_value("analysis-key"),
        help="API key for the analysis API (env STILLHERE_ANALYSIS_KEY; never shown)",
    )
    command.add_argument(
        "--analysis-timeout",
        type=longer_than_zero,  # as `serve` reads it: "2s", "500ms" or seconds
        default=DEFAULT_ANALYSIS_TIMEOUT_S,
        help=f"seconds to wait for an answer, in all (default {DEFAULT_ANALYSIS_TIMEOUT_S:g})",
    )


@contextlib.asynccontextmanager
async def analysis_model(
    args: argparse.Namespace, on_failure: FailureHook | None = None
) -> AsyncIterator[AnalysisModel | None]:
    """The analysis model `--analysis-url` names, closed after; None without one.
    `on_failure` is told of each call that failed (task, reason)."""
    if not args.analysis_url:
        yield None
        return
    model = AnalysisModel(
        args.analysis_url,
        args.analysis_model,
        args.analysis_key,
        timeout=args.analysis_timeout,
        on_failure=on_failure,
    )
    try:
        yield model
    finally:
        await model.close()


def json_lines(path: Path, error: type[Exception]) -> Iterator[tuple[str, Any]]:
    """Each line of `path` but the blank ones, parsed, with where it stands (`path:line`,
    for the reader's own errors); a line that is not JSON raises `error`, naming it."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as wrong:
            raise error(f"{where}: not JSON ({wrong})") from None
        yield where, row


async def run_report(
    args: argparse.Namespace,
    make: Callable[[], Awaitable[dict[str, Any]]],
    errors: type[Exception],
    show: Callable[[dict[str, Any]], None],
) -> int:
    """An eval's command: its report as `--json` asks, else `show`n; 2 when the cases cannot
    be read (`errors`, or the file itself)."""
    try:
        report = await make()
    except (OSError, errors) as wrong:
        print(f"cannot read the cases: {wrong}")
        return 2
    if not json_report(report, args.json_out):
        show(report)
    return 0


def json_report(report: dict[str, Any], json_out: str | None) -> bool:
    """Send the report where `--json` says: alone, printed as JSON (True: print nothing
    else); with a file, written to it; without, nowhere."""
    document = orjson.dumps(report, option=orjson.OPT_INDENT_2)
    if json_out == "-":
        sys.stdout.write(document.decode() + "\n")
        return True
    if json_out is not None:
        Path(json_out).write_bytes(document)
    return False


def figure(value: float | None) -> str:
    """A ratio in a report's table; "-" where there was nothing to measure."""
    return "-" if value is None else f"{value:.3f}"


def groups_table(
    group: tuple[str, int],
    columns: Sequence[tuple[str, str, int]],
    groups: dict[str, dict[str, Any]],
    overall: dict[str, Any],
) -> list[str]:
    """A report's figures as table lines: a row a group (kind, language...), then `all`.
    `group` is the first column's title and width; each column a title, the key of its
    figure and a width. A count is shown as it is, a ratio as `figure` shows it."""
    title, width = group
    head = f"{title:<{width}}" + "".join(f"{t:>{w}}" for t, _, w in columns)
    rule = "-" * len(head)

    def row(name: str, figures: dict[str, Any]) -> str:
        return f"{name:<{width}}" + "".join(f"{_cell(figures[k]):>{w}}" for _, k, w in columns)

    return [head, rule, *(row(n, f) for n, f in groups.items()), rule, row("all", overall)]


def _cell(value: int | float | None) -> str:
    return str(value) if isinstance(value, int) else figure(value)
