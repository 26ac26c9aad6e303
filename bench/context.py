"""Context assembly benchmark: how long a turn waits for its context (docs/context.md).

Target: p99 under 50 ms for a person with 10,000 memories and 500 past conversations, and
how it grows from 1,000 to 100,000 memories. Run:

    .venv/bin/python -m bench.context --json bench/out/context.json
    .venv/bin/python -m bench.context --sizes 1000,10000 --rounds 200   # quick check

What it does, in one process, against one embedded PostgreSQL in a tmp folder (removed at
the end, whatever happens):

1. Bulk-inserts (COPY) one person's 500 archived conversations of 10 turns each, with
   summaries, 5 rules, and a neighbour with as many conversations and 10,000 memories (so
   every query has someone else's rows to skip).
2. For each size of `--sizes`, ascending, tops the person's memories up to that size with
   one COPY: texts of varied length, last mentions spread over a year (so about 1% are
   "recent"), mention counts 1 to 20, 5% muted; then `ANALYZE`.
3. Times, `--rounds` times after `--warmup` rounds, in an order that rotates each round so
   all subjects share the machine's conditions:
   - `assemble`: `actors.context.assemble`, as a turn calls it. Nothing changes between
     rounds and the clock stands still, so after the first call it finds every source's
     answer kept (actors/context_cache.py): it times a turn whose person's context
     generation has not moved (one read of the generation, the turn's own memories, the
     budget);
   - `rules`: the baseline, the `rules` source alone (one indexed query of a few rows);
   - each other source alone (`conversations`, `recent`, `sample`): the reads a turn makes
     once the generation has moved, to see which one sets the pace.
4. Prints a table of p50 / p99 / max in ms, with `--json PATH` writes the report.

Exit code 0 when `assemble` p99 at 10,000 memories is under 50 ms (or 10,000 is not among
the sizes), 1 when it is not, 2 when the run could not finish.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from actors import context
from actors.clock import ManualClock
from actors.handles import TurnHandles
from actors.messages import TurnRequest
from actors.runtime import ContextSettings, ConversationSettings, Runtime
from bench import results
from providers.rehearsal import RehearsalModel
from storage.embedded import EmbeddedPostgres
from storage.records import Card
from storage.store import Store

NOW = datetime(2026, 5, 19, 9, 0, tzinfo=UTC)
TARGET_MS = 50.0
TARGET_SIZE = 10_000
WORDS = [
    "gate",
    "code",
    "Paul",
    "birthday",
    "June",
    "Claire",
    "tent",
    "Sicily",
    "weekend",
    "passport",
    "dentist",
    "Owen",
]
MEMORY_COLUMNS = [
    "id",
    "person",
    "kind",
    "text",
    "created_at",
    "first_mentioned",
    "last_mentioned",
    "mention_count",
    "status",
]


def _text(rng: random.Random, serial: int) -> str:
    """A memory-like sentence of 5 to 30 words; the serial keeps texts distinct."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))) + f" #{serial}"


async def add_conversations(conn: asyncpg.Connection, person: str, count: int) -> None:
    """`count` archived conversations of 10 turns each, one a day back from NOW."""
    rng = random.Random(person)
    conversations, turns = [], []
    for i in range(count):
        ended = NOW - timedelta(hours=1 + 24 * i)
        cid = uuid.uuid4()
        conversations.append(
            (cid, person, "archived", ended - timedelta(minutes=10), ended, ended, "leave")
        )
        conversations[-1] += (f"Conversation {i}: {_text(rng, i)}",)
        for t in range(10):
            role = "user" if t % 2 == 0 else "assistant"
            turns.append((cid, person, role, _text(rng, t), ended - timedelta(minutes=10 - t)))
    await conn.copy_records_to_table(
        "conversations",
        records=conversations,
        columns=[
            "id",
            "person",
            "status",
            "started_at",
            "last_activity",
            "archived_at",
            "archive_reason",
            "summary",
        ],
    )
    await conn.copy_records_to_table(
        "turns", records=turns, columns=["conversation", "person", "role", "text", "at"]
    )


async def top_up(conn: asyncpg.Connection, person: str, have: int, want: int) -> None:
    """Add memories `have`..`want` for `person` in one COPY."""
    rng = random.Random(f"{person}:{have}")
    records = []
    for serial in range(have, want):
        mentioned = NOW - timedelta(seconds=rng.uniform(0, 365 * 86400))
        status = "muted" if rng.random() < 0.05 else "active"
        records.append(
            (
                uuid.uuid4(),
                person,
                "fact",
                _text(rng, serial),
                mentioned,
                mentioned,
                mentioned,
                rng.randint(1, 20),
                status,
            )
        )
    await conn.copy_records_to_table("cards", records=records, columns=MEMORY_COLUMNS)
    await conn.execute("ANALYZE cards; ANALYZE conversations; ANALYZE turns; ANALYZE rules")


