"""Benchmark figures as data: `bench/results/NAME.json`, one file per command.

A results file holds the `command` as it was run, the `machine` it ran on, how many `runs`
its figures come from (and, when a bench wrote it, their `reports`), an optional `note`, and
its `figures`. A figure is `{"figure", "unit", "value", "target", "note", "key"}`:

- `value` is a number; `{"median", "min", "max"}` (several runs: their median and range;
  `met_runs` when only that many met the target); `{"min", "max"}` (a range with no
  median); or `{"runs": [...]}` (one value per run, kept as such).
- `target` is `{"op": "<" | "<=" | ">=" | "==", "value": x}`, with `"required": false` when
  it is reported and not held to.
- `key` is where the value lies in a run's report (`resume_ms.p99`, `sizes.1.load_ms.p50`;
  `a+b` their sum):
  when a bench writes its results, each figure with a key takes its value from the new
  report, and a figure without one is left out (no run of this command measured it).

A bench writes one run's file; `stillhere-bench report --combine RUN... --into FILE` makes
one file of several runs of a command (`combined`). `bench report` renders bench/README.md's
table from these files (bench/report.py)."""

from __future__ import annotations

import argparse
import json
import operator
import os
import platform
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

RESULTS = Path(__file__).resolve().parent / "results"
OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
}

Report = dict[str, Any]
Value = float | int | dict[str, Any]


def add_option(parser: argparse.ArgumentParser, name: str) -> None:
    """`--results [PATH]`: write the figures of this run to PATH, by default the committed
    `bench/results/NAME.json` (given without a path, it replaces the current figures)."""
    parser.set_defaults(results_name=name)
    parser.add_argument(
        "--results",
        type=Path,
        nargs="?",
        const=RESULTS / f"{name}.json",
        default=None,
        help=f"write the figures here (given alone: replace bench/results/{name}.json)",
    )


def save(args: argparse.Namespace, report: Report, steal_s: float | None = None) -> None:
    """The run's report to `--json` and its figures to `--results`, each when given."""
    if getattr(args, "json", None) is not None:
        write_json(report, args.json)
        print(f"report written to {args.json}")
    if getattr(args, "results", None) is not None:
        committed = RESULTS / f"{args.results_name}.json"
        write(args.results, committed, report, command(), machine(steal_s))
        print(f"figures written to {args.results}")


def write_json(report: Report, path: Path) -> None:
    """A bench's report as JSON at `path`, its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


def write(path: Path, committed: Path, report: Report, ran: str, on: dict[str, Any]) -> None:
    """A results file at `path` for one run of `ran`: the figures of the file already
    there (or else of the `committed` one) with their values from `report`."""
    source = path if path.exists() else committed
    known = load(source)["figures"] if source.exists() else []
    found = (measured(figure, report) for figure in known if "key" in figure)
    figures = [figure for figure in found if figure is not None]
    results = {"command": ran, "machine": on, "runs": 1, "figures": figures, "reports": [report]}
    write_json(results, path)


def measured(figure: dict[str, Any], report: Report) -> dict[str, Any] | None:
    """`figure` with its value read from `report` at its key (`a.b+c.d`: their sum); None
    when the report has no number at one of them."""
    values = [_at(report, path) for path in figure["key"].split("+")]
    if any(value is None for value in values):
        return None
    return {**figure, "value": sum(values) if len(values) > 1 else values[0]}


def combined(runs: Sequence[dict[str, Any]], into: Path, note: str | None = None) -> dict[str, Any]:
    """Results files of single runs of one command as one file, to be written at `into`:
    each figure as the median and range of the runs that measured it (a number when they
    agree), with how many of them met its target; the runs' reports, and the load average
    at each run's end. Its command writes its figures to `into`."""
    commands = {_rerunnable(run["command"], into) for run in runs}
    if len(commands) != 1:
        raise ValueError(f"runs of different commands: {sorted(commands)}")
    if any(run["runs"] != 1 for run in runs):
        raise ValueError("each file combined must hold one run (a bench's --results PATH)")
    figures: dict[str, dict[str, Any]] = {}
    values: dict[str, list[float]] = {}
    for run in runs:
        for figure in run["figures"]:
            if isinstance(figure["value"], dict):
                raise ValueError(f"{figure['figure']!r}: a run's value is one number")
            figures.setdefault(figure["figure"], figure)
            values.setdefault(figure["figure"], []).append(figure["value"])
    machine = dict(runs[0].get("machine", {}))
    loads = [run.get("machine", {}).get("load_average") for run in runs]
    if all(isinstance(load, list) and load for load in loads):
        ends = ", ".join(str(load[0]) for load in loads)
        machine["load_average"] = f"{ends} at the runs' ends"
    result = {
        "command": commands.pop(),
        "machine": machine,
        "runs": len(runs),
        "figures": [
            _over_runs(figure, values[name], len(runs)) for name, figure in figures.items()
        ],
        "reports": [report for run in runs for report in run.get("reports", [])],
    }
    return result if note is None else result | {"note": note}


