"""Several nodes, as an operator sees them: who owns a person, the nodes and their people
(admin API and `stillhere inspect --cluster`), and the handoff, takeover and fence counters
of `/metrics`. Two whole servers in this process on the test's PostgreSQL, as in
tests/test_nodes.py, each with its admin API on a port of its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.clock import ManualClock
from cli.main import main
from tests.conftest import Harness, Phone, renewals

TOKEN = "admin-token-for-tests-0123456789abcdef"
LEASE = 9.0  # renewals every 3 s: time for a test's steps after one (`renewals`)


@pytest.fixture
async def nodes(dsn: str, clock: ManualClock, tmp_path: Path) -> AsyncIterator[list[Harness]]:
    pair = [Harness(dsn, clock, tmp_path / name) for name in ("a", "b")]
    for harness, name in zip(pair, ("a", "b"), strict=True):
        await harness.start(node_id=name, lease=LEASE, admin_token=TOKEN, admin_port=0)
    yield pair
    for harness in pair:
        await harness.stop()
        await harness.http.close()


def admin_url(harness: Harness) -> str:
    return f"http://127.0.0.1:{harness.server.admin_port}"


async def admin_get(harness: Harness, path: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with harness.http.get(admin_url(harness) + path, headers=headers) as response:
        return response.status, await response.json(content_type=None)


async def counters(harness: Harness) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the node's `GET /metrics`, by name and labels."""
    async with harness.http.get(harness.url("/metrics")) as response:
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def handoffs(stage: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("stillhere_handoffs_total", (("stage", stage),))


def takeovers(after: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("stillhere_takeovers_total", (("after", after),))


FENCED = ("stillhere_fenced_writes_total", ())


async def inspect(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["inspect", "--admin-token", TOKEN, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_the_admin_api_of_one_node_says_another_node_owns_the_person(
    nodes: list[Harness], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = nodes
    phone = await b.phone()
    person = b.person(phone)

    status, there = await admin_get(a, f"/admin/actors/{person}")
    assert status == 404 and there["code"] == "unknown_person"
    assert there["owner"]["node"] == "b" and there["owner"]["this_node"] is False
    assert "node b owns them" in there["message"]

    status, here = await admin_get(b, f"/admin/actors/{person}")
    assert status == 200
    assert here["owner"]["node"] == "b" and here["owner"]["this_node"] is True
    assert here["owner"]["epoch"] == there["owner"]["epoch"]

    code, out, err = await inspect(capsys, person, "--admin-url", admin_url(a))
    assert code == 1 and out == ""
    assert f"node b owns them (epoch {there['owner']['epoch']}" in err
    code, out, _ = await inspect(capsys, person, "--admin-url", admin_url(b))
    assert code == 0
    assert f"owner          node b (this node), epoch {here['owner']['epoch']}" in out

    status, nobody = await admin_get(a, "/admin/actors/" + "0" * 64)
    assert status == 404 and nobody["owner"] is None
    await phone.close()


async def test_inspect_cluster_lists_both_nodes_with_their_people(
    nodes: list[Harness], capsys: pytest.CaptureFixture[str], db: asyncpg.Connection
) -> None:
    a, b = nodes
    on_a = [await a.phone(), await a.phone()]
    on_b = await b.phone()

    status, listing = await admin_get(b, "/admin/nodes?people=on")
    assert status == 200 and listing["node"] == "b"
    by_name = {node["name"]: node for node in listing["nodes"]}
    assert {name: (n["state"], n["people"]) for name, n in by_name.items()} == {
        "a": ("up", 2),
        "b": ("up", 1),
    }
    assert {p["person"] for p in by_name["a"]["persons"]} == {a.person(p) for p in on_a}
    assert [p["person"] for p in by_name["b"]["persons"]] == [b.person(on_b)]

    code, out, _ = await inspect(capsys, "--cluster", "--admin-url", admin_url(a))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NODE", "STATE", "PEOPLE"]
    assert lines[1].split()[:4] == ["a", "*", "up", "2"]
    assert lines[2].split()[:3] == ["b", "up", "1"]
    assert lines[-1] == "2 nodes, 2 up; * this node"

    code, out, _ = await inspect(capsys, "--cluster", "--people", "--admin-url", admin_url(a))
    assert code == 0
    listed = out.splitlines()
    b_line = next(i for i, line in enumerate(listed) if line.startswith("b "))
    assert {line.split()[0] for line in listed[2:b_line]} == {a.person(p)[:12] for p in on_a}
    assert listed[b_line + 1].startswith(f"  {b.person(on_b)[:12]}  epoch ")

    # A heartbeat older than the node's lease: gone; and a node that stops cleanly: stopped.
    await renewals(db, 1)
    await db.execute(
        "UPDATE nodes SET last_heartbeat = now() - interval '1 minute' WHERE name = 'a'"
    )
    for p in on_a:
        await p.close()
    await on_b.close()
    await b.stop()
    _, listing = await admin_get(a, "/admin/nodes")
    assert {n["name"]: n["state"] for n in listing["nodes"]} == {"a": "gone", "b": "stopped"}
    await eventually_beats(db, "a")


async def eventually_beats(db: asyncpg.Connection, node: str) -> None:
    """The node's next renewal round brings its heartbeat back (within a third of the lease)."""
    async with asyncio.timeout(LEASE):
        while await db.fetchval(
            "SELECT last_heartbeat < now() - interval '30 seconds' FROM nodes WHERE name = $1", node
        ):
            await asyncio.sleep(0.1)


async def test_a_handoff_is_counted_by_both_nodes(nodes: list[Harness]) -> None:
    a, b = nodes
    first = await a.phone()
    before_a, before_b = await counters(a), await counters(b)
    assert before_a[("stillhere_node_info", (("node", "a"),))] == 1.0

    there = Phone(b, first.device)
    await there.connect()
    assert (await first.expect("bye"))["reason"] == "moved"

    after_a, after_b = await counters(a), await counters(b)
    assert after_a[handoffs("asked")] - before_a[handoffs("asked")] == 1
    assert after_a[handoffs("done")] - before_a[handoffs("done")] == 1
    assert after_b[takeovers("handoff")] - before_b[takeovers("handoff")] == 1
    assert after_b[handoffs("asked")] == before_b[handoffs("asked")]
    assert after_a[takeovers("handoff")] == before_a[takeovers("handoff")]
    await there.close()


async def test_a_lapsed_lease_is_a_takeover_and_the_old_nodes_write_is_fenced(
    nodes: list[Harness], db: asyncpg.Connection
) -> None:
    a, b = nodes
    phone = await a.phone()
    person = a.person(phone)
    # Node a stops renewing its lease (as if paused): it runs out, and so does the lease
    # the person's take gave, though a lives on.
    await renewals(db, 1)
    await db.execute(
        "UPDATE owners SET expires_at = now() - interval '1 second' WHERE person = $1", person
    )
    await db.execute(
        "UPDATE nodes SET last_heartbeat = now() - interval '1 minute' WHERE name = 'a'"
    )
    before_a, before_b = await counters(a), await counters(b)

    there = Phone(b, phone.device)
    await there.connect()
    assert await db.fetchval("SELECT node FROM owners WHERE person = $1", person) == "b"
    after_b = await counters(b)
    assert after_b[takeovers("lease")] - before_b[takeovers("lease")] == 1
    assert after_b[takeovers("handoff")] == before_b[takeovers("handoff")]

    await phone.send({"type": "say", "id": "late", "text": "still there?"})
    assert (await phone.expect("bye"))["reason"] == "moved"
    after_a = await counters(a)
    assert after_a[FENCED] - before_a[FENCED] >= 1
    assert after_a[handoffs("asked")] == before_a[handoffs("asked")]  # nobody asked a
    assert (
        await db.fetchval(
            "SELECT count(*) FROM turns WHERE person = $1 AND client_id = 'late'", person
        )
        == 0
    )
    await there.close()


async def test_a_person_held_by_a_dead_node_is_taken_at_once(
    nodes: list[Harness], db: asyncpg.Connection
) -> None:
    _, b = nodes
    phone = Phone(b, "device-of-a-dead-node-" + "y" * 16)
    person = b.person(phone)
    # Node c died holding the person: its lease runs on, but its lock went with it.
    await db.execute(
        "INSERT INTO owners VALUES ($1, 'c', nextval('owner_epochs'), now() + interval '1 hour')",
        person,
    )
    _, listing = await admin_get(b, "/admin/nodes")
    unknown = {n["name"]: n for n in listing["nodes"]}["c"]  # in `owners`, never in `nodes`
    assert (unknown["state"], unknown["people"], unknown["last_heartbeat"]) == ("unknown", 1, None)
    before = await counters(b)
    await phone.connect()
    after = await counters(b)
    assert after[takeovers("node_gone")] - before[takeovers("node_gone")] == 1
    await phone.close()


async def test_bad_listing_input_is_refused(
    nodes: list[Harness], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = nodes
    status, body = await admin_get(a, "/admin/nodes?people=yes")
    assert status == 400 and body["code"] == "invalid_field"
    code, _, err = await inspect(capsys, "--people", "--admin-url", admin_url(a))
    assert code == 1 and "--people goes with --cluster" in err


async def test_a_node_that_owns_no_one_still_renews_its_heartbeat(
    nodes: list[Harness], db: asyncpg.Connection
) -> None:
    assert await db.fetchval("SELECT count(*) FROM owners WHERE node = 'b'") == 0
    started = await db.fetchval("SELECT started_at FROM nodes WHERE name = 'b'")
    await db.execute(
        "UPDATE nodes SET last_heartbeat = now() - interval '1 minute' WHERE name = 'b'"
    )
    await eventually_beats(db, "b")
    assert await db.fetchval("SELECT started_at FROM nodes WHERE name = 'b'") == started
