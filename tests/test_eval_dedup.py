"""`stillhere eval dedup` on a small labelled file, against a real PostgreSQL and the fake
embeddings server over HTTP (scripted cosines, so every figure is known in advance)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from cli.main import _parser
from evals import dedup as eval_dedup
from tests.fakes.analysis_server import Answer, Asked, Down, FakeAnalysis
from tests.fakes.embeddings_server import FakeEmbeddings
from tests.memory_support import Script


def memory(text: str, people: list[str] = [], themes: list[str] = []) -> dict[str, Any]:  # noqa: B006
    return {"text": text, "type": "fact", "people": people, "themes": themes}


OWEN = memory("My brother Owen lives in Bristol.", ["owen"], ["family"])
PAIRS = [
    # (existing, new, same, kind, scripted cosine or None)
    (OWEN, memory("my brother Owen lives in Bristol", ["owen"]), True, "verbatim", None),
    (OWEN, memory("Owen, my brother, lives in Bristol.", ["owen"]), True, "reword", 0.9),
    (OWEN, memory("Owen is Hannah's brother.", ["owen"]), True, "reword", 0.6),
    (
        memory("The trip is to Lisbon."),
        memory("The trip is to Porto."),
        False,
        "contradiction",
        0.97,
    ),
    (
        memory("Hannah is allergic to cats.", ["hannah"], ["health"]),
        memory("Hannah is allergic to peanuts.", ["hannah"], ["health"]),
        False,
        "false_twin",
        0.9,
    ),
]


def parse(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["eval", "dedup", *argv])


async def run_eval(
    pairs: Path, out: Path, dsn: str, embeddings: FakeEmbeddings, *more: str
) -> dict[str, Any]:
    """`stillhere eval dedup` on `pairs` with the fake embeddings, its JSON report."""
    args = parse(
        "--pairs", str(pairs), "--json", str(out), "--db", dsn,
        "--embed-url", embeddings.url, "--embed-model", "fake-embed", *more,
    )  # fmt: skip
    assert await args.run(args) == 0
    return orjson.loads(out.read_bytes())


@pytest.fixture
def pairs(tmp_path: Path, script: Script) -> Path:
    path = tmp_path / "pairs.jsonl"
    lines = []
    for existing, new, same, kind, cosine in PAIRS:
        if cosine is not None:
            script.close_to(existing["text"], new["text"], cosine)
        lines.append(orjson.dumps({"existing": existing, "new": new, "same": same, "kind": kind}))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


async def test_eval_dedup_reports_precision_and_recall(
    dsn: str,
    pairs: Path,
    tmp_path: Path,
    fake_embeddings: FakeEmbeddings,
    db: asyncpg.Connection,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.json"
    report = await run_eval(pairs, out, dsn, fake_embeddings)
    assert report["embedder"] == "fake-embed"
    expected = {"high": 0.85, "low": 0.70, "worded": None, "judged": 0.55}
    assert report["thresholds"] == {"fake-embed": expected}
    assert (report["pairs"], report["same"], report["merged"]) == (5, 3, 2)
    assert (report["false_merges"], report["missed"]) == (0, 1)
    assert report["precision"] == 1.0
    assert report["recall"] == pytest.approx(2 / 3, abs=1e-4)
    assert report["kinds"]["reword"] == {
        "pairs": 2, "same": 2, "merged": 1, "precision": 1.0, "recall": 0.5,
        "false_merges": 0, "missed": 1,
    }  # fmt: skip
    assert report["kinds"]["contradiction"]["merged"] == 0
    # "allergic to cats" / "to peanuts" at 0.9: the same sentence but for one word.
    assert report["kinds"]["false_twin"]["false_merges"] == 0
    details = {d["kind"] + d["new"][:4]: d for d in report["details"]}
    assert details["verbatimmy b"]["tier"] == "exact"
    assert details["contradictionThe "]["conflict"].startswith("slot: name")
    assert details["false_twinHann"]["conflict"] == "slot: 'cats' vs 'peanuts'"
    assert next(d["conflict"] for d in report["details"] if d["kind"] == "reword") is None
    assert report["best"]["fake-embed"]["precision"] >= 0.95  # the search over thresholds ran
    assert report["target_reached"] == {"fake-embed": True}

    printed = capsys.readouterr().out
    assert "5 pairs, embedder fake-embed, judged by fake-embed (close 0.85, shared 0.70)" in printed
    assert "false_twin" in printed and "all" in printed
    # Scratch persons are gone: the eval leaves nothing in the database it was given.
    assert await db.fetchval("SELECT count(*) FROM cards") == 0
    assert await db.fetchval("SELECT count(*) FROM reinforcements") == 0


async def test_a_bad_pairs_file_is_refused_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"existing": {"text": "a"}, "new": {"text": "b"}, "same": true}\nnot json\n')
    args = parse("--pairs", str(path))
    assert await args.run(args) == 2
    assert f"{path}:2: not JSON" in capsys.readouterr().out


def outcome(cosine: float, **facts: Any) -> eval_dedup.Outcome:
    """A pair as the eval records it, judged by model `m` at `cosine`."""
    base = dict(kind="k", same=True, merged=False, tier=None, cosine=cosine, model="m",
                same_type=True, shared=True, verbatim=False, conflict=None, existing="a",
                new="b")  # fmt: skip
    return eval_dedup.Outcome(**{**base, **facts})


def test_other_thresholds_are_replayed_without_running_again() -> None:
    from actors.memory.recognition import Thresholds

    t = Thresholds(0.85, 0.70)
    assert eval_dedup.decide(outcome(0.9), t)
    assert eval_dedup.decide(outcome(0.75), t)
    assert not eval_dedup.decide(outcome(0.75, shared=False), t)
    assert not eval_dedup.decide(outcome(0.75, same_type=False), t)
    assert not eval_dedup.decide(outcome(0.99, conflict="name"), t)
    assert eval_dedup.decide(outcome(0.1, verbatim=True), t)
    assert eval_dedup.decide(outcome(0.1, verbatim=True, conflict="people"), t)  # as recognise


def test_the_replay_applies_the_wording_rules() -> None:
    from actors.memory.recognition import Thresholds

    t = Thresholds(0.87, 0.73, worded=0.55)
    assert eval_dedup.decide(outcome(0.6, share=1.0), t)  # worded alike, above the floor
    assert not eval_dedup.decide(outcome(0.6, share=0.5), t)
    assert not eval_dedup.decide(outcome(0.6, share=1.0), Thresholds(0.87, 0.73))
    assert eval_dedup.decide(outcome(0.2, slot=True), t)  # one appointment slot
    assert not eval_dedup.decide(outcome(0.2, slot=True, shared=False), t)


def test_with_no_pair_precise_enough_the_most_precise_is_named() -> None:
    grid = [  # as search_thresholds ranks them when none reaches the target: recall first
        {"high": 0.5, "low": 0.4, "precision": 0.6, "recall": 1.0},
        {"high": 0.9, "low": 0.8, "precision": 0.9, "recall": 0.5},
        {"high": 0.95, "low": 0.9, "precision": 0.9, "recall": 0.3},
    ]
    best, reached = eval_dedup.best_pair(grid, 0.95)
    assert not reached and (best["high"], best["low"]) == (0.9, 0.8)
    assert eval_dedup.best_pair(grid, 0.5) == (grid[0], True)


def test_each_judging_models_thresholds_are_searched_with_the_others_kept() -> None:
    from actors.memory.recognition import Thresholds

    fixed = {"en": Thresholds(0.85, 0.70), "xx": Thresholds(0.85, 0.70)}
    outcomes = [
        outcome(0.9, model="en"),  # merged at the fixed pair
        outcome(0.62, model="xx"),  # missed at the fixed pair: low must come down for it
        outcome(0.55, model="xx", same=False),  # ... but not so far as this one
    ]
    xx = eval_dedup.search_thresholds(outcomes, 0.95, "xx", fixed)[0]
    assert (xx["precision"], xx["recall"]) == (1.0, 1.0) and 0.55 < xx["low"] <= 0.62
    en = eval_dedup.search_thresholds(outcomes, 0.95, "en", fixed)[0]
    assert en["recall"] == pytest.approx(1 / 2)  # the xx pair keeps its fixed 0.70


async def test_with_a_judge_the_band_is_asked_and_guarded_pairs_never_are(
    dsn: str, tmp_path: Path, script: Script, fake_embeddings: FakeEmbeddings
) -> None:
    """A judge that calls every pair it is asked about the same: it catches the rewording
    below the tiers, and is never asked about a pair a guard decided."""

    def all_same(asked: Asked) -> Answer:
        count = sum(line.startswith("M") for line in asked.lines) // 2
        return Answer({"pairs": [
            {"existing": f"M{2 * i + 1}", "new": f"M{2 * i + 2}", "verdict": "same"}
            for i in range(count)
        ]})  # fmt: skip

    tom = memory("Tom doesn't drink alcohol.", ["tom"], ["drinks"])
    cats = memory("I am allergic to cats.", [], ["health"])
    judged = [
        (tom, memory("Tom is teetotal.", ["tom"], ["drinks"]), True, "paraphrase", 0.6),
        (cats, memory("I am allergic to dogs.", [], ["health"]), False, "slot_swap", 0.8),
        (cats, memory("My daughter is allergic to cats.", [], ["health"]), False, "subject", 0.6),
    ]
    path = tmp_path / "judged.jsonl"
    lines = []
    for existing, new, same, kind, cosine in judged:
        script.close_to(existing["text"], new["text"], cosine)
        lines.append(orjson.dumps({"existing": existing, "new": new, "same": same, "kind": kind}))
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out.json"
    async with FakeAnalysis(default=all_same) as judge:
        report = await run_eval(path, out, dsn, fake_embeddings, "--analysis-url", judge.url)
        asked = judge.tasks("same-memory")[0].lines  # the verdict, then two checks
    assert (report["precision"], report["recall"], report["false_merges"]) == (1.0, 1.0, 0)
    assert report["paths"] == {"judge": 1, "guard": 2}
    assert [line for line in asked if line.startswith("M")] == [
        "M1: Tom doesn't drink alcohol.",
        "M2: Tom is teetotal.",
    ]


async def test_a_judge_that_gives_no_answer_decides_nothing(
    dsn: str, tmp_path: Path, script: Script, fake_embeddings: FakeEmbeddings
) -> None:
    """The band is asked, the judge is down: the rewording stays apart, missed, and the
    path that decided is none, not the judge."""
    tom = memory("Tom doesn't drink alcohol.", ["tom"], ["drinks"])
    teetotal = memory("Tom is teetotal.", ["tom"], ["drinks"])
    script.close_to(tom["text"], teetotal["text"], 0.6)
    path = tmp_path / "down.jsonl"
    row = {"existing": tom, "new": teetotal, "same": True, "kind": "paraphrase"}
    path.write_bytes(orjson.dumps(row) + b"\n")
    out = tmp_path / "out.json"
    async with FakeAnalysis(default=lambda asked: Down(503)) as judge:
        report = await run_eval(path, out, dsn, fake_embeddings, "--analysis-url", judge.url)
        assert len(judge.tasks("same-memory")) == 1
    assert (report["missed"], report["paths"]) == (1, {"none": 1})


async def test_with_the_persons_name_their_own_fact_by_name_is_recognised(
    dsn: str,
    tmp_path: Path,
    script: Script,
    fake_embeddings: FakeEmbeddings,
    db: asyncpg.Connection,
) -> None:
    """`--name`: each pair's person first says their name, and the guards know it as "I"."""
    trip = memory("The Lisbon trip is with Maya.", ["maya"], ["travel"])
    hers = memory("Hannah is going to Lisbon with Maya.", ["maya", "hannah"], ["travel"])
    script.close_to(trip["text"], hers["text"], 0.8)
    pairs = tmp_path / "pairs.jsonl"
    row = {"existing": trip, "new": hers, "same": True, "kind": "reword"}
    pairs.write_bytes(orjson.dumps(row) + b"\n")
    unnamed = await run_eval(pairs, tmp_path / "a.json", dsn, fake_embeddings)
    assert (unnamed["merged"], unnamed["missed"]) == (0, 1)
    assert unnamed["details"][0]["conflict"].startswith("subject: people")
    named = await run_eval(pairs, tmp_path / "b.json", dsn, fake_embeddings, "--name", "Hannah")
    assert (named["merged"], named["missed"], named["recall"]) == (1, 0, 1.0)
    assert named["details"][0]["conflict"] is None and named["details"][0]["tier"] == "shared"
    assert await db.fetchval("SELECT count(*) FROM cards") == 0
