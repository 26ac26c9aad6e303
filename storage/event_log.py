"""Stream events and replies of every conversation, written many to a statement (group commit).

A turn emits a few turn-level events (ack, reply.start, reply.end...) and stores its reply
with the move of the assistant's mood it makes (`storage.moods`), and each used to be a
round trip of its own. Here they queue, and one writer task writes
whatever queued while the previous write was in flight: under load the events and replies
of many conversations share one statement; on a quiet server a write goes at once. A
resent say's repeated ack is read back from its first `ack` here (`Store.add_say`).

A batch that PostgreSQL could not take now (down, restarting, its disk full) is not
dropped: it goes first in the next batch, and a retry every `RETRY_S` writes it when
nothing else comes, so a reply streamed live while PostgreSQL was away is replayable once
it is back. The fence is checked again then: a person this node no longer holds gets
nothing written. What is kept is bounded (`MAX_CARRIED`); the oldest go first, logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import orjson

from storage import moods
from storage.group_commit import GroupCommit
from storage.owners import FENCE
from storage.pool import STORAGE_FULL, UNAVAILABLE, DiskSpace, storage_fault
from storage.records import ReplyMatch, Turn

log = logging.getLogger("stillhere.events")

RETRY_S = 1.0  # a batch PostgreSQL could not take now is tried again after this long
MAX_CARRIED = 20_000  # events and replies kept for that retry, at most

# Only for the persons whose epochs still hold (`owned`, storage/owners.py): a node that
# lost a person writes nothing for them. The persons written for come back.
_WRITE = """
WITH owned AS ({fence}), written AS (
    INSERT INTO events (conversation, seq, frame)
    SELECT c, s, f::jsonb
    FROM unnest($1::uuid[], $2::bigint[], $3::text[], $16::text[], $19::bigint[])
         AS e (c, s, f, p, ep)
    WHERE (p, ep) IN (SELECT person, epoch FROM owned)
    ON CONFLICT DO NOTHING
), matched AS (
    UPDATE turns SET reply_match = m.j::jsonb
    FROM unnest($12::text[], $13::text[], $14::text[]) AS m (p, c, j)
    WHERE turns.person = m.p AND turns.client_id = m.c AND m.p IN (SELECT person FROM owned)
), replied AS (
    INSERT INTO turns (conversation, person, role, reply_id, text, at, interrupted, in_reply_to,
                       place, follow_on)
    SELECT c, p, 'assistant', r, t, a, i, ARRAY(SELECT jsonb_array_elements_text(irt::jsonb)),
           pl, fo
    FROM unnest($4::uuid[], $5::text[], $6::uuid[], $7::text[], $8::timestamptz[],
                $9::bool[], $10::text[], $11::bigint[], $15::bool[], $20::bigint[])
         AS r (c, p, r, t, a, i, irt, pl, fo, ep)
    WHERE (p, ep) IN (SELECT person, epoch FROM owned)
), moved AS ({moods})
SELECT DISTINCT person, epoch FROM owned
""".format(
    fence=FENCE.format(persons="$17", epochs="$18"),
    moods=moods.WRITE.format(
        persons="$21", starts="$22", scales="$23", offsets="$24", ats="$25", epochs="$26"
    ),
)


@dataclass(frozen=True, slots=True)
class _Entry:
    conversation: UUID
    person: str
    epoch: int
    frame: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReplyRow:
    """An assistant turn to store: the reply as sent (or as far as it went when cut off)."""

    conversation: UUID
    person: str
    reply: UUID
    turn: Turn
    in_reply_to: list[str]
    place: int  # in the talk: `records.reply_place`
    # What the says it answers answer in turn (client id, match), stored on their rows.
    matches: tuple[tuple[str, ReplyMatch], ...] = ()
    follow_on: bool = False  # sent on the assistant's own after a lull (actors/follow_on.py)
    epoch: int = 0  # the person's owner epoch it is written under (set by the stream)
    mood: moods.Nudge | None = None  # how the exchange moves fondness (a reply to a say)


@dataclass(frozen=True, slots=True)
class _Batch:
    events: list[_Entry]
    replies: list[ReplyRow]
    written: asyncio.Future[bool]


class EventLog(GroupCommit[_Batch]):
    def __init__(
        self, pool: asyncpg.Pool, space: DiskSpace, fenced: Callable[[str, int], None]
    ) -> None:
        super().__init__()
        self._pool = pool
        self._space = space
        self._fenced = fenced  # told of each person a write was refused for
        self._events: list[_Entry] = []
        self._replies: list[ReplyRow] = []
        self._batch: asyncio.Future[bool] | None = None
        # What PostgreSQL could not take now, written first in the next batch.
        self._carried: tuple[list[_Entry], list[ReplyRow]] = ([], [])
        self._retry: asyncio.TimerHandle | None = None

    def append(
        self, conversation: UUID, person: str, epoch: int, frame: dict[str, Any]
    ) -> asyncio.Future[bool]:
        """Queue one event, made under the person's `epoch`. The future says, once its batch
        is written, whether the write went through (a failure is logged here, once for the
        batch; a fenced person is told to `fenced`)."""
        self._events.append(_Entry(conversation, person, epoch, frame))
        return self._queued()

    def add_reply(self, row: ReplyRow) -> asyncio.Future[bool]:
        """Queue a reply's turn; the future is its batch's, as for `append`."""
        self._replies.append(row)
        return self._queued()

    def _queued(self) -> asyncio.Future[bool]:
        if self._batch is None:
            self._batch = asyncio.get_running_loop().create_future()
        self._kick()
        return self._batch

    def _take(self) -> _Batch | None:
        if self._batch is None:
            return None
        events, replies = self._carried
        batch = _Batch(events + self._events, replies + self._replies, self._batch)
        self._events, self._replies, self._batch = [], [], None
        self._carried = ([], [])
        return batch

    async def _write(self, batch: _Batch) -> None:
        written = await self._execute(batch.events, batch.replies)
        if not batch.written.done():
            batch.written.set_result(written)

    def _carry(self, events: list[_Entry], replies: list[ReplyRow]) -> None:
        """Keep a batch PostgreSQL could not take now for the next one, within the bound,
        and make sure a next one comes."""
        over = len(events) + len(replies) - MAX_CARRIED
        if over > 0:
            log.warning("%d stream events and replies dropped: too many awaiting a retry", over)
            dropped = min(over, len(events))
            events, replies = events[dropped:], replies[over - dropped :]
        self._carried = (events, replies)
        if self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(RETRY_S, self._retry_now)

    def _retry_now(self) -> None:
        self._retry = None
        if self._carried != ([], []):
            self._queued()

    def close(self) -> None:
        """Stop retrying (the store is closing): what is still carried is logged as lost."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        events, replies = self._carried
        if events or replies:
            log.warning(
                "%d stream events and %d replies never written: PostgreSQL did not take them",
                len(events),
                len(replies),
            )

    async def _execute(self, events: list[_Entry], replies: list[ReplyRow]) -> bool:
        claims = {(e.person, e.epoch) for e in events} | {(r.person, r.epoch) for r in replies}
        try:
            owned = await self._pool.fetch(
                _WRITE,
                [e.conversation for e in events],
                [e.frame["seq"] for e in events],
                [orjson.dumps(e.frame).decode() for e in events],
                [r.conversation for r in replies],
                [r.person for r in replies],
                [r.reply for r in replies],
                [r.turn.text for r in replies],
                [r.turn.at for r in replies],
                [r.turn.interrupted for r in replies],
                [orjson.dumps(r.in_reply_to).decode() for r in replies],
                [r.place for r in replies],
                *_matches(replies),
                [r.follow_on for r in replies],
                [e.person for e in events],
                [person for person, _ in claims],
                [epoch for _, epoch in claims],
                [e.epoch for e in events],
                [r.epoch for r in replies],
                *moods.moves((r.person, r.epoch, r.mood) for r in replies if r.mood),
            )
        except (*UNAVAILABLE, STORAGE_FULL) as failure:
            self._space.note(failure)
            log.warning(
                "%d stream events and %d replies could not be written, kept for a retry: "
                "PostgreSQL %s",
                len(events),
                len(replies),
                storage_fault(failure)[1],
            )
            self._carry(events, replies)
            return False
        except Exception:
            log.exception(
                "%d stream events and %d replies could not be written", len(events), len(replies)
            )
            return False
        self._space.note(None)
        kept = {(r["person"], r["epoch"]) for r in owned}
        for person, epoch in claims - kept:
            log.warning(
                "writes for person %s refused: epoch %d no longer holds them", person[:8], epoch
            )
            self._fenced(person, epoch)
        return True


def _matches(replies: list[ReplyRow]) -> tuple[list[str], list[str], list[str]]:
    """The says' matches as three columns: person, client id, the match as JSON."""
    rows = [(r.person, said, m.stored()) for r in replies for said, m in r.matches]
    return (
        [person for person, _, _ in rows],
        [said for _, said, _ in rows],
        [orjson.dumps(match).decode() for _, _, match in rows],
    )
