"""This node's ownership of the persons whose conversations it runs, on the loop side.

Several nodes may share one PostgreSQL; each person's live conversation runs on one of
them, the owner, named in the `owners` table (storage/owners.py). A node takes a person
before their actor starts and releases them when the actor goes. It renews its leases
every third of `lease_s`; a lease that another node found ended, or a write refused by the
fence, means the person is lost: the directory closes their links (`moved`) and lets the
conversation go without writing more.

The node's row in `nodes` (storage/nodes.py), for operators, is written once its name is
held and its heartbeat renewed with the leases; a takeover (a person taken from another
node) is told to the directory, which counts it.

A node also keeps, per person, until when it can be sure of its lease: the renewal's
sending time plus the lease, less a margin for clocks that run apart. PostgreSQL dates the
lease from a later instant, so no other node can take the person before then. While a
person's lease is not sure (PostgreSQL slow or out of reach), their stream holds events
back rather than send them: two nodes never stream to one person at once.
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


@dataclass(slots=True)
class Hold:
    epoch: int
    sure_until: float  # time.monotonic()


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
        self._released: dict[str, asyncio.Event] = {}
        self._connected_once = False
        notices.listen(owners.HANDOFF, self._asked)
        notices.listen(owners.RELEASED, self._heard_released)
        notices.on_connect(self._hold_node)

    async def _hold_node(self, conn: asyncpg.Connection) -> None:
        if await owners.hold_node(conn, self.node):
            if not self._connected_once:
                await nodes.started(conn, self.node, self.lease_s)
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
        return hold is not None and time.monotonic() < hold.sure_until

    def fenced(self, person: str, epoch: int) -> None:
        """A write for `person` under `epoch` was refused: another node owns them."""
        hold = self.held.get(person)
        if hold is not None and hold.epoch == epoch:
            del self.held[person]
            log.warning("person %s lost: another node owns them", person[:8])
            self.on_lost(person)

    # -- renewing -------------------------------------------------------------------------

    async def keep(self) -> None:
        """Renew the leases every third of their length, and the node's heartbeat after
        them (never before: a slow heartbeat must not delay a lease), until cancelled."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self.renew()
                await self._beat()
            except Exception:  # the next round tries again: a dead loop would lose everyone
                log.exception("renewing the leases failed")

    async def _beat(self) -> None:
        with contextlib.suppress(*UNAVAILABLE, STORAGE_FULL):  # the leases' warning says so
            await nodes.beat(self._pool, self.node)

    async def stop(self) -> None:
        """Mark the node stopped in `nodes`, once it has released its people."""
        try:
            await nodes.stopped(self._pool, self.node)
        except (*UNAVAILABLE, STORAGE_FULL) as failure:
            log.warning(
                "node %s not marked stopped: PostgreSQL %s", self.node, storage_fault(failure)[1]
            )

    async def renew(self) -> None:
        holds = dict(self.held)
        if not holds:
            return
        sent = time.monotonic()
        try:
            kept = await owners.renew(
                self._pool, self.node, [h.epoch for h in holds.values()], self.lease_s
            )
        except (*UNAVAILABLE, STORAGE_FULL) as failure:
            log.warning("leases not renewed: PostgreSQL %s", storage_fault(failure)[1])
            return
        for person, hold in holds.items():
            if hold.epoch not in kept:
                self.fenced(person, hold.epoch)
            elif self.held.get(person) is hold:
                was_sure = sent < hold.sure_until
                hold.sure_until = sent + SURE_FRACTION * self.lease_s
                if not was_sure:
                    self.on_sure(person)

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
