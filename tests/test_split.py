"""Undoing a wrong merge: a mention is split back out as a memory of its own, with its own
fingerprint and the metadata it was said with, through the memories API and the CLI, and
nothing said is lost. Real PostgreSQL, the fake embeddings server over HTTP."""

from __future__ import annotations

import argparse

import asyncpg
import pytest

from cli import memory as memory_cli
from tests.conftest import Harness
from tests.fakes.embeddings_server import FakeEmbeddings
from tests.memory_support import MODEL, Script
from tests.test_memory_api import OWEN, Api, snapshot

# Said as a restatement of OWEN (scripted close), but about his work: a wrong merge.
LAB = {"text": "Owen works in a lab in Bristol.", "type": "fact", "people": ["owen"],
       "themes": ["work"]}  # fmt: skip


@pytest.fixture
async def api(harness: Harness, fake_embeddings: FakeEmbeddings) -> Api:
    await harness.start(embed_url=fake_embeddings.url, embed_model=MODEL)
    return Api(harness)


async def reinforced_wrongly(api: Api, script: Script) -> tuple[str, int]:
    """OWEN, then LAB recognised as OWEN; the memory's id and the mention's."""
    script.close_to(OWEN["text"], LAB["text"], 0.9)
    owen = (await api.create(OWEN))["memory"]["id"]
    answer = await api.create(LAB)
    assert (answer["result"], answer["reinforced"]) == ("reinforced", owen)
    status, shown = await api.call("GET", f"/v1/memories/{owen}")
    assert status == 200, shown
    (mention,) = shown["mentions"]
    assert (mention["text"], mention["decided_by"], mention["split_into"]) == (
        LAB["text"],
        "tier",
        None,
    )
    assert mention["reason"].startswith("tier close: cosine 0.900")
    return owen, mention["id"]


async def test_a_mention_is_split_back_out_with_nothing_lost(
    api: Api, script: Script, db: asyncpg.Connection
) -> None:
    owen, mention = await reinforced_wrongly(api, script)
    status, split = await api.call("POST", f"/v1/memories/{owen}/split", {"mention": mention})
    assert status == 201, split
    new = split["memory"]
    assert (new["text"], new["people"], new["themes"], new["mention_count"]) == (
        LAB["text"],
        LAB["people"],
        LAB["themes"],
        1,
    )
    assert (split["from"]["id"], split["from"]["mention_count"]) == (owen, 1)
    row = await db.fetchrow(
        "SELECT fingerprint, fingerprint_model FROM cards WHERE id = $1::uuid", new["id"]
    )
    assert row["fingerprint"] is not None and row["fingerprint_model"] == MODEL
    # Everything said is still there: both texts, the trace pointing at the new memory,
    # and a link that keeps the consolidation pass from merging them again.
    texts = {r["text"] for r in await db.fetch("SELECT text FROM cards WHERE status = 'active'")}
    assert texts == {OWEN["text"], LAB["text"]}
    trace = await db.fetchrow("SELECT new_text, split_into FROM reinforcements")
    assert (trace["new_text"], str(trace["split_into"])) == (LAB["text"], new["id"])
    link = await db.fetchrow("SELECT source, target, kind FROM memory_links")
    assert (str(link["source"]), str(link["target"]), link["kind"]) == (new["id"], owen, "distinct")
    # It is now found as itself.
    status, again = await api.call("POST", "/v1/memories", LAB)
    assert (status, again["reinforced"]) == (200, new["id"])


async def test_a_split_that_cannot_be_done_is_refused_and_changes_nothing(
    api: Api, script: Script, db: asyncpg.Connection
) -> None:
    owen, mention = await reinforced_wrongly(api, script)
    other = Api(api.harness)
    before = await snapshot(db)
    for who, body, status, code in [
        (api, {"mention": "1"}, 400, "invalid_field"),
        (api, {}, 400, "invalid_field"),
        (api, {"mention": mention + 1000}, 404, "unknown_mention"),
        (other, {"mention": mention}, 404, "unknown_memory"),
    ]:
        got, answer = await who.call("POST", f"/v1/memories/{owen}/split", body)
        assert (got, answer["code"]) == (status, code), answer
    assert await snapshot(db) == before
    await api.call("POST", f"/v1/memories/{owen}/split", {"mention": mention})
    got, answer = await api.call("POST", f"/v1/memories/{owen}/split", {"mention": mention})
    assert (got, answer["code"]) == (404, "unknown_mention")  # split once only


async def test_the_cli_lists_mentions_and_splits_one(
    api: Api,
    script: Script,
    dsn: str,
    fake_embeddings: FakeEmbeddings,
    db: asyncpg.Connection,
    capsys: pytest.CaptureFixture[str],
) -> None:
    owen, mention = await reinforced_wrongly(api, script)

    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser(prog="stillhere")
        memory_cli.add_parser(parser.add_subparsers(dest="command"))
        options = ["--person", api.person, "--db", dsn, "--embed-url", fake_embeddings.url]
        return parser.parse_args(["memory", "split", owen, *options, "--embed-model", MODEL, *argv])

    listing = parse()
    assert await listing.run(listing) == 0
    printed = capsys.readouterr().out
    assert f"{mention}" in printed and LAB["text"] in printed and "tier close" in printed
    split = parse("--mention", str(mention))
    assert await split.run(split) == 0
    assert "split out as" in capsys.readouterr().out
    assert await db.fetchval("SELECT count(*) FROM cards WHERE status = 'active'") == 2
    again = parse("--mention", str(mention))
    assert await again.run(again) == 1
