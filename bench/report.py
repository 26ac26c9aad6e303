"""`stillhere-bench report`: bench/README.md's table of current figures, from bench/results.

A row per figure: its value (a number, a median with the runs' range, or each run's), the
target and whether it is met, the results file it comes from. Under the table, each file's
command, runs and machine. The table lives between two marker comments of the README:
`--write` rewrites it there, `--check` exits 1 when the README's differs from the files'.
`--combine RUN... --into FILE` makes one results file of several runs' (each written by a
bench's `--results PATH`): the median and range of each figure, as targets are judged."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench.results import RESULTS, Value, combined, load, load_all, meets, write_json

README = Path(__file__).resolve().parent / "README.md"
BEGIN = "<!-- figures: made by `stillhere-bench report --write` from bench/results/ -->"
END = "<!-- figures: end -->"
HEADER = "| figure | value | target | met | results | note |\n|---|---|---|---|---|---|"


def add_parser(subparsers: Any) -> None:
    """`stillhere-bench report`."""
    parser = subparsers.add_parser(
        "report", help="bench/README.md's table of figures, from bench/results", description=__doc__
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="rewrite the README's table")
    what.add_argument("--check", action="store_true", help="exit 1 if the README's differs")
    what.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="RUN",
        help="results files of single runs of one command, to combine into --into",
    )
    parser.add_argument("--into", type=Path, help="with --combine: the results file to write")
    parser.add_argument("--note", help="with --combine: the combined file's note")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder")
    parser.add_argument("--readme", type=Path, default=README, help="the README holding it")
    parser.set_defaults(run=run)


async def run(args: argparse.Namespace) -> int:
    """Print, write or check the table, or combine runs; 2 when a file cannot be read."""
    if args.combine:
        return _combine(args)
    try:
        table = render(load_all(args.results))
        if not (args.write or args.check):
            print(table)
            return 0
        readme = args.readme.read_text()
        updated = replaced(readme, table)
    except (OSError, ValueError, KeyError, TypeError) as bad:
        print(f"bench report: {bad}", file=sys.stderr)
        return 2
    if updated == readme:
        return 0
    if args.check:
        print(f"{args.readme}: its table differs from {args.results}; run with --write")
        return 1
    args.readme.write_text(updated)
    return 0


def _combine(args: argparse.Namespace) -> int:
    """`--combine RUN... --into FILE`; 2, writing nothing, when a run cannot be read or the
    runs are not of one command."""
    if args.into is None:
        print("bench report: --combine needs --into FILE", file=sys.stderr)
        return 2
    try:
        runs = [load(path) for path in args.combine]
        together = combined(runs, args.into, args.note)
    except (OSError, ValueError, KeyError, TypeError) as bad:
        print(f"bench report: {bad}", file=sys.stderr)
        return 2
    write_json(together, args.into)
    print(f"{len(runs)} runs combined into {args.into}")
    return 0


def replaced(readme: str, table: str) -> str:
    """`readme` with what lies between its markers replaced by `table`."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no {BEGIN!r} ... {END!r}")
    return readme[: start + len(BEGIN)] + "\n" + table + "\n" + readme[end:]


def render(results: dict[str, dict[str, Any]]) -> str:
    """The table of every figure, then each file's command, runs and machine."""
    rows = [
        row(figure, name, found["runs"])
        for name, found in results.items()
        for figure in found["figures"]
    ]
    commands = [command_line(name, found) for name, found in results.items()]
    return "\n".join([HEADER, *rows, "", *commands])


def row(figure: dict[str, Any], name: str, runs: int) -> str:
    """One figure's line of the table."""
    label = figure["figure"] + (f", {figure['unit']}" if figure.get("unit") else "")
    digits = figure.get("digits")
    target = figure.get("target")
    cells = [
        label,
        cell(figure["value"], digits),
        target_cell(target) if target else "",
        verdict(figure["value"], target, runs) if target else "",
        f"`{name}`",
        figure.get("note", ""),
    ]
    return "| " + " | ".join(cells) + " |"


def number(value: float, digits: int | None) -> str:
    """`value` with thousands separated, to `digits` decimals when given."""
    return f"{value:,}" if digits is None else f"{value:,.{digits}f}"


def cell(value: Value, digits: int | None = None) -> str:
    """A number, each run's, `median [min to max]` or `min to max`."""
    if not isinstance(value, dict):
        return number(value, digits)
    if "runs" in value:
        return ", ".join(number(each, digits) for each in value["runs"])
    span = f"{number(value['min'], digits)} to {number(value['max'], digits)}"
    return f"{number(value['median'], digits)} [{span}]" if "median" in value else span


def target_cell(target: dict[str, Any]) -> str:
    """`< 50`, and `(reported)` when the target is not held to."""
    text = f"{target['op']} {number(target['value'], None)}"
    return text if target.get("required", True) else f"{text} (reported)"


def verdict(value: Value, target: dict[str, Any], runs: int) -> str:
    """met, missed, `met in k of n` runs, or for a range that crosses the target, how its
    median stands."""
    if not isinstance(value, dict):
        return "met" if meets(value, target) else "missed"
    if "runs" in value:
        return counted(sum(meets(each, target) for each in value["runs"]), len(value["runs"]))
    if "met_runs" in value:
        return counted(value["met_runs"], runs)
    ends = [meets(value["min"], target), meets(value["max"], target)]
    if all(ends) or not any(ends):
        return "met" if all(ends) else "missed"
    if "median" not in value:
        return "met in part"
    return "median met" if meets(value["median"], target) else "median missed"


def counted(met: int, runs: int) -> str:
    """met, missed, or met in k of n."""
    if met == runs:
        return "met"
    return "missed" if met == 0 else f"met in {met} of {runs}"


def command_line(name: str, found: dict[str, Any]) -> str:
    """`name`: its command, its runs, the machine, the note."""
    runs = "one run" if found["runs"] == 1 else f"{found['runs']} runs"
    parts = [f"- `{name}`: `{found['command']}`; {runs}"]
    if found.get("machine"):
        parts.append(machine_text(found["machine"]))
    if found.get("note"):
        parts.append(found["note"])
    return "; ".join(parts) + "."


def machine_text(machine: dict[str, Any]) -> str:
    """The machine's fields in words: `2 cores, 24 GiB, Python 3.11, steal 3.8 to 77.3 s`."""
    words = {
        "cores": "{} cores",
        "cpu_model": "{}",
        "memory_gib": "{} GiB",
        "python": "Python {}",
        "steal_s": "steal {} s",
        "loop_s": "loop {} s",
        "load_average": "load average {}",
    }
    shown = []
    for field, value in machine.items():
        if value is None:
            continue
        if isinstance(value, dict):
            value = cell(value)
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        shown.append(words.get(field, field + " {}").format(value))
    return ", ".join(shown)