def _over_runs(figure: dict[str, Any], values: list[float], runs: int) -> dict[str, Any]:
    """`figure` with the `values` of several runs: their median and range, or the one value
    they all gave. How many met its target is kept only when all `runs` measured it: the
    table reads it as "met in k of `runs`"; otherwise the range's ends are judged."""
    if len(set(values)) == 1:
        return figure | {"value": values[0]}
    value: dict[str, Any] = {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }
    if "target" in figure and len(values) == runs:
        value["met_runs"] = sum(meets(each, figure["target"]) for each in values)
    return figure | {"value": value}


def meets(value: float, target: dict[str, Any]) -> bool:
    """Whether `value` meets `target` (`{"op", "value"}`)."""
    return OPS[target["op"]](value, target["value"])


def _rerunnable(command: str, into: Path) -> str:
    """`command` without where a run's output went (`--json PATH`, `--results PATH`), which
    differs from run to run and changes nothing measured, and with its figures written
    `into` the combined file (named from the project's folder when it is in it)."""
    kept: list[str] = []
    path_next = False
    for word in shlex.split(command):
        if path_next and not word.startswith("-"):
            path_next = False
            continue
        option = word.split("=", 1)[0]
        path_next = option in ("--json", "--results") and "=" not in word
        if option == "--results":
            kept += [option, _shown(into)]
        elif option != "--json":
            kept.append(word)
    return shlex.join(kept)


def _shown(path: Path) -> str:
    """`path` from the project's folder when it lies in it, else whole."""
    project, whole = RESULTS.parent.parent, path.resolve()
    return str(whole.relative_to(project)) if whole.is_relative_to(project) else str(whole)


def _at(report: Report, path: str) -> float | None:
    found: Any = report
    for part in path.split("."):
        if isinstance(found, list) and part.isdigit() and int(part) < len(found):
            found = found[int(part)]
        elif isinstance(found, dict) and part in found:
            found = found[part]
        else:
            return None
    if isinstance(found, bool) or not isinstance(found, int | float):
        return None
    return found


def load(path: Path) -> dict[str, Any]:
    """One results file, checked for the fields the table needs."""
    results = json.loads(path.read_text())
    for field in ("command", "runs", "figures"):
        if field not in results:
            raise ValueError(f"{path}: no {field!r}")
    for figure in results["figures"]:
        if "figure" not in figure or "value" not in figure:
            raise ValueError(f"{path}: a figure needs 'figure' and 'value': {figure}")
    return results


def load_all(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every results file in `folder`, by name, in name order."""
    return {path.stem: load(path) for path in sorted(folder.glob("*.json"))}


def command() -> str:
    """This process's command line as one would type it again."""
    arguments = shlex.join(sys.argv[1:])
    program = Path(sys.argv[0]).name
    if program in ("stillhere", "stillhere-bench"):
        return f"{program} {arguments}"
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    module = spec.name.removesuffix(".__main__") if spec is not None else Path(sys.argv[0]).stem
    return f"python -m {module} {arguments}".rstrip()


def machine(steal_s: float | None = None) -> dict[str, Any]:
    """The machine: cores, CPU model, memory, Python, load average, and the hypervisor's
    steal over the run when the bench measured it."""
    found = {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "load_average": [round(load, 2) for load in os.getloadavg()],
    }
    return found if steal_s is None else found | {"steal_s": round(steal_s, 1)}


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.machine()
