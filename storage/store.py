"""The asyncpg store: the conversation record, written as it happens.

Every method is a coroutine for the event loop; actors never call it directly, they start a
job on the loop that does (DESIGN.md, "The one process").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn
from uuid import UUID, uuid4

import asyncpg
import orjson

from storage.context import ContextReads
from storage.event_log import EventLog
from storage.loose_ends import LooseEndStore
from storage.migrate import migrate
from storage.moods import MoodStore
from storage.owners import Fenced, fence_one, hold
from storage.pool import STORAGE_FULL, DiskSpace, connect, open_pool
from storage.records import (
    LAST_FIRST,
    TALK_ORDER,
    Card,
    ConversationRecord,
    Reminder,
    ReplyMatch,
    StoredSay,
    Turn,
)
from storage.rules import RuleStore
from storage.say_log import SayLog

# A stored say's row, with the seq its first ack had. The ack was sent after the say was
# stored, so it is the first event of its id after the say's place (`records.say_place`);
# a row from before places has none, and its conversation is read from the start.
# A sort of 50,000 rows: past a work_mem of 64 kB, it writes some 1 MB of temporary files.
_SPILL = "SELECT count(*) FROM (SELECT g FROM generate_series(1, 50000) g ORDER BY g DESC) s"

_FIRST_ACK = """
SELECT t.*, (
    SELECT e.seq FROM events e
    WHERE e.conversation = t.conversation AND e.seq > coalesce(t.place / 2, 0)
      AND e.frame->>'type' = 'ack' AND e.frame->>'id' = t.client_id
    ORDER BY e.seq LIMIT 1
) AS ack_seq
FROM turns t WHERE t.person = $1 AND t.client_id = $2
"""


# The person ($2) if their epoch ($3) still holds, locked for the transaction.
_FENCE_ONE = fence_one(2)

# A conversation's last activity is its last turn's time, follow-ons aside (the assistant
# speaking on its own is not the person's activity), or a resent say's arrival if later
# (`say_log` writes that onto the row). Stored says only lock the conversation's row, so its
# `last_activity` holds the start (or the last resend) until the archive writes this. For a
# query whose `conversations` row is aliased `c`.
_ACTIVITY = f"""greatest(c.last_activity, (
    SELECT t.at FROM turns t WHERE t.conversation = c.id AND NOT t.follow_on
    ORDER BY {LAST_FIRST} LIMIT 1
))"""


class ConversationEnded(Exception):
    """A write aimed at a conversation that is no longer in progress."""


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda v: orjson.dumps(v).decode(),
        decoder=orjson.loads,
        schema="pg_catalog",
    )


def _turn(row: asyncpg.Record) -> Turn:
    return Turn(
        role=row["role"],
        text=row["text"],
        at=row["at"],
        client_id=row["client_id"],
        interrupted=row["interrupted"],
        reply_id=row.get("reply_id"),
        match=ReplyMatch.from_stored(match) if (match := row.get("reply_match")) else None,
        follow_on=bool(row.get("follow_on")),
    )


def _card(row: asyncpg.Record, shown_with: dict[str, UUID]) -> Card:
    reply = shown_with.get(str(row["id"]))
    return Card(row["id"], row["kind"], row["text"], row["created_at"], reply)


# The reply each card of a conversation was last shown with: the reply whose reply.start
# came last before its `card` event (a tool runs within its turn's reply).
_SHOWN_WITH = """
SELECT DISTINCT ON (c.frame->'card'->>'id') c.frame->'card'->>'id' AS card,
       (SELECT (s.frame->>'reply')::uuid FROM events s
        WHERE s.conversation = c.conversation AND s.seq < c.seq AND s.frame->>'type' = 'reply.start'
        ORDER BY s.seq DESC LIMIT 1) AS reply