class _Nowhere:
    """The turn's device handles: assembly never uses them."""

    def show_card(self, card: Any) -> None: ...

    def show_page(self, page: Any) -> None: ...

    def schedule(self, reminder: Any) -> None: ...


def request(person: str) -> TurnRequest:
    """A turn's request with five cards made in this conversation."""
    cards = [Card(uuid.uuid4(), "fact", f"Working memory {i}", NOW) for i in range(5)]
    return TurnRequest(
        conversation=uuid.uuid4(),
        person=person,
        history=[],
        new=[],
        speaker=None,
        cards=cards,
        during_reply=False,
        after_interrupt=False,
        handles=TurnHandles(_Nowhere(), _Nowhere()),  # type: ignore[arg-type]
    )


Subject = Callable[[], Awaitable[Any]]


def subjects(rt: Runtime, req: TurnRequest) -> dict[str, Subject]:
    now = rt.clock.now()

    def alone(name: str) -> Subject:
        return lambda: context.SOURCES[name](rt, req, now)

    return {
        "assemble": lambda: context.assemble(rt, req),
        "rules": alone("rules"),
        "conversations": alone("conversations"),
        "recent": alone("recent"),
        "sample": alone("sample"),
    }


async def time_subjects(
    named: dict[str, Subject], rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Milliseconds per call of each subject, in an order rotating every round."""
    names = list(named)
    timings: dict[str, list[float]] = {n: [] for n in names}
    for i in range(warmup + rounds):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            await named[name]()
            if i >= warmup:
                timings[name].append((time.perf_counter() - start) * 1000)
    return timings


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"p50": cuts[49], "p99": cuts[98], "max": ordered[-1], "n": len(ordered)}


async def measure(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    store = await Store.open(dsn, max_size=10)
    conn = await asyncpg.connect(dsn)
    person, neighbour = "bench-person", "bench-neighbour"
    try:
        await add_conversations(conn, person, args.conversations)
        await add_conversations(conn, neighbour, args.conversations)
        await top_up(conn, neighbour, 0, 10_000)
        for i in range(5):
            await store.rules.add(person, f"Rule number {i}: answer briefly.", NOW, limit=50)
        clock = ManualClock(NOW)
        settings = ConversationSettings(context=ContextSettings(source_timeout_s=10.0))
        rt = Runtime(asyncio.get_running_loop(), store, RehearsalModel(), clock, settings)
        req = request(person)
        rows, have = [], 0
        for size in args.sizes:
            await top_up(conn, person, have, size)
            have = size
            built = await context.assemble(rt, req)
            timings = await time_subjects(subjects(rt, req), args.rounds, args.warmup)
            row = {
                "memories": size,
                "past_conversations": args.conversations,  # beside the `conversations` source
                "context_chars": len(built.text),
                "handed": str(built),
                **{name: percentiles(values) for name, values in timings.items()},
            }
            rows.append(row)
            print(_line(row), flush=True)
        return {"rows": rows, "target": _target(rows), "args": vars(args)}
    finally:
        await conn.close()
        await store.close()


def _line(row: dict[str, Any]) -> str:
    cells = [f"{row['memories']:>7} memories"]
    for name in ("assemble", "rules", "conversations", "recent", "sample"):
        p = row[name]
        cells.append(f"{name} p50 {p['p50']:.2f} p99 {p['p99']:.2f}")
    return " | ".join(cells) + f" | {row['context_chars']} chars"


def _target(rows: list[dict[str, Any]]) -> dict[str, Any]:
    at = next((r for r in rows if r["memories"] == TARGET_SIZE), None)
    if at is None:
        return {"measured": False}
    p99 = at["assemble"]["p99"]
    return {"measured": True, "p99_ms": p99, "target_ms": TARGET_MS, "met": p99 < TARGET_MS}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=lambda s: sorted(int(x) for x in s.split(",")),
        default=[1_000, 10_000, 100_000],
    )
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    results.add_option(parser, "context")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    folder = Path(tempfile.mkdtemp(prefix="bench-context-"))
    pg: EmbeddedPostgres | None = None
    try:
        pg = EmbeddedPostgres(folder / "pg")
        report = asyncio.run(measure(pg.dsn, args))
    except Exception as error:
        print(f"the run could not finish: {error!r}", file=sys.stderr)
        return 2
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(folder, ignore_errors=True)
    results.save(args, report)
    target = report["target"]
    if target["measured"]:
        verdict = "met" if target["met"] else "NOT met"
        print(f"assemble p99 at {TARGET_SIZE} memories: {target['p99_ms']:.2f} ms ({verdict})")
    return 0 if not target["measured"] or target["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
