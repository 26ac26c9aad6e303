"""bench/README.md's table of figures against bench/results, and the renderer and writer
of those files on small ones made here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bench import report, results
from bench.__main__ import main

README_AROUND = f"# Benchmarks\n\nprose\n\n{report.BEGIN}\nold table\n{report.END}\n\nafter\n"


def write_results(folder: Path, name: str, figures: list[dict[str, Any]], runs: int = 1) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    body = {"command": f"python -m bench.{name}", "machine": {"cores": 2}, "runs": runs}
    (folder / f"{name}.json").write_text(json.dumps(body | {"figures": figures}))


def table_rows(folder: Path) -> list[str]:
    return [line for line in report.render(results.load_all(folder)).splitlines() if "`" in line]


def test_the_readme_table_is_the_one_the_results_render() -> None:
    readme = report.README.read_text()
    rendered = report.render(results.load_all())
    assert report.replaced(readme, rendered) == readme, "run: stillhere-bench report --write"
    assert len(readme.splitlines()) < 500


def test_every_committed_figure_has_a_value_a_cell_and_a_known_target() -> None:
    for name, found in results.load_all().items():
        for figure in found["figures"]:
            assert report.cell(figure["value"], figure.get("digits")), (name, figure)
            if "target" in figure:
                assert figure["target"]["op"] in results.OPS, (name, figure)


def test_a_number_meets_or_misses_its_target(tmp_path: Path) -> None:
    write_results(
        tmp_path,
        "a",
        [
            {
                "figure": "resume p99",
                "unit": "ms",
                "value": 26.8,
                "target": {"op": "<", "value": 50},
            },
            {"figure": "ratio", "value": 1.25, "digits": 2, "target": {"op": ">=", "value": 1.5}},
            {"figure": "lost", "value": 0, "target": {"op": "==", "value": 0}},
            {
                "figure": "keeper p99",
                "value": 7.63,
                "target": {"op": "<", "value": 2, "required": False},
            },
            {"figure": "threads", "value": 2011, "note": "plus a few"},
        ],
    )
    assert table_rows(tmp_path) == [
        "| resume p99, ms | 26.8 | < 50 | met | `a` |  |",
        "| ratio | 1.25 | >= 1.5 | missed | `a` |  |",
        "| lost | 0 | == 0 | met | `a` |  |",
        "| keeper p99 | 7.63 | < 2 (reported) | missed | `a` |  |",
        "| threads | 2,011 |  |  | `a` | plus a few |",
        "- `a`: `python -m bench.a`; one run; 2 cores.",
    ]


def test_ranges_and_runs_keep_their_shape_and_are_judged_by_each_end(tmp_path: Path) -> None:
    under_50 = {"op": "<", "value": 50}
    write_results(
        tmp_path,
        "b",
        [
            {"figure": "all under", "value": {"median": 3, "min": 2, "max": 4}, "target": under_50},
            {
                "figure": "crossing",
                "value": {"median": 26.82, "min": 21.17, "max": 142.44},
                "digits": 2,
                "target": under_50,
            },
            {
                "figure": "counted",
                "value": {"median": 30, "min": 20, "max": 90, "met_runs": 4},
                "target": under_50,
            },
            {
                "figure": "span",
                "value": {"min": 49.9, "max": 51.0},
                "digits": 1,
                "target": {"op": "<=", "value": 64},
            },
            {"figure": "each run", "value": {"runs": [40, 60, 45]}, "target": under_50},
            {"figure": "all over", "value": {"runs": [60, 70, 80]}, "target": under_50},
        ],
        runs=6,
    )
    assert table_rows(tmp_path)[:-1] == [
        "| all under | 3 [2 to 4] | < 50 | met | `b` |  |",
        "| crossing | 26.82 [21.17 to 142.44] | < 50 | median met | `b` |  |",
        "| counted | 30 [20 to 90] | < 50 | met in 4 of 6 | `b` |  |",
        "| span | 49.9 to 51.0 | <= 64 | met | `b` |  |",
        "| each run | 40, 60, 45 | < 50 | met in 2 of 3 | `b` |  |",
        "| all over | 60, 70, 80 | < 50 | missed | `b` |  |",
    ]


def test_check_fails_on_a_stale_table_and_write_mends_it(tmp_path: Path) -> None:
    folder, readme = tmp_path / "results", tmp_path / "README.md"
    write_results(folder, "c", [{"figure": "x", "value": 1}])
    readme.write_text(README_AROUND)
    options = ["report", "--results", str(folder), "--readme", str(readme)]
    assert main([*options, "--check"]) == 1
    assert readme.read_text() == README_AROUND
    assert main([*options, "--write"]) == 0
    assert main([*options, "--check"]) == 0
    written = readme.read_text()
    assert "| x | 1 |  |  | `c` |  |" in written
    assert written.startswith("# Benchmarks\n\nprose\n") and written.endswith("\nafter\n")
    write_results(folder, "c", [{"figure": "x", "value": 2}])
    assert main([*options, "--check"]) == 1


def test_bad_input_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    folder, readme = tmp_path / "results", tmp_path / "README.md"
    write_results(folder, "d", [{"figure": "x", "value": 1}])
    options = ["report", "--results", str(folder), "--readme", str(readme)]
    for text in ("# no markers here\n", ""):
        readme.write_text(text)
        assert main([*options, "--write"]) == 2
        assert main([*options, "--check"]) == 2
        assert readme.read_text() == text
    readme.write_text(README_AROUND)
    (folder / "e.json").write_text(json.dumps({"command": "x", "runs": 1, "figures": [{}]}))
    assert main([*options, "--write"]) == 2
    assert readme.read_text() == README_AROUND


def test_a_run_writes_its_figures_from_its_report_by_key(tmp_path: Path) -> None:
    path = tmp_path / "flap.json"
    write_results(
        tmp_path,
        "flap",
        [
            {"figure": "resume p99", "value": 26.82, "key": "resume_ms.p99"},
            {"figure": "lost", "value": 0, "key": "lost_says+duplicated_says"},
            {"figure": "first page", "value": 5.8, "key": "sizes.0.load_ms.p50"},
            {"figure": "transcribed only", "value": 3},
            {"figure": "absent from the report", "value": 3, "key": "storm_s"},
        ],
        runs=6,
    )
    run_report = {
        "resume_ms": {"p99": 31.5},
        "lost_says": 1,
        "duplicated_says": 2,
        "sizes": [{"load_ms": {"p50": 7.25}}],
    }
    args = argparse.Namespace(json=tmp_path / "out" / "full.json", results=path, results_name="x")
    results.save(args, run_report, steal_s=8.47)
    written = results.load(path)
    assert [(f["figure"], f["value"]) for f in written["figures"]] == [
        ("resume p99", 31.5),
        ("lost", 3),
        ("first page", 7.25),
    ]
    assert written["runs"] == 1 and written["reports"] == [run_report]
    assert written["machine"]["steal_s"] == 8.5
    assert written["machine"]["cores"] >= 1 and written["machine"]["python"]
    assert written["command"]
    assert json.loads(args.json.read_text()) == run_report


def test_results_given_alone_names_the_committed_file() -> None:
    parser = argparse.ArgumentParser()
    results.add_option(parser, "paced")
    assert parser.parse_args(["--results"]).results == results.RESULTS / "paced.json"
    assert parser.parse_args([]).results is None
    assert parser.parse_args(["--results", "/tmp/p.json"]).results == Path("/tmp/p.json")


def test_a_run_written_elsewhere_takes_the_committed_figures_and_leaves_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    committed = tmp_path / "committed"
    monkeypatch.setattr(results, "RESULTS", committed)
    write_results(committed, "paced", [{"figure": "cpu", "value": 2.264, "key": "cpu.p50"}])
    before = (committed / "paced.json").read_text()
    args = argparse.Namespace(results=tmp_path / "mine.json", results_name="paced")
    results.save(args, {"cpu": {"p50": 2.5}})
    assert results.load(args.results)["figures"] == [
        {"figure": "cpu", "value": 2.5, "key": "cpu.p50"}
    ]
    assert (committed / "paced.json").read_text() == before


def one_run(folder: Path, name: str, command: str, values: dict[str, float], load: float) -> Path:
    """A run's results file, as a bench's `--results PATH` writes it."""
    figures = [
        {"figure": "turns/s", "value": values["turns"], "digits": 1, "key": "turns"},
        {"figure": "ratio", "value": values["ratio"], "target": {"op": ">=", "value": 0.5}},
        {"figure": "lost", "value": 0, "target": {"op": "==", "value": 0}},
    ]
    path = folder / f"{name}.json"
    machine = {"cores": 2, "load_average": [load, 1.0, 1.0]}
    body = {"command": command, "machine": machine, "runs": 1, "figures": figures}
    path.write_text(json.dumps(body | {"reports": [{"turns": values["turns"]}]}))
    return path


FLAP = "stillhere-bench flap --seed 1"


def test_runs_combine_into_medians_and_ranges_judged_run_by_run(tmp_path: Path) -> None:
    runs = [
        one_run(tmp_path, f"r{i}", f"{FLAP} --json j{i}.json --results r{i}.json", v, load)
        for i, (v, load) in enumerate(
            [({"turns": 1674.8, "ratio": 0.49}, 1.31), ({"turns": 1537.7, "ratio": 0.52}, 2.39),
             ({"turns": 1737.5, "ratio": 0.51}, 0.52)]
        )
    ]  # fmt: skip
    into = tmp_path / "results" / "flap.json"
    argv = ["report", "--combine", *map(str, runs), "--into", str(into), "--note", "a slow day"]
    assert main(argv) == 0
    together = results.load(into)
    assert together["command"] == f"{FLAP} --results {into}"
    committed = results.combined([results.load(run) for run in runs], results.RESULTS / "f.json")
    assert committed["command"] == f"{FLAP} --results bench/results/f.json"
    assert (together["runs"], together["note"]) == (3, "a slow day")
    assert together["machine"]["load_average"] == "1.31, 2.39, 0.52 at the runs' ends"
    assert together["reports"] == [{"turns": 1674.8}, {"turns": 1537.7}, {"turns": 1737.5}]
    assert [f["value"] for f in together["figures"]] == [
        {"median": 1674.8, "min": 1537.7, "max": 1737.5},
        {"median": 0.51, "min": 0.49, "max": 0.52, "met_runs": 2},
        0,
    ]
    assert table_rows(into.parent)[:3] == [
        "| turns/s | 1,674.8 [1,537.7 to 1,737.5] |  |  | `flap` |  |",
        "| ratio | 0.51 [0.49 to 0.52] | >= 0.5 | met in 2 of 3 | `flap` |  |",
        "| lost | 0 | == 0 | met | `flap` |  |",
    ]


def test_runs_that_cannot_be_combined_are_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same = {"turns": 1.0, "ratio": 1.0}
    flap = one_run(tmp_path, "a", "stillhere-bench flap --seed 1", same, 1.0)
    other = one_run(tmp_path, "b", "stillhere-bench flap --seed 2", same, 1.0)
    into = tmp_path / "into.json"

    def combine(*runs: Path, into: Path | None = into) -> int:
        return main(["report", "--combine", *map(str, runs), *(["--into", str(into)] * bool(into))])

    assert combine(flap, other) == 2  # another command
    assert combine(flap, tmp_path / "none.json") == 2
    assert combine(flap, flap, into=None) == 2
    body = json.loads(flap.read_text())
    (tmp_path / "c.json").write_text(json.dumps(body | {"runs": 3}))
    assert combine(flap, tmp_path / "c.json") == 2  # not one run's
    ranged = body | {"figures": [{"figure": "lost", "value": {"min": 0, "max": 1}}]}
    (tmp_path / "d.json").write_text(json.dumps(ranged))
    assert combine(flap, tmp_path / "d.json") == 2
    assert "'lost': a run's value is one number" in capsys.readouterr().err
    assert not into.exists()


def test_a_figure_some_runs_lack_is_judged_by_its_range_not_counted(tmp_path: Path) -> None:
    ratios = (0.49, 0.52, 0.51)
    paths = [one_run(tmp_path, f"r{i}", FLAP, {"turns": 1.0, "ratio": r}, 1.0)
             for i, r in enumerate(ratios)]  # fmt: skip
    runs = [results.load(path) for path in paths]
    runs[2]["figures"] = [f for f in runs[2]["figures"] if f["figure"] != "ratio"]
    ratio = results.combined(runs, tmp_path / "flap.json")["figures"][1]
    # Two runs measured it: "met in 1 of 3" would be wrong; its range crosses the target.
    assert ratio["value"] == {"median": 0.505, "min": 0.49, "max": 0.52}
    assert report.verdict(ratio["value"], ratio["target"], 3) == "median met"