FROM events c WHERE c.conversation = $1 AND c.frame->>'type' = 'card'
ORDER BY c.frame->'card'->>'id', c.seq DESC
"""


class Store:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self.space = DiskSpace()  # whether the writes last found PostgreSQL's disk full
        self.context = ContextReads(pool)  # what a turn's context is assembled from
        # Told of each person a write was refused for: this node no longer owns them.
        self.on_fenced: Callable[[str, int], None] = lambda person, epoch: None
        self.events = EventLog(pool, self.space, self._told_fenced)
        self.says = SayLog(pool, self.space)  # says, group-committed
        self.rules = RuleStore(pool)  # personal rules, edited over HTTP
        self.loose_ends = LooseEndStore(pool, self._told_fenced)  # what exchanges left open
        self.moods = MoodStore(pool)  # the assistant's fondness for each

    def _told_fenced(self, person: str, epoch: int) -> None:
        """For the stores beside this one: `on_fenced` as it is when they refuse a write."""
        self.on_fenced(person, epoch)

    @property
    def pool(self) -> asyncpg.Pool:
        """Shared with the node's ownership (actors/ownership.py), which writes beside it."""
        return self._pool

    @classmethod
    async def open(cls, dsn: str, *, max_size: int = 10) -> Store:
        """Connect, run the migrations, and hand back a ready store."""
        conn = await connect(dsn)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        pool = await open_pool(dsn, max_size=max_size, init=_init_connection)
        return cls(pool)

    async def close(self) -> None:
        self.events.close()
        await self._pool.close()

    async def ping(self) -> None:
        """One trivial query: PostgreSQL is reachable (the caller bounds the wait)."""
        await self._pool.fetchval("SELECT 1")

    async def disk_full(self) -> bool:
        """Whether PostgreSQL's disk is full: the last write failed for lack of space, none
        has succeeded since, and a write of this check's own fails too. That write (a sort
        spilled to temporary files, some 1 MB, in PostgreSQL's data folder unless
        `temp_tablespaces` says otherwise) lets a server nobody writes through, taken out of
        service for its full disk, see the space return."""
        if not self.space.full:
            return False
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute("SET LOCAL work_mem = '64kB'")
                await conn.fetchval(_SPILL)
        except STORAGE_FULL as failure:
            self.space.note(failure)
            return True
        self.space.note(None)
        return False

    # -- conversations ------------------------------------------------------------------

    async def active_conversation(self, person: str, window: int) -> ConversationRecord | None:
        """The person's conversation in progress, with its last `window` turns and cards."""
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                f"SELECT *, {_ACTIVITY} AS activity FROM conversations c "
                "WHERE person = $1 AND status = 'active'",
                person,
            )
            if row is None:
                return None
            turns = await conn.fetch(
                f"SELECT * FROM (SELECT * FROM turns WHERE conversation = $1 "
                f"ORDER BY {LAST_FIRST} LIMIT $2) t ORDER BY {TALK_ORDER}",
                row["id"],
                window,
            )
            # The memories made or reinforced in this conversation that are still active:
            # as a live actor drops those muted, marked erroneous, done or merged since
            # (`CardsWithdrawn`), so an actor activated again from here shows the same.
            cards = await conn.fetch(
                "SELECT * FROM cards WHERE status = 'active' AND (conversation = $1 OR id IN "
                "(SELECT existing FROM reinforcements WHERE conversation = $1)) "
                "ORDER BY created_at, id",
                row["id"],
            )
            shown = await conn.fetch(_SHOWN_WITH, row["id"])
        shown_with = {r["card"]: r["reply"] for r in shown if r["reply"] is not None}
        return ConversationRecord(
            id=row["id"],
            person=row["person"],
            started_at=row["started_at"],
            last_activity=row["activity"],
            speaker=row["speaker"],
            speaker_at=row["speaker_at"],
            seq_ceiling=row["seq_ceiling"],
            window=[_turn(t) for t in turns],
            cards=[_card(c, shown_with) for c in cards],
        )

    async def create_conversation(self, person: str, now: datetime, epoch: int) -> UUID:
        """A new conversation for `person`, under their owner `epoch` (else Fenced)."""
        conversation = uuid4()
        created = await self._pool.fetchval(
            "INSERT INTO conversations (id, person, started_at, last_activity) "
            f"SELECT $1, o.person, $4, $4 FROM ({_FENCE_ONE}) o RETURNING id",
            conversation,
            person,
            epoch,
            now,
        )
        if created is None:
            self._fence(person, epoch)
        return conversation

    async def archive(
        self, conversation: UUID, reason: str, now: datetime, person: str, epoch: int
    ) -> bool:
        """Mark the conversation archived, with its last activity; False if it already was.
        Only under the person's current owner `epoch` (else Fenced).

        The row is locked first, in a statement of its own: a batch of says being stored
        holds it (`say_log`), and only a statement begun after that batch sees its turns."""
        async with self._pool.acquire() as conn, conn.transaction():
            await hold(conn, person, epoch, self.on_fenced)
            locked = await conn.fetchval(
                "SELECT true FROM conversations WHERE id = $1 AND status = 'active' FOR UPDATE",
                conversation,
            )
            if not locked:
                return False
            await conn.execute(
                "UPDATE conversations c SET status = 'archived', archived_at = $2, "
                f"archive_reason = $3, last_activity = {_ACTIVITY} WHERE id = $1",
                conversation,
                now,
                reason,
            )
        return True

    async def set_summary(self, conversation: UUID, summary: str) -> None:
        await self._pool.execute(
            "UPDATE conversations SET summary = $2 WHERE id = $1", conversation, summary
        )

    async def conversation_person(self, conversation: UUID) -> str:
        return await self._pool.fetchval(
            "SELECT person FROM conversations WHERE id = $1", conversation
        )

    async def idle_conversations(self, before: datetime) -> list[tuple[UUID, str]]:
        # The row's `last_activity` is never later than the activity, so its index narrows
        # the search to the conversations that may be idle; their last turns decide.
        rows = await self._pool.fetch(
            f"SELECT id, person FROM (SELECT c.id, c.person, {_ACTIVITY} AS activity "
            "FROM conversations c WHERE c.status = 'active' AND c.last_activity < $1) a "
            "WHERE activity < $1 ORDER BY activity",
            before,
        )
        return [(r["id"], r["person"]) for r in rows]

    async def all_turns(self, conversation: UUID) -> list[Turn]:
        rows = await self._pool.fetch(
            f"SELECT * FROM turns WHERE conversation = $1 ORDER BY {TALK_ORDER}", conversation
        )
        return [_turn(r) for r in rows]

    async def set_speaker(
        self,
        conversation: UUID,
        speaker: str | None,
        at: datetime | None,
        person: str,
        epoch: int,
    ) -> None:
        """Who speaks on the person's phone now (None: the owner), under their owner
        `epoch` (else Fenced)."""
        owned = await self._pool.fetchval(
            f"WITH o AS ({_FENCE_ONE}), s AS (UPDATE conversations c SET speaker = $4, "
            "speaker_at = $5 FROM o WHERE c.id = $1 AND c.person = o.person) "
            "SELECT count(*) FROM o",
            conversation,
            person,
            epoch,
            speaker,
            at,
        )
        if not owned:
            self._fence(person, epoch)

    # -- turns --------------------------------------------------------------------------

    async def add_say(
        self,
        conversation: UUID,
        person: str,
        client_id: str,
        text: str,
        now: datetime,
        place: int,
        epoch: int,
    ) -> StoredSay:
        """Store a say once per (person, id) at `place` in the talk (`records.say_place`).

        A say resent with an id already stored is not stored again; the caller answers it
        with the ack it had before. One stored in this conversation but never acked (its
        write outlived the wait for it, or the process died in between) is handed back as
        new: acked now, and answered. So is one resent while its first write is still
        queued or in flight: it waits on that write (`SayLog.add`), and the caller that
        gave up on it acks nothing. Raises Fenced if `epoch` is no longer the person's.
        """
        say = self.says.add(conversation, person, client_id, text, now, place, epoch)
        row = await asyncio.shield(say)  # a caller giving up leaves it to a resend
        if not row["owned"]:
            self._fence(person, epoch)
        if not row["live"]:
            raise ConversationEnded(str(conversation))
        if row["id"] is not None:
            generation = int(row["context_generation"] or 0)
            return StoredSay(_turn(row), duplicate=False, ack_seq=None, generation=generation)
        row = await self._pool.fetchrow(_FIRST_ACK, person, client_id)
        if row["ack_seq"] is None and row["conversation"] == conversation:
            return StoredSay(_turn(row), duplicate=False, ack_seq=None)
        return StoredSay(_turn(row), duplicate=True, ack_seq=row["ack_seq"])

    # -- stream -------------------------------------------------------------------------

    async def raise_seq_ceiling(
        self, conversation: UUID, person: str, epoch: int, block: int
    ) -> int:
        """Reserve the next `block` seqs; return the new ceiling. Raises Fenced if `epoch`
        is no longer the person's."""
        ceiling = await self._pool.fetchval(
            f"UPDATE conversations c SET seq_ceiling = seq_ceiling + $4 FROM ({_FENCE_ONE}) o "
            "WHERE c.id = $1 AND c.person = o.person RETURNING seq_ceiling",
            conversation,
            person,
            epoch,
            block,
        )
        if ceiling is None:
            self._fence(person, epoch)
        return ceiling

    async def set_seq_ceiling(
        self, conversation: UUID, person: str, epoch: int, ceiling: int
    ) -> None:
        """Give back unused reserved seqs on a clean stop (never lowers below one used):
        only under the person's current `epoch`, as a node that lost them may be behind."""
        await self._pool.execute(
            f"UPDATE conversations c SET seq_ceiling = $4 FROM ({_FENCE_ONE}) o "
            "WHERE c.id = $1 AND c.person = o.person",
            conversation,
            person,
            epoch,
            ceiling,
        )

    def _fence(self, person: str, epoch: int) -> NoReturn:
        self.on_fenced(person, epoch)
        raise Fenced(person)

    async def events_between(
        self, conversation: UUID, after: int, below: int
    ) -> list[dict[str, Any]]:
        rows = await self._pool.fetch(
            "SELECT frame FROM events WHERE conversation = $1 AND seq > $2 AND seq < $3 "
            "ORDER BY seq",
            conversation,
            after,
            below,
        )
        return [r["frame"] for r in rows]

    # -- cards and reminders --------------------------------------------------------------

    async def add_reminder(
        self, conversation: UUID, person: str, epoch: int, text: str, due: str, now: datetime
    ) -> Reminder:
        """Store a reminder the person's conversation scheduled, under their owner `epoch`
        (else Fenced: nothing stored, and so nothing fires)."""
        reminder = Reminder(id=uuid4(), text=text, due=due, created_at=now)
        stored = await self._pool.fetchval(
            "INSERT INTO reminders (id, person, conversation, text, due, created_at) "
            f"SELECT $4, o.person, $1, $5, $6, $7 FROM ({_FENCE_ONE}) o RETURNING id",
            conversation,
            person,
            epoch,
            reminder.id,
            text,
            due,
            now,
        )
        if stored is None:
            self._fence(person, epoch)
        return reminder
