"""Follow-ons: a message the assistant sends on its own, a few seconds after the person winds
a topic down, picking up something it still wanted to say (a loose end, an open thread).

Every reply to a say moves the assistant's mood towards the person (`actors.persona`),
written with the reply (`storage.moods`). When the says were a lull (the analysis's `lull`,
or a phrasing such as "ok thanks"), `after_exchange` then draws, from the runtime's
seedable random, whether a follow-on comes
(`--follow-ons auto`: the persona's chance; `always`: every time; `off`: never) and waits
the persona's pause on the runtime's clock. Then it tells the actor, which starts the
follow-on as a turn of its own (`TurnRequest.follow_on`) unless the person said anything
or left in between: any say, the end or the parking of the conversation cancels the wait.
So there is at most one follow-on per say, and only right after a lull.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from uuid import UUID

from actors.persona import START_FONDNESS

if TYPE_CHECKING:
    from actors.handles import TurnHandles
    from actors.inbox import Mailbox
    from actors.runtime import Runtime

log = logging.getLogger("stillhere.follow_on")

Written = Callable[[], Awaitable[None]]  # waits until the conversation's writes are done

MODES = ("auto", "always", "off")


class FollowOnWait:
    """The actor's handle on a follow-on after a lull, from the draw to the end of its pause.
    Used on the loop only; `handles` are the lull's turn's, for the follow-on's."""

    def __init__(self, handles: TurnHandles) -> None:
        self.handles = handles
        self.cancelled = False
        self.state = "drawing"  # drawing | waiting | declined | due (the actor is told)
        self._task: asyncio.Task[object] | None = None

    def waiting_in(self, task: asyncio.Task[object] | None) -> None:
        """The draw said yes: `task` sleeps the pause, and a cancel cuts it short."""
        self.state, self._task = "waiting", task

    def cancel(self, rt: Runtime) -> None:
        """The person spoke or left first. Counted here while the follow-on was still to
        come; once due, the actor counts it as it drops the message."""
        self.cancelled = True
        if self.state in ("drawing", "waiting"):
            count_cancelled(rt)
        if self._task is not None:
            self._task.cancel()


@dataclass(frozen=True, slots=True)
class FollowOnDue:
    """The pause is over: the actor sends the follow-on if `wait` is still its own."""

    wait: FollowOnWait


async def after_exchange(
    rt: Runtime,
    conversation: UUID,
    person: str,
    written: Written,
    wait: FollowOnWait,
    mailbox: Mailbox,
) -> None:
    """After a lull's reply, once it is written (`written`) with the mood it moved, draw
    whether a follow-on comes, wait its pause and tell the actor."""
    where = str(conversation)[:8]
    try:
        await written()
        fondness = await rt.store.moods.fondness(person)
    except Exception:
        # A follow-on still goes by the persona, fondness aside.
        log.exception("the mood in conversation %s could not be read", where)
        fondness = None
    fondness = START_FONDNESS if fondness is None else fondness
    if wait.cancelled:
        return
    chance = 1.0 if rt.settings.follow_ons == "always" else rt.persona.chance(fondness)
    if rt.random.random() >= chance:
        wait.state = "declined"
        rt.metrics.follow_ons.labels(outcome="declined").inc()
        log.info(
            "follow-on in conversation %s: none (chance %.2f, fondness %.2f)",
            where,
            chance,
            fondness,
        )
        return
    pause = rt.persona.pause(fondness)
    log.info(
        "follow-on in conversation %s in %.1f s (chance %.2f, fondness %.2f)",
        where,
        pause,
        chance,
        fondness,
    )
    wait.waiting_in(asyncio.current_task())
    try:
        await rt.clock.sleep(pause)
    except asyncio.CancelledError:
        if not wait.cancelled:
            raise  # shutting down
        return
    wait.state = "due"
    mailbox.tell(FollowOnDue(wait))


def count_cancelled(rt: Runtime) -> None:
    rt.metrics.follow_ons.labels(outcome="cancelled").inc()
    log.info("follow-on cancelled: the person spoke or left first")
