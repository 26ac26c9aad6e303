"""This node's ownership of the persons whose conversations it runs, on the loop side.

Several nodes may share one PostgreSQL; each person's live conversation runs on one of
them, the owner, named in the `owners` table (storage/owners.py). A node takes a person
before their actor starts and releases them when the actor goes. Its lease is the node's
own, its row in `nodes` (written once its name is held): renewed every third of `lease_s`
in one statement whatever the number of people it owns, it covers them all. A person taken
by another node (found after a renewal, below), or a write refused by the fence, is lost:
the directory closes their links (`moved`) and lets the conversation go without writing
more. A takeover (a person taken from another node) is told to the directory, which counts
it.

A node keeps until when it can be sure of its lease: the renewal's sending time plus the
lease, less a margin for clocks that run apart (`SURE_FRACTION`). PostgreSQL dates the
lease from a later instant, so no other node can take its people before then. A person
taken after the last renewal is sure from their own take, which gave them a lease of their
own. While a person's lease is not sure (PostgreSQL slow or out of reach, or the node's
lock lost with its listening connection), their stream holds events back rather than send
them: two nodes never stream to one person at once.

Another node takes a person from a live one only by a handoff this node made (it knows),
once this node's lease has lapsed, or while its lock is free; and such a take is ordered
with this node's renewals (storage/owners.py). So the node reads which of its epochs still
hold only after a renewal that may have followed one: a renewal that PostgreSQL found late
(the lease had lapsed), that came back after the node's sure time (the node was paused, or
PostgreSQL slow), or the first since the node's lock was found not held by its listening
connection or that connection was replaced (after a lost connection, or a failover to a
standby whose `owners` may lack takes it never received). Any other renewal follows one
after which nobody could take anyone from the node, and reads nothing but its own row.
While the lock is not its listener's, the node is sure of nobody, since anyone may be taken
at once; a listener whose lock is free is replaced (it may be up on a primary that vanished
unnoticed), and the node renews as soon as it holds the lock again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from storage import nodes, owners
from storage.notices import Notices
from storage.pool import STORAGE_FULL, UNAVAILABLE, storage_fault

log = logging.getLogger("stillhere.ownership")

SURE_FRACTION = 0.9  # of the lease: the margin for clocks that run apart
RETRY_S = 0.25  # between takes while waiting for an owner to hand over


class NotOwned(Exception):
    """Another node owns the person and did not hand them over within the lease."""


class NodeInUse(Exception):
    """Another process runs under this node's name on this database."""


@dataclass(frozen=True, slots=True)
class Hold:
    epoch: int
    sure_until: float  # time.monotonic(): from the take's own lease


