"""`stillhere memory consolidate`, `search` and `split`, run by hand.

`split` undoes a wrong merge: it lists how a memory was said again, and makes one of those
mentions a memory of its own, as the memories API's split does.

`search` is the search the model's `search_memories` tool and `GET /v1/memories/search`
run (`actors.memory.search`), for one person, printed one memory a line with why it came.

The server runs the same pass on the supervisor's schedule; this runs it now, on every
person whose memories changed since their last pass (or `--all`, or one `--person`), and
can undo one merge (`--unmerge ID --person P`). It talks to the database directly, so it
can run beside a server, on the embedded PostgreSQL of the server's `--data-dir` while the
server runs on it: the server's fingerprint index notices the change (the person's memory
generation moved) and rebuilds.

`--person` takes a person key as `inspect` shows it: the whole key, or a prefix only one
person's key starts with.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import orjson

from actors.memory.consolidation import consolidate, maintain, unmerge
from actors.memory.keeper import MemoryKeeper, NoSuchMention
from actors.memory.search import BadQuery, Found, query_text
from actors.memory.setup import (
    add_embed_options,
    keeper_on,
)
from providers.embedding import EmbeddingError
from storage.embedded import migrated_database
from storage.memories import UnknownMemories
from transport.config import add_db_options
from transport.memory_api import SEARCH_LIMIT, SEARCH_MAX

log = logging.getLogger("stillhere.memory")
PERSON_HELP = "the person key, or a prefix of it only one person's key starts with"


class UnknownPerson(Exception):
    """A `--person` no key is, or starts with, or that starts several."""


@contextlib.asynccontextmanager
async def opened(args: argparse.Namespace) -> AsyncIterator[MemoryKeeper]:
    """The keeper on `--db` or on the data dir's PostgreSQL (beside a server running on it),
    with `args.person` made a whole key; UnknownPerson if it names nobody or several."""
    async with (
        migrated_database(args.db, args.data_dir, beside=True) as dsn,
        keeper_on(dsn, args) as keeper,
    ):
        if args.person:
            keys = await keeper.store.persons_starting(args.person, 2)
            if not keys:
                raise UnknownPerson(f"no person's key is or starts with {args.person}")
            if len(keys) > 1:
                raise UnknownPerson(f"several people's keys start with {args.person}: give more")
            args.person = keys[0]
        yield keeper


def add_parser(subparsers: Any) -> None:
    """Add `memory consolidate` and `memory search` to the `stillhere` command."""
    memory = subparsers.add_parser("memory", help="long-term memory upkeep")
    commands = memory.add_subparsers(dest="memory_command", required=True)
    run_ = commands.add_parser(
        "consolidate",
        help="mute near-duplicate memories into one reference (reversible)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    who = run_.add_mutually_exclusive_group()
    who.add_argument("--all", action="store_true", help="every person, changed or not")
    who.add_argument("--person", help=f"only this person ({PERSON_HELP})")
    run_.add_argument(
        "--unmerge",
        type=UUID,
        metavar="MEMORY_ID",
        help="undo the merge of this muted memory (with --person)",
    )
    add_db_options(run_, scratch=False)
    add_embed_options(run_)
    run_.set_defaults(run=run)
    search = commands.add_parser(
        "search",
        help="search one person's memories by meaning, names and links",
        description="Search one person's memories as the model's search_memories tool does.",
    )
    search.add_argument("query", help="a name, a topic or a question")
    search.add_argument("--person", required=True, help=PERSON_HELP)
    search.add_argument(
        "--limit",
        type=_limit,
        default=SEARCH_LIMIT,
        help=f"1 to {SEARCH_MAX} (default {SEARCH_LIMIT})",
    )
    search.add_argument("--json", action="store_true", help="print the HTTP API's answer")
    add_db_options(search, scratch=False)
    add_embed_options(search)
    search.set_defaults(run=run_search)
    split = commands.add_parser(
        "split",
        help="list a memory's mentions, or split one back out as a memory of its own",
        description="Undo a wrong merge: without --mention, list how the memory was said "
        "again; with it, make that mention a memory of its own, as it was said.",
    )
    split.add_argument("memory", type=UUID, help="the memory's id")
    split.add_argument("--person", required=True, help=PERSON_HELP)
    split.add_argument("--mention", type=int, help="the mention to split out (see the list)")
    add_db_options(split, scratch=False)
    add_embed_options(split)
    split.set_defaults(run=run_split)


async def run_split(args: argparse.Namespace) -> int:
    async with opened(args) as keeper:
        try:
            if args.mention is None:
                for said in await keeper.mentions(args.person, args.memory):
                    done = f"  (split into {said.split_into})" if said.split_into else ""
                    print(f"{said.id:>6}  {said.at:%Y-%m-%d %H:%M}  {said.new_text}{done}")
                    print(f"        {said.decided_by or said.tier}: {said.reason or said.tier}")
                return 0
            split = await keeper.split(args.person, args.memory, args.mention)
        except UnknownMemories:
            print(f"no memory {args.memory} of that person")
            return 1
        except NoSuchMention:
            print(f"memory {args.memory} has no mention {args.mention} left to split")
            return 1
    print(f"mention {args.mention} split out as memory {split.memory.id}: {split.memory.text}")
    return 0


def _limit(text: str) -> int:
    if not text.isdecimal() or not 1 <= int(text) <= SEARCH_MAX:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {SEARCH_MAX}")
    return int(text)


async def run_search(args: argparse.Namespace) -> int:
    try:
        query = query_text(args.query)
    except BadQuery as wrong:
        print(f"stillhere memory search: {wrong}", file=sys.stderr)
        return 2
    async with opened(args) as keeper:
        try:
            found = await keeper.search(args.person, query, args.limit)
        except EmbeddingError as failure:
            print(
                f"stillhere memory search: the query could not be embedded: {failure}",
                file=sys.stderr,
            )
            return 1
    if args.json:
        print(orjson.dumps({"results": [f.wire() for f in found]}).decode())
    else:
        print("\n".join(_line(f) for f in found) or "nothing found")
    return 0


def _line(found: Found) -> str:
    """`0.712  fact       active     My brother Owen... (meaning 0.71, person owen)`; a
    memory that came along a link is indented under its hit."""
    m = found.memory
    lead = "  ^ " if found.via else f"{found.score:.3f}"
    return f"{lead:<7}{m.type:<12}{m.status:<11}{m.text}  ({found.why})"


async def run(args: argparse.Namespace) -> int:
    if args.unmerge is not None and not args.person:
        print("--unmerge needs --person: a memory is only ever changed for its own person")
        return 2
    async with opened(args) as keeper:
        if args.unmerge is not None:
            reference = await unmerge(keeper, args.person, args.unmerge)
            if reference is None:
                print(f"memory {args.unmerge} of that person was not merged into anything")
                return 1
            print(f"memory {args.unmerge} is active again (it had been merged into {reference})")
            return 0
        if args.person:
            filled = await keeper.backfill()
            merges = await consolidate(keeper, args.person)
            report = {"persons": 1, "groups": len(merges), "fingerprints_filled": filled}
            report["muted"] = sum(len(m.muted) for m in merges)
        else:
            done = await maintain(keeper, everyone=args.all)
            merges, report = done.merges, done.wire()
        for merge in merges:
            for muted in merge.muted:
                print(f"muted {muted} into {merge.reference}")
        print(orjson.dumps(report).decode())
    return 0
