"""The admin API's view of the nodes sharing the database, and of who owns a person.

Read from PostgreSQL (`nodes` and `owners`, storage/nodes.py and storage/owners.py), so any
node's admin API shows the whole cluster, and says which node owns a person even when it is
another one: an operator asks whichever node they can reach.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg
from aiohttp import web

from storage import nodes, owners
from transport.errors import error_response
from transport.query import InvalidField, query_switch
from transport.server import SERVER_KEY


async def nodes_handler(request: web.Request) -> web.Response:
    """`GET /admin/nodes[?people=on]`: every node, its state, heartbeat and how many people
    it owns; with `people=on`, which ones."""
    try:
        with_people = query_switch(request.query, "people")
    except InvalidField as wrong:
        return error_response(400, "invalid_field", str(wrong))
    server = request.app[SERVER_KEY]
    pool = server.runtime.store.pool
    rows = [_node(row) for row in await nodes.listing(pool)]
    if with_people:
        by_node: dict[str, list[dict[str, Any]]] = {row["name"]: [] for row in rows}
        for owned in await nodes.people(pool):
            by_node.setdefault(owned["node"], []).append(_owned(owned))
        for row in rows:
            row["persons"] = by_node[row["name"]]
    at = server.runtime.clock.now().isoformat()
    return web.json_response({"at": at, "node": server.directory.ownership.node, "nodes": rows})


async def owner(request: web.Request, person: str) -> dict[str, Any] | None:
    """Who owns `person` now: node, epoch, lease end, and whether it is this node."""
    server = request.app[SERVER_KEY]
    row = await owners.owner_of(server.runtime.store.pool, person)
    if row is None:
        return None
    return {
        "node": row["node"],
        "this_node": row["node"] == server.directory.ownership.node,
        "epoch": row["epoch"],
        "lease_until": row["expires_at"].isoformat(),
    }


async def unknown_person(request: web.Request, person: str) -> web.Response:
    """404 for a person with no live conversation here, saying which node owns them if one
    does (`owner`, null if none)."""
    held = await owner(request, person)
    if held is None or held["this_node"]:
        message = "no live conversation for this person key (ended or parked?)"
    else:
        message = f"no live conversation for this person key here: node {held['node']} owns them"
    return error_response(404, "unknown_person", message, owner=held)


def _node(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "name": row["name"],
        "state": row["state"],
        "people": row["people"],
        "host": row["host"],
        "pid": row["pid"],
        "lease_s": row["lease_s"],
        "started_at": iso(row["started_at"]),
        "last_heartbeat": iso(row["last_heartbeat"]),
        "heartbeat_age_s": rounded(row["heartbeat_age_s"]),
        "stopped_at": iso(row["stopped_at"]),
    }


def _owned(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "person": row["person"],
        "epoch": row["epoch"],
        "lease_until": row["expires_at"].isoformat(),
        "expired": row["expired"],
    }


def iso(at: datetime | None) -> str | None:
    """A timestamp for the admin API's JSON, or null."""
    return at.isoformat() if at is not None else None


def rounded(seconds: float | None) -> float | None:
    """Seconds to the millisecond for the admin API's JSON, or null."""
    return round(seconds, 3) if seconds is not None else None
