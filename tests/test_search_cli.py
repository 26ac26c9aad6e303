"""`stillhere memory search`: the same search, at a terminal, on a real PostgreSQL and the
local embedding model."""

from __future__ import annotations

import orjson
import pytest

from actors.memory.keeper import MemoryKeeper
from cli.main import _parser
from cli.memory import UnknownPerson
from storage.records import MemoryDraft
from tests.fakes.embeddings_server import Fail, FakeEmbeddings
from tests.memory_support import MODEL
from tests.test_search import HANNAH, OWEN_BRISTOL, OWEN_LAB, STRANGER, TEA, remember_all


async def run(*argv: str) -> int:
    args = _parser().parse_args(["memory", "search", *argv])
    return await args.run(args)


async def test_the_cli_prints_one_persons_memories_with_why(
    local_keeper: MemoryKeeper, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await remember_all(local_keeper, HANNAH, OWEN_BRISTOL, OWEN_LAB, TEA)
    dog = MemoryDraft("Owen is my neighbour's dog.", "fact", ("owen",), ("pets",))
    await remember_all(local_keeper, STRANGER, dog)
    assert await run("Owen", "--person", HANNAH, "--db", dsn, "--limit", "3") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "neighbour's dog" not in "".join(lines)  # tea: below the floor
    assert all("person owen" in line for line in lines)
    assert {line.split("  (")[0].split("active     ")[1] for line in lines} == {
        OWEN_BRISTOL.text,
        OWEN_LAB.text,
    }

    assert await run("tea", "--person", HANNAH, "--db", dsn, "--json", "--limit", "1") == 0
    answer = orjson.loads(capsys.readouterr().out)
    assert [r["memory"]["text"] for r in answer["results"]] == [TEA.text]

    assert await run("cats", "--person", HANNAH, "--db", dsn) == 0
    assert capsys.readouterr().out == "nothing found\n"


async def test_a_person_is_named_by_a_unique_prefix_of_their_key(
    local_keeper: MemoryKeeper, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `inspect` shows keys, shortened: a prefix one key starts with names that person;
    one that names nobody, or several, is an error (it said "nothing found", as for a
    person with no memories)."""
    await remember_all(local_keeper, HANNAH, OWEN_BRISTOL, TEA)
    await remember_all(local_keeper, STRANGER, MemoryDraft("Owen is my neighbour's dog."))
    assert await run("Owen", "--person", HANNAH[:8], "--db", dsn) == 0
    assert OWEN_BRISTOL.text in capsys.readouterr().out
    for unknown, said in (("person-x", "no person's key"), ("person-", "several people's")):
        with pytest.raises(UnknownPerson, match=said):
            await run("Owen", "--person", unknown, "--db", dsn)


async def test_the_cli_refuses_an_empty_or_long_query(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await run("  ", "--person", HANNAH, "--db", dsn) == 2
    assert "query holds only whitespace" in capsys.readouterr().err
    assert await run("x" * 10_240, "--person", HANNAH, "--db", dsn) == 2
    assert "query is limited to 1000 characters" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["memory", "search", "tea", "--person", HANNAH, "--limit", "0"])


async def test_a_query_the_embedder_cannot_take_is_an_error_on_stderr(
    keeper: MemoryKeeper,
    dsn: str,
    fake_embeddings: FakeEmbeddings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await remember_all(keeper, HANNAH, TEA)
    fake_embeddings.queue(Fail(503))
    embedder = ["--embed-url", fake_embeddings.url, "--embed-model", MODEL]
    assert await run("Owen", "--person", HANNAH, "--db", dsn, "--json", *embedder) == 1
    out, err = capsys.readouterr()
    assert out == "" and "the query could not be embedded" in err
