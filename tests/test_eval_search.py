"""`stillhere eval search` on a small slice of the labelled corpus: the report's shape,
and what must never happen, never happening (the figures themselves are in docs/memories.md,
measured on the whole corpus)."""

from __future__ import annotations

import orjson
import pytest

from cli.main import _parser
from evals.search_corpus import ANCHORS, HELD_OUT, KINDS, QUERIES, filler


async def test_the_eval_reports_recall_and_mrr_by_kind(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["eval", "search", "--db", dsn, "--size", "120", "--persons", "2", "--slice", "2"]
    args = _parser().parse_args([*argv, "--json"])
    assert await args.run(args) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert list(report["kinds"]) == list(KINDS)
    for figures in [report, *report["kinds"].values()]:
        assert 0.0 <= figures["recall_at_5"] <= 1.0 and 0.0 <= figures["mrr"] <= 1.0
        assert (figures["muted_shown"], figures["erroneous_alone"]) == (0, 0)
        assert figures["other_person"] == 0
    assert all(k["queries"] == 4 for k in report["kinds"].values())  # 2 each, 2 people
    assert report["queries"] == len(report["details"]) == 20
    assert (report["size"], report["persons"]) == (120, 2)


def test_the_corpus_is_labelled_and_the_same_every_run() -> None:
    keys = {a.key for a in ANCHORS}
    assert len(QUERIES) >= 100 and {q.kind for q in QUERIES} == set(KINDS)
    assert all(q.answers and q.answers <= keys for q in [*QUERIES, *HELD_OUT])
    assert not {q.text for q in QUERIES} & {q.text for q in HELD_OUT}
    assert filler(2000, seed=1) == filler(2000, seed=1) != filler(2000, seed=2)
    named = {n for a in ANCHORS for n in (*a.draft.people, *a.draft.themes)}
    assert not any((set(d.people) | set(d.themes)) & named for d in filler(10_000, seed=0))
