"""The supervisor actor: sweeps idle conversations and replaces failed actors.

A timer on the loop tells it `Sweep` every interval; the sweep itself (database reads,
summaries) runs on the loop and reports back, so the supervisor never blocks either.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

import pykka

from actors.directory import Directory, LiveConversation
from actors.inbox import ThreadingActor
from actors.runtime import Reply, Runtime

log = logging.getLogger("stillhere.supervisor")


@dataclass(frozen=True, slots=True)
class Sweep:
    reply: Reply | None = None


@dataclass(frozen=True, slots=True)
class SweepDone:
    report: dict[str, Any] | None
    reply: Reply | None


@dataclass(frozen=True, slots=True)
class ActorFailed:
    live: LiveConversation
    error: BaseException


@dataclass(frozen=True, slots=True)
class Sweeps:
    """Answer with a SweepHistory (for the admin API)."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class SweepHistory:
    sweeps: list[dict[str, Any]]  # the last sweeps' reports, newest last
    sweeping: bool
    replaced: int  # conversation actors that failed and were handed to a replacement


class Supervisor(ThreadingActor):
    def __init__(self, rt: Runtime, directory: Directory, history: int = 20) -> None:
        super().__init__()
        self._rt = rt
        self._directory = directory
        self._sweeps: deque[dict[str, Any]] = deque(maxlen=history)
        self._sweeping = False
        self.failures = 0

    def on_start(self) -> None:
        self._directory.on_failure = lambda live, error: self.actor_ref.tell(
            ActorFailed(live, error)
        )

    def on_receive(self, message: Any) -> None:
        match message:
            case Sweep():
                self._start_sweep(message.reply)
            case SweepDone():
                self._sweep_done(message)
            case ActorFailed():
                self.failures += 1
                self._rt.run(self._directory.replace(message.live), "replacing a failed actor")
            case Sweeps():
                message.reply.resolve(
                    SweepHistory(list(self._sweeps), self._sweeping, self.failures)
                )

    def _start_sweep(self, reply: Reply | None) -> None:
        if self._sweeping:  # one sweep at a time; a late tick joins nothing
            if reply is not None:
                reply.resolve(None)
            return
        self._sweeping = True
        self._rt.run(self._sweep(reply), "a sweep")

    async def _sweep(self, reply: Reply | None) -> None:
        """On the loop: sweep, then report to this actor, whatever happened."""
        report = None
        try:
            report = await self._directory.sweep()
        finally:
            try:
                self.actor_ref.tell(SweepDone(report, reply))
            except pykka.ActorDeadError:  # the server stopped while this sweep waited
                log.info("a sweep ended after the supervisor stopped")
                if reply is not None:
                    reply.resolve_here(report)

    def _sweep_done(self, message: SweepDone) -> None:
        self._sweeping = False
        report = message.report
        if report is not None:
            self._sweeps.append(report)
            log.info(
                "sweep: archived %d idle conversations, parked %d, deactivated %d, "
                "%d live (%d active)",
                report["archived"],
                report["parked"],
                report["deactivated"],
                report["live"],
                report["active"],
            )
        if message.reply is not None:
            message.reply.resolve(report)
