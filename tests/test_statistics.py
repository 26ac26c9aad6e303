"""The planner's statistics on the append-only tables (migration 009): lean enough that an
ANALYZE is cheap, and still enough that every hot lookup goes through its index."""

from __future__ import annotations

import asyncpg
import orjson

from storage.records import LAST_FIRST
from storage.store import _FIRST_ACK, Store

# At the sizes of a 300 s bench run, where autovacuum analyzed each table every minute.
_FILL = """
INSERT INTO conversations (id, person, started_at, last_activity)
SELECT gen_random_uuid(), 'person-' || i, now(), now() FROM generate_series(1, 300) i;
INSERT INTO turns (conversation, person, role, client_id, text, at, place)
SELECT c.id, c.person, CASE WHEN g % 2 = 0 THEN 'user' ELSE 'assistant' END,
       CASE WHEN g % 2 = 0 THEN 'say-' || g END, repeat('word ', 10 + g % 30), now(), g
FROM generate_series(1, 20000) g JOIN conversations c ON c.person = 'person-' || (1 + g % 300);
INSERT INTO events (conversation, seq, frame)
SELECT c.id, g, jsonb_build_object('type', 'ack', 'id', 'say-' || g, 'seq', g)
FROM generate_series(1, 40000) g JOIN conversations c ON c.person = 'person-' || (1 + g % 300);
ANALYZE turns, events;
"""


async def _plan(db: asyncpg.Connection, query: str, *args: object) -> str:
    rows = await db.fetch("EXPLAIN (FORMAT JSON) " + query, *args)
    return orjson.dumps(orjson.loads(rows[0][0])).decode()


async def test_hot_lookups_keep_their_indexes_with_lean_statistics(
    store: Store, db: asyncpg.Connection
) -> None:
    await db.execute(_FILL)
    conversation = await db.fetchval("SELECT id FROM conversations WHERE person = 'person-7'")
    window = f"SELECT * FROM turns WHERE conversation = $1 ORDER BY {LAST_FIRST} LIMIT 20"
    replay = "SELECT frame FROM events WHERE conversation = $1 AND seq > $2 ORDER BY seq"
    plans = {
        "window": await _plan(db, window, conversation),
        "replay": await _plan(db, replay, conversation, 100),
        "resent say": await _plan(db, _FIRST_ACK, "person-7", "say-12"),
    }
    for name, plan in plans.items():
        assert "Seq Scan" not in plan, (name, plan)
    assert '"turns_place"' in plans["window"]
    assert '"turns_client_id"' in plans["resent say"]
    assert '"events_pkey"' in plans["replay"] and '"events_pkey"' in plans["resent say"]

    analyzed = await db.fetch(
        "SELECT tablename, attname FROM pg_stats WHERE tablename IN ('turns', 'events')"
    )
    columns = {(r["tablename"], r["attname"]) for r in analyzed}
    assert ("turns", "conversation") in columns and ("events", "conversation") in columns
    assert not columns & {("events", "frame"), ("turns", "text"), ("turns", "in_reply_to")}
