"""`stillhere eval search`: how well search by meaning finds what it should, measured.

The labelled corpus of `evals/search_corpus.py` is stored for `--persons` people, each
with `--size` memories (its anchors, muted restatements, erroneous memories with their
corrections, related links, and seeded filler), fingerprinted by the configured embedder,
in a scratch or given PostgreSQL. Every labelled query then runs through the real search
(`MemoryKeeper.search`, as the tool and the API call it) for every person, and the report
gives, by kind of query (name, paraphrase, theme, question, cross-language) and overall:

- `recall_at_5`: of the memories that answer a query, the share among its first five
  results, out of at most five (a name with seven memories is answered whole by five);
- `mrr`: the mean of 1 / the rank of the first answer among the first ten (0 if none);
- what must never happen, counted: a muted memory shown, an erroneous one not brought by
  the memory that corrects it, another person's memory.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from actors.memory.keeper import MemoryKeeper
from actors.memory.search import Found
from actors.memory.setup import add_embed_options, keeper_on
from evals.command import add_command, groups_table, json_report
from evals.search_corpus import KINDS, SMALLEST, Base, Query, queries, store_corpus
from providers.embedding import EmbeddingError
from storage.embedded import migrated_database
from transport.config import add_db_options

RECALL_AT = 5
MRR_AT = 10


@dataclass(frozen=True, slots=True)
class Scored:
    kind: str
    query: str
    recall: float
    reciprocal_rank: float
    ranks: list[int]  # 1-based ranks of the answers found among the results
    muted_shown: int
    erroneous_alone: int
    other_person: int


def score_query(query: Query, base: Base, found: list[Found]) -> Scored:
    answers = {base.anchors[k] for k in query.answers}
    ids = [f.memory.id for f in found]
    ranks = [i + 1 for i, memory in enumerate(ids) if memory in answers]
    in_top = len(answers & set(ids[:RECALL_AT]))
    first = next((r for r in ranks if r <= MRR_AT), None)
    alone = sum(
        f.memory.status == "erroneous" and (f.via is None or f.via.through != f.memory.corrected_by)
        for f in found
    )
    return Scored(
        query.kind,
        query.text,
        in_top / min(len(answers), RECALL_AT),
        1 / first if first else 0.0,
        ranks,
        sum(memory in base.muted for memory in ids),
        alone,
        sum(f.memory.person != base.person for f in found),
    )


def summary(scored: list[Scored]) -> dict[str, Any]:
    n = len(scored)
    return {
        "queries": n,
        "recall_at_5": round(sum(s.recall for s in scored) / n, 4) if n else None,
        "mrr": round(sum(s.reciprocal_rank for s in scored) / n, 4) if n else None,
        "muted_shown": sum(s.muted_shown for s in scored),
        "erroneous_alone": sum(s.erroneous_alone for s in scored),
        "other_person": sum(s.other_person for s in scored),
    }


def report(scored: list[Scored]) -> dict[str, Any]:
    kinds: dict[str, list[Scored]] = defaultdict(list)
    for s in scored:
        kinds[s.kind].append(s)
    return {**summary(scored), "kinds": {k: summary(kinds[k]) for k in KINDS if k in kinds}}


def table(result: dict[str, Any]) -> str:
    columns = [("queries", "queries", 8), ("recall@5", "recall_at_5", 10), ("MRR", "mrr", 8)]
    lines = groups_table(("kind", 16), columns, result["kinds"], result)
    lines.append(
        f"never: {result['muted_shown']} muted shown, {result['erroneous_alone']} erroneous "
        f"without their correction, {result['other_person']} of another person"
    )
    return "\n".join(lines)


def add_parser(commands: Any) -> None:
    """Add `search` to the `stillhere eval` commands."""
    search = add_command(
        commands,
        "search",
        "recall@5 and MRR of search by meaning on a labelled synthetic corpus",
        __doc__,
    )
    search.add_argument("--size", type=int, default=1000, help="memories per person (1000)")
    search.add_argument("--persons", type=int, default=2, help="people, each a corpus (2)")
    search.add_argument(
        "--slice", type=int, default=None, help="only the first N queries of each kind"
    )
    search.add_argument(
        "--held-out",
        action="store_true",
        help="the 25 held-out queries, never used to choose the weights, instead",
    )
    add_db_options(search, scratch=True)
    add_embed_options(search)
    search.set_defaults(run=run)


async def run(args: argparse.Namespace) -> int:
    if args.size < SMALLEST or args.persons < 1:
        print(f"--size must be at least {SMALLEST}, --persons 1")
        return 2
    started = time.perf_counter()
    chosen = queries(slice_=args.slice, held_out=args.held_out)
    run_id = uuid.uuid4().hex[:8]
    async with migrated_database(args.db, None) as dsn, keeper_on(dsn, args) as keeper:
        try:
            scored = await _measure(keeper, run_id, args.size, args.persons, chosen)
        except EmbeddingError as failure:
            print(f"the embedder failed, no figures: {failure}")
            return 1
        finally:
            await keeper.store.forget_persons(f"eval-search-{run_id}-%")
        model = keeper.model
    result = {
        "embedder": model,
        "size": args.size,
        "persons": args.persons,
        "held_out": args.held_out,
        **report(scored),
        "seconds": round(time.perf_counter() - started, 2),
        "details": [_row(s) for s in scored],
    }
    if not json_report(result, args.json_out):
        print(f"{len(chosen)} queries x {args.persons} people of {args.size} memories, {model}")
        print(table(result))
    return 0


async def _measure(
    keeper: MemoryKeeper, run_id: str, size: int, persons: int, chosen: list[Query]
) -> list[Scored]:
    scored = []
    for n in range(persons):
        base = await store_corpus(keeper, f"eval-search-{run_id}-{n}", size, seed=n)
        for query in chosen:
            found = await keeper.search(base.person, query.text, MRR_AT)
            scored.append(score_query(query, base, found))
        keeper.drop(base.person)
    return scored


def _row(s: Scored) -> dict[str, Any]:
    return {
        "kind": s.kind,
        "query": s.query,
        "recall": round(s.recall, 4),
        "reciprocal_rank": round(s.reciprocal_rank, 4),
        "ranks": s.ranks,
    }