class Ownership:
    def __init__(self, pool: asyncpg.Pool, notices: Notices, node: str, lease_s: float) -> None:
        self.node = node
        self.lease_s = lease_s
        self.held: dict[str, Hold] = {}
        # Set by the directory: a node asks for a person; a person was lost; sure again.
        self.on_handoff: Callable[[str], None] = lambda person: None
        self.on_lost: Callable[[str], None] = lambda person: None
        self.on_sure: Callable[[str], None] = lambda person: None
        # Set by the directory: a person was taken from another node, after what (`takeover`).
        self.on_takeover: Callable[[str], None] = lambda after: None
        self._pool = pool
        self._notices = notices
        self._released: dict[str, asyncio.Event] = {}
        self._connected_once = False
        self._sure_until = 0.0  # time.monotonic(): from the node's lease, for all it holds
        self._unsure_of_all = False  # until a renewal has read which epochs still hold
        self._renew_now = asyncio.Event()  # the lock was taken again: sure again sooner
        # The node's lock: how many times it was taken, by which backend the last time, and
        # under which of those times the epochs held were last read (-1: read them again).
        self._locks = 0
        self._listener: int | None = None
        self._looked = -1
        notices.listen(owners.HANDOFF, self._asked)
        notices.listen(owners.RELEASED, self._heard_released)
        notices.on_connect(self._hold_node)

    async def _hold_node(self, conn: asyncpg.Connection) -> None:
        if await owners.hold_node(conn, self.node):
            if not self._connected_once:
                await nodes.started(conn, self.node, self.lease_s)
            self._locks += 1  # it may have been free since the last renewal
            self._listener = conn.get_server_pid()
            if self._connected_once:
                self._renew_now.set()
            self._connected_once = True
            return
        if not self._connected_once:
            raise NodeInUse(f"node {self.node!r} already runs on this database; use --node-id")
        log.error("node %s: another process holds this node's name on the database", self.node)

    # -- taking and giving back -----------------------------------------------------------

    async def take(self, person: str) -> int:
        """Own `person`, asking the node that owns them to hand over if one does; the
        epoch. Raises NotOwned if they are still held after the lease (a node that holds
        without renewing loses them by then)."""
        deadline = time.monotonic() + self.lease_s + RETRY_S
        asked = False
        while (epoch := await self.try_take(person, asked=asked)) is None:
            if time.monotonic() > deadline:
                raise NotOwned(person)
            asked = True
            released = self._released[person] = asyncio.Event()
            await owners.ask_handoff(self._pool, person)
            # The lease may also run out meanwhile, which nobody announces: take again.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), RETRY_S)
        return epoch

    async def try_take(self, person: str, *, asked: bool = False) -> int | None:
        """Own `person` if nobody else does (`asked`: a handoff was asked for them before);
        the epoch, or None."""
        sent = time.monotonic()
        taken = await owners.take_over(self._pool, person, self.node, self.lease_s)
        if taken is None:
            return None
        self.held[person] = Hold(taken.epoch, sent + SURE_FRACTION * self.lease_s)
        after = takeover(taken, self.node, asked=asked)
        if after is not None:
            log.info("person %s taken from another node (%s)", person[:8], after)
            self.on_takeover(after)
        return taken.epoch

    async def release(self, person: str, epoch: int | None = None) -> None:
        """Give `person` up (what was taken under `epoch`; None: whatever this node holds),
        so another node may take them at once. If PostgreSQL cannot be reached, the lease
        runs out instead."""
        hold = self.held.get(person)
        if hold is not None and epoch in (None, hold.epoch):
            del self.held[person]
        try:
            await owners.release(self._pool, person, self.node, epoch)
        except (*UNAVAILABLE, STORAGE_FULL) as failure:
            log.warning(
                "person %s not released: PostgreSQL %s", person[:8], storage_fault(failure)[1]
            )

    def sure(self, person: str) -> bool:
        hold = self.held.get(person)
        if hold is None or self._unsure_of_all:
            return False
        return time.monotonic() < max(hold.sure_until, self._sure_until)

    def fenced(self, person: str, epoch: int) -> None:
        """A write for `person` under `epoch` was refused: another node owns them."""
        hold = self.held.get(person)
        if hold is not None and hold.epoch == epoch:
            del self.held[person]
            log.warning("person %s lost: another node owns them", person[:8])
            self.on_lost(person)

    # -- renewing -------------------------------------------------------------------------

    async def keep(self) -> None:
        """Renew the node's lease every third of its length, and as soon as its lock was
        taken again, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._renew_now.wait(), self.lease_s / 3)
            self._renew_now.clear()
            try:
                await self.renew()
            except Exception:  # the next round tries again: a dead loop would lose everyone
                log.exception("renewing the lease failed")

    async def stop(self) -> None:
        """Mark the node stopped in `nodes`, once it has released its people."""
        try:
            await nodes.stopped(self._pool, self.node)
        except (*UNAVAILABLE, STORAGE_FULL) as failure:
            log.warning(
                "node %s not marked stopped: PostgreSQL %s", self.node, storage_fault(failure)[1]
            )

    async def renew(self) -> None:
        """Renew the node's lease; after one that may have followed a take (the module's
        docstring), let go of the persons taken; then sure again of the rest."""
        sent = time.monotonic()
        locks = self._locks
        try:
            renewed = await self._renewed(locks, self._listener)
        except (*UNAVAILABLE, STORAGE_FULL) as failure:
            log.warning("lease not renewed: PostgreSQL %s", storage_fault(failure)[1])
            return
        if renewed and self._locks == locks:  # else the lock was taken again meanwhile
            self._looked = locks
            self._sure_from(sent)

    async def _renewed(self, locks: int, listener: int | None) -> bool:
        """Whether the renewal keeps every person still held (those taken let go)."""
        renewed = await owners.renew(self._pool, self.node)
        if renewed is None:  # the row is gone (an operator, a failover): write it again
            await nodes.started(self._pool, self.node, self.lease_s)
            self._unsure("its row in nodes was gone")
            return False
        if renewed.holder != listener:
            self._unsure("its lock is not held by its listening connection")
            if renewed.holder is None:  # that connection is elsewhere (a vanished primary)
                self._notices.replace()
            return False
        if renewed.lapsed or time.monotonic() >= self._sure_until or self._looked != locks:
            await self._drop_taken()
        return True

    def _sure_from(self, sent: float) -> None:
        """Sure of every person held, from the renewal sent at `sent`; if the node was not
        sure of them all then, each person's stream may send what it held back."""
        was_sure = sent < self._sure_until and not self._unsure_of_all
        self._sure_until = sent + SURE_FRACTION * self.lease_s
        self._unsure_of_all = False
        if not was_sure:
            for person in list(self.held):
                self.on_sure(person)

    def _unsure(self, why: str) -> None:
        """Sure of no person, even one taken since, until a renewal has read which epochs
        still hold: another node may take any of them at once."""
        if not self._unsure_of_all:
            log.warning("node %s unsure of its people: %s", self.node, why)
        self._unsure_of_all = True
        self._looked = -1

    async def _drop_taken(self) -> None:
        holds = dict(self.held)
        kept = await owners.held(self._pool, self.node, [h.epoch for h in holds.values()])
        for person, hold in holds.items():
            if hold.epoch not in kept:
                self.fenced(person, hold.epoch)

    # -- notices --------------------------------------------------------------------------

    def _asked(self, payload: str) -> None:
        node, _, person = payload.partition(" ")
        if node == self.node:
            self.on_handoff(person)

    def _heard_released(self, person: str) -> None:
        released = self._released.pop(person, None)
        if released is not None:
            released.set()


def takeover(taken: owners.Taken, node: str, *, asked: bool) -> str | None:
    """After what `node` took a person from another node (actors/metrics.py, TAKEOVERS),
    or None if nobody else had them. A row of another node's is taken only once its lease
    ran out (`lease`), or while its node's lock is free (`node_gone`: dead, or cut from
    PostgreSQL); a handoff asked for leaves no row behind once done (`handoff`). The row
    is read from the take's snapshot: an owner that released the person just then, unasked
    (it parked them), is counted as gone."""
    from_another = taken.previous not in (None, node)
    if from_another and taken.expired:
        return "lease"
    if asked:
        return "handoff"
    return "node_gone" if from_another else None
