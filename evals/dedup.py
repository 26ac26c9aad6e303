"""`stillhere eval dedup`: how well memory recognises what it already knows, measured.

Each labelled pair runs through the real path, in a person of its own: the existing memory
is remembered, then the new one is, with the configured embedder and thresholds, against a
real PostgreSQL (each memory waits for its fingerprint, as long as `--embed-timeout`; with
`--name`, the person first says their name). The new memory is "merged" when remembering
it reinforced the existing one instead of creating a card. Against the labels this gives
precision (merges that were right), recall (restatements that were caught), false merges
and missed restatements, overall and per kind of pair.

The thresholds are only bets until measured, so the command also reports what every
(high, low) pair would have given on the same fingerprints (the rule is a pure function
of the cosine, the types, the shared people and themes, and the guard), and the best pair:
the highest recall with precision at least `--target-precision`. With the local pair of
models, each pair of memories is judged by one model's cosine (MiniLM's between two English
memories, USE's otherwise), so the search is made for each model in turn, the other keeping
its thresholds; `--thresholds` sets every model's.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import numpy as np

from actors.memory.guards import guard
from actors.memory.keeper import MemoryKeeper, Remembered
from actors.memory.language import english
from actors.memory.owner import own_names
from actors.memory.recognition import (
    Thresholds,
    Wording,
    reach,
    same_text,
    shares_subject,
    wording,
)
from actors.memory.same_memory import SameMemoryJudge
from actors.memory.setup import add_embed_options, keeper_on
from evals.command import (
    add_analysis_options,
    add_command,
    analysis_model,
    figure,
    groups_table,
    json_lines,
    json_report,
)
from providers.embedding import EmbeddingError
from storage.embedded import migrated_database
from storage.records import MemoryDraft
from transport.config import add_db_options


class PairsError(ValueError):
    """The pairs file is not what `--pairs` expects (the message names the line)."""


@dataclass(frozen=True, slots=True)
class Pair:
    existing: MemoryDraft
    new: MemoryDraft
    same: bool
    kind: str
    language: str = "en"  # en, fr (neither memory English) or cross (one of each)


def language_of(a: str, b: str) -> str:
    """The pair's language, told as recognition tells it (`actors.memory.language`)."""
    ours, theirs = english(a), english(b)
    return "en" if ours and theirs else "fr" if not (ours or theirs) else "cross"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One pair, run: what happened, and what the rule saw (to replay other thresholds)."""

    kind: str
    same: bool
    merged: bool
    tier: str | None
    cosine: float  # the one that decided: the judging model's
    model: str  # whose cosine it is
    same_type: bool
    shared: bool
    verbatim: bool
    conflict: str | None  # the guard that keeps the pair apart, and why
    existing: str
    new: str
    share: float = 0.0  # of the shorter memory's fact-bearing words, how many the other has
    slot: bool = False  # two appointments on the same day at the same time
    unsaid: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # words one has, the other not
    vouched: bool = False  # the second model finds the pair close
    language: str = "en"
    path: str = "none"  # what decided: tier, guard, judge, or none (nothing came near, or
    # the judge gave no answer)
    note: str = ""  # the new memory's recognition: the guard, or the judge's verdict and chance


def _draft(value: Any, where: str) -> MemoryDraft:
    if not isinstance(value, dict) or not isinstance(value.get("text"), str):
        raise PairsError(f"{where}: needs an object with a text")
    for field in ("people", "themes"):
        items = value.get(field, [])
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise PairsError(f"{where}.{field}: needs a list of strings")
    return MemoryDraft(
        value["text"],
        str(value.get("type") or "fact"),
        tuple(value.get("people", [])),
        tuple(value.get("themes", [])),
    )


def read_pairs(path: Path) -> list[Pair]:
    """The labelled pairs, one JSON object a line; a bad line is an error naming it."""
    pairs = []
    for where, row in json_lines(path, PairsError):
        if not isinstance(row, dict) or not isinstance(row.get("same"), bool):
            raise PairsError(f"{where}: needs existing, new, same (true or false) and kind")
        existing = _draft(row.get("existing"), f"{where} existing")
        new = _draft(row.get("new"), f"{where} new")
        language = str(row.get("language") or language_of(existing.text, new.text))
        kind = str(row.get("kind") or "unlabelled")
        pairs.append(Pair(existing, new, row["same"], kind, language))
    if not pairs:
        raise PairsError(f"{path}: no pairs")
    return pairs


def decide(o: Outcome, t: Thresholds) -> bool:
    """Would the rule merge this pair under thresholds `t`? (What `recognise` does with one
    candidate, replayed on the recorded facts: a verbatim copy is taken before any guard.)"""
    if o.verbatim:
        return True
    if o.conflict is not None:
        return False
    words = Wording(o.share, o.slot, o.unsaid)
    return reach(o.cosine, o.same_type, o.shared, words, t, o.vouched) is not None


def score(merged: list[bool], same: list[bool]) -> dict[str, Any]:
    tp = sum(m and s for m, s in zip(merged, same, strict=True))
    fp = sum(m and not s for m, s in zip(merged, same, strict=True))
    fn = sum(s and not m for m, s in zip(merged, same, strict=True))
    return {
        "pairs": len(same),
        "same": sum(same),
        "merged": tp + fp,
        "precision": round(tp / (tp + fp), 4) if tp + fp else None,
        "recall": round(tp / (tp + fn), 4) if tp + fn else None,
        "false_merges": fp,
        "missed": fn,
    }


def report(outcomes: list[Outcome], merged: list[bool]) -> dict[str, Any]:
    """Overall figures, and the same per kind and per language."""
    same = [o.same for o in outcomes]
    result = score(merged, same)
    for field, key in (("kinds", "kind"), ("languages", "language")):
        groups: dict[str, list[int]] = defaultdict(list)
        for i, o in enumerate(outcomes):
            groups[getattr(o, key)].append(i)
        result[field] = {
            name: score([merged[i] for i in rows], [same[i] for i in rows])
            for name, rows in groups.items()
        }
    return result


def search_thresholds(
    outcomes: list[Outcome], target: float, model: str, fixed: dict[str, Thresholds]
) -> list[dict[str, Any]]:
    """Every (high, low) pair on a 0.01 grid for the pairs `model` judges (with its `worded`
    floor where it is below `low`; any other model's pairs keep their `fixed` thresholds),
    best first: precision >= target, then the highest recall, then the highest precision,
    then the highest thresholds (safest). Precision and recall are over all the pairs."""
    same = [o.same for o in outcomes]
    worded = fixed[model].worded
    grid = []
    for high in np.arange(0.50, 1.0001, 0.01):
        for low in np.arange(0.40, high + 0.0001, 0.01):
            high_, low_ = round(float(high), 2), round(float(low), 2)
            t = Thresholds(high_, low_, worded if worded is not None and worded <= low_ else None)
            merged = [decide(o, t if o.model == model else fixed[o.model]) for o in outcomes]
            figures = score(merged, same)
            grid.append({"high": t.high, "low": t.low, **figures})

    def rank(row: dict[str, Any]) -> tuple[Any, ...]:
        precision = row["precision"] if row["precision"] is not None else 0.0
        return (precision >= target, row["recall"] or 0.0, precision, row["high"], row["low"])

    return sorted(grid, key=rank, reverse=True)


def best_pair(grid: list[dict[str, Any]], target: float) -> tuple[dict[str, Any], bool]:
    """The first of `search_thresholds`' grid, and whether its precision reaches `target`;
    if no pair reaches it, the most precise pair instead (the highest recall would then be
    a pair that merges nearly everything)."""
    first = grid[0]
    if (first["precision"] or 0.0) >= target:
        return first, True
    return max(grid, key=lambda row: (row["precision"] or 0.0, row["recall"] or 0.0)), False


def naming(name: str | None) -> MemoryDraft | None:
    """The memory in which a person told their name, for `--name`."""
    return MemoryDraft(f"My name is {name}.", "fact", (), ("name",)) if name else None


async def run_pairs(
    keeper: MemoryKeeper, pairs: list[Pair], named: MemoryDraft | None = None
) -> list[Outcome]:
    """Each pair through the real path, in a fresh person (who first said `named`)."""
    run = uuid.uuid4().hex[:8]
    me = own_names([named.text]) if named else frozenset()
    outcomes = []
    for number, pair in enumerate(pairs):
        person = f"eval-{run}-{number}"
        if named is not None:
            await keeper.remember(person, named)
        first = await keeper.remember(person, pair.existing)
        second = await keeper.remember(person, pair.new)
        if not (first.fingerprinted and second.fingerprinted):
            raise EmbeddingError("failed", f"pair {number + 1}: a fingerprint failed (see log)")
        merged, path, note = await _settled(keeper, person, first.memory.id, second)
        vectors = await keeper.fingerprint([pair.existing.text, pair.new.text])
        judged = keeper.judge.judge(pair.existing.text, vectors[0], pair.new.text, vectors[1])
        disagreement = guard(pair.existing, pair.new, me)
        words = wording(pair.new, pair.existing, me)
        outcomes.append(
            Outcome(
                kind=pair.kind,
                same=pair.same,
                merged=merged,
                tier=second.tier,
                cosine=round(judged.score, 4),
                model=judged.model,
                same_type=pair.existing.type == pair.new.type,
                shared=shares_subject(pair.existing, pair.new),
                verbatim=same_text(pair.existing.text, pair.new.text),
                conflict=str(disagreement) if disagreement else None,
                existing=pair.existing.text,
                new=pair.new.text,
                share=words.share,
                slot=words.same_slot,
                unsaid=words.unsaid,
                vouched=judged.vouched,
                language=pair.language,
                path=path,
                note=note,
            )
        )
        keeper.drop(person)
    await keeper.store.forget_persons(f"eval-{run}-%")
    return outcomes


async def _settled(
    keeper: MemoryKeeper, person: str, existing: UUID, second: Remembered
) -> tuple[bool, str, str]:
    """Whether the new memory ended up as the existing one, once any judge has answered,
    which path decided, and the new memory's recognition note."""
    if not second.created:
        return second.memory.id == existing, "tier", ""
    if keeper.same_memory is not None:
        await keeper.same_memory.drain()
    now = (await keeper.store.get(person, [second.memory.id]))[second.memory.id]
    said = now.recognition or ""
    # A verdict's note starts "judge:"; "no judge answered" is no decision by the judge.
    path = "judge" if "judge:" in said else "guard" if said.startswith("guard") else "none"
    return now.status == "muted", path, said


def _f1(row: dict[str, Any]) -> float:
    p, r = row["precision"] or 0.0, row["recall"] or 0.0
    return 2 * p * r / (p + r) if p + r else 0.0


def table(result: dict[str, Any], by: str = "kinds") -> str:
    columns = [("pairs", "pairs", 6), ("same", "same", 6), ("merged", "merged", 8)]
    columns += [("precision", "precision", 11), ("recall", "recall", 8)]
    columns += [("false merges", "false_merges", 14), ("missed", "missed", 8)]
    return "\n".join(groups_table((by.removesuffix("s"), 16), columns, result[by], result))


def add_parser(commands: Any) -> None:
    """Add `dedup` to the `stillhere eval` commands."""
    dedup = add_command(
        commands, "dedup", "precision and recall of memory recognition on labelled pairs", __doc__
    )
    dedup.add_argument("--pairs", type=Path, required=True, help="JSON lines of labelled pairs")
    dedup.add_argument(
        "--target-precision",
        type=float,
        default=0.95,
        help="the precision the best threshold pair must reach (default 0.95)",
    )
    dedup.add_argument(
        "--name",
        help="the name of the person the pairs are about: each pair's person first says "
        "it ('My name is NAME.'), so recognition knows it as theirs (actors.memory.owner)",
    )
    add_analysis_options(
        dedup,
        "an OpenAI-compatible analysis model to judge the uncertain band (the same-memory "
        "task); without it, none judges: the figures of a server without one",
    )
    add_db_options(dedup, scratch=True)
    add_embed_options(dedup)
    dedup.set_defaults(run=run)


async def run(args: argparse.Namespace) -> int:
    try:
        pairs = read_pairs(args.pairs)
    except (OSError, PairsError) as wrong:
        print(f"cannot read the pairs: {wrong}")
        return 2
    started = time.perf_counter()
    async with (
        migrated_database(args.db, None) as dsn,
        keeper_on(dsn, args) as keeper,
        analysis_model(args) as analysis,
    ):
        # The figures are of recognition, not of a busy machine: each memory waits for its
        # fingerprint (a server stores it without one past `--fingerprint-wait`, and the
        # model's first load can take longer than that).
        keeper.fingerprint_wait = args.embed_timeout
        if analysis is not None:
            keeper.same_memory = SameMemoryJudge(analysis, keeper)
        try:
            outcomes = await run_pairs(keeper, pairs, naming(args.name))
        except EmbeddingError as failure:
            print(f"the embedder failed, no figures: {failure}")
            return 1
        fixed, model, judging = keeper.judge.thresholds, keeper.model, keeper.judge.describe()
        if analysis is not None:
            judging += f"; the uncertain band judged by {analysis.label}"
    result = report(outcomes, [o.merged for o in outcomes])
    result["paths"] = dict(Counter(o.path for o in outcomes))
    searched = {m: search_thresholds(outcomes, args.target_precision, m, fixed) for m in fixed}
    found = {m: best_pair(grid, args.target_precision) for m, grid in searched.items()}
    document = {
        "embedder": model,
        "thresholds": {m: asdict(t) for m, t in fixed.items()},
        **result,
        "seconds": round(time.perf_counter() - started, 2),
        "best": {m: best for m, (best, _) in found.items()},
        "target_reached": {m: reached for m, (_, reached) in found.items()},
        "best_f1": {m: max(grid, key=_f1) for m, grid in searched.items()},
        "grid_top": {m: grid[:10] for m, grid in searched.items()},
        "details": [asdict(o) for o in outcomes],
    }
    if json_report(document, args.json_out):
        return 0
    print(f"{len(pairs)} pairs, embedder {model}, judged by {judging}")
    print(table(result))
    print(table(result, "languages"))
    print("decided by: " + ", ".join(f"{k} {v}" for k, v in sorted(result["paths"].items())))
    for judge_model, grid in searched.items():
        _print_best(judge_model, grid, *found[judge_model], args.target_precision)
    return 0


def _print_best(
    model: str, grid: list[dict[str, Any]], best: dict[str, Any], reached: bool, target: float
) -> None:
    """What other thresholds for `model`'s pairs would have given."""
    balanced = max(grid, key=_f1)
    print(
        f"{model}: best balanced pair {balanced['high']}/{balanced['low']} gives precision "
        f"{figure(balanced['precision'])}, recall {figure(balanced['recall'])}"
    )
    lead = (
        f"best pair for precision >= {target}:"
        if reached
        else f"no pair reaches precision {target}; the most precise:"
    )
    print(
        f"{model}: {lead} {best['high']}/{best['low']} gives precision "
        f"{figure(best['precision'])}, recall {figure(best['recall'])}"
    )
