"""The judge of the uncertain band: the analysis model's `same-memory` task.

A pair of memories that no tier takes and no guard stops ("Tom doesn't drink alcohol" /
"Tom is teetotal": 0.59 by MiniLM) may be one fact in other words, or two. Such a new
memory is stored at once, like any other, and the pair is queued here: off the reply's
path, pairs are sent in batches (`M1`/`M2`, `M3`/`M4`... as PROTOCOL 1.1.1 has it), and
the answers applied:

- `same`: the new memory is muted into the one it restates (a `merged_into` link, a trace
  row that names the judge), which takes its mentions; unmuting it, or splitting that
  mention back out, undoes it. The guards need no second look: `recognise` queues only
  the pairs they let through;
- `contradiction`: the two are linked as a possible contradiction;
- `distinct`, or no usable answer (no model, an error, a timeout, garbage): it stays a
  memory of its own. Never lost for want of a judge.

Whatever happens, the new memory's `recognition` says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actors.memory.keeper import MemoryKeeper
from actors.memory.recognition import Candidate
from providers.analysis import Analysis
from storage.owners import Fenced
from storage.records import Memory

log = logging.getLogger("stillhere.memory")

TASK = "same-memory"
VERDICTS = ("same", "distinct", "contradiction")
BATCH = 8  # pairs per request
# Pairs waiting at most: one request at a time, each up to the analysis timeout, so a model
# that hangs judges 8 pairs per timeout; past this, new pairs are not judged (stay apart).
QUEUED_MAX = 256
INSTRUCTIONS = (
    "You compare memories a personal assistant keeps about the person it talks with. "
    "Each pair is an existing memory (odd number) and a new one (the next number), each "
    "followed by its type, people and themes. Answer in JSON: "
    '{"pairs": [{"existing": "M1", "new": "M2", "verdict": "same" | "distinct" | '
    '"contradiction"}]}. "same": the new memory restates the existing one, in any words or '
    'language. "distinct": another fact, even about the same thing or a different person '
    '(my daughter is not me). "contradiction": the same thing with another value, or its '
    "negation or opposite. When unsure, answer distinct."
)


@dataclass(frozen=True, slots=True)
class Pending:
    person: str
    new: Memory
    existing: Memory
    score: float
    epoch: int | None  # the owner epoch of the conversation it was said in, if any


def lines(pairs: Sequence[Pending]) -> list[str]:
    """The request's lines: each pair as `M<odd>` (existing), `M<even>` (new), with meta."""
    out: list[str] = []
    for i, pair in enumerate(pairs):
        for number, memory in ((2 * i + 1, pair.existing), (2 * i + 2, pair.new)):
            out.append(f"M{number}: {' '.join(memory.text.split())}")
            out.append(
                f"  meta: type={memory.type} people={','.join(memory.people)} "
                f"themes={','.join(memory.themes)}"
            )
    return out


def verdicts(answer: dict[str, Any] | None, count: int) -> list[str | None] | None:
    """Each pair's verdict from the answer (None where it gives none); None for an answer
    of the wrong shape, which is no answer at all."""
    if answer is None or not isinstance(answer.get("pairs"), list):
        return None
    found: list[str | None] = [None] * count
    for item in answer["pairs"]:
        if not isinstance(item, dict) or item.get("verdict") not in VERDICTS:
            return None
        existing, new = item.get("existing"), item.get("new")
        if not (isinstance(existing, str) and isinstance(new, str)):
            return None
        number = existing.removeprefix("M")
        if not number.isdecimal() or int(number) % 2 != 1 or new != f"M{int(number) + 1}":
            return None
        index = int(number) // 2
        if index >= count:
            return None
        found[index] = item["verdict"]
    return found


class SameMemoryJudge:
    """Queues uncertain pairs and puts them to `analysis` in batches, on the loop; merges
    through `keeper`, as the consolidation pass does."""

    def __init__(
        self,
        analysis: Analysis,
        keeper: MemoryKeeper,
        *,
        batch: int = BATCH,
        queued_max: int = QUEUED_MAX,
    ) -> None:
        self.analysis = analysis
        self.keeper = keeper
        self.batch = batch
        self.queued_max = queued_max
        self._queue: list[Pending] = []
        self._task: asyncio.Task[None] | None = None

    def submit(
        self,
        person: str,
        new: Memory,
        uncertain: Sequence[Candidate],
        epoch: int | None = None,
    ) -> None:
        """Queue `new` against each uncertain candidate; returns at once. `new` said in a
        conversation is merged only under its owner `epoch`: a node that lost the person
        leaves the pair to stay apart."""
        room = self.queued_max - len(self._queue)
        if len(uncertain) > room:
            log.warning(
                "same-memory: %d pairs waiting for the judge; memory %s is kept apart from "
                "%d more unjudged",
                len(self._queue),
                new.id,
                len(uncertain) - max(room, 0),
            )
        for candidate in uncertain[: max(room, 0)]:
            if candidate.memory.type != new.type:
                continue  # two types are two memories, whatever a model would say
            pair = Pending(person, new, candidate.memory, candidate.judged.score, epoch)
            self._queue.append(pair)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def drain(self) -> None:
        """Wait until every queued pair is judged (the eval, the tests)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def close(self) -> None:
        """Stop at shutdown: the batch being judged is finished (one request, bounded by
        the analysis model's timeout), the pairs still queued are dropped. Their memories
        are stored already and stay apart, as with no judge at all."""
        if self._queue:
            log.info(
                "same-memory: %d pairs left unjudged at shutdown; the memories stay apart",
                len(self._queue),
            )
            self._queue = []
        await self.drain()

    async def _run(self) -> None:
        await asyncio.sleep(0)  # let the memories told in one turn join one batch
        while self._queue:
            taken, self._queue = self._queue[: self.batch], self._queue[self.batch :]
            try:
                await self._judge(taken)
            except Fenced as lost:  # the rest of the batch is left apart, as unjudged
                log.info("same-memory: person %s is another node's now; pairs kept apart", lost)
            except Exception:  # a judge that fails must not stop the next batch
                log.exception("same-memory judgement failed; %d memories kept apart", len(taken))

    async def _judge(self, pairs: list[Pending]) -> None:
        answer = await self.analysis.ask(TASK, lines(pairs), INSTRUCTIONS)
        found = verdicts(answer, len(pairs))
        if found is None:
            why = "no answer" if answer is None else "an answer of the wrong shape"
            log.info("same-memory: %s from %s; the memories stay apart", why, self.analysis.label)
        merged: set[object] = set()
        for pair, verdict in zip(pairs, found or [None] * len(pairs), strict=True):
            if pair.new.id not in merged and await self._apply(pair, verdict, found is None):
                merged.add(pair.new.id)

    async def _apply(self, pair: Pending, verdict: str | None, failed: bool) -> bool:
        """Apply one verdict; True when the new memory was merged."""
        person, new, existing = pair.person, pair.new, pair.existing
        if verdict == "same":
            note = f"judge: the same as {existing.id} (cosine {pair.score:.3f}); merged into it"
            absorbed = [(new.id, pair.score, "judge")]
            muted = await self.keeper.merge(
                person, existing.id, absorbed, decided_by="judge", reason=note, epoch=pair.epoch
            )
            if muted:
                await self.keeper.store.set_recognition(person, new.id, note, pair.epoch)
                log.info("memory %s merged into %s by the judge", new.id, existing.id)
                return True
            verdict = None
        if verdict == "contradiction":
            now = self.keeper.clock.now()
            await self.keeper.store.link(
                person, new.id, existing.id, "contradicts", now, pair.epoch
            )
        if failed:
            note = f"no judge answered about {existing.id} (cosine {pair.score:.3f}): kept"
        elif verdict is None:
            note = f"the judge said nothing of {existing.id} (cosine {pair.score:.3f}): kept"
        else:
            note = f"judge: {verdict} from {existing.id} (cosine {pair.score:.3f})"
        await self.keeper.store.set_recognition(person, new.id, note, pair.epoch)
        log.info("memory %s kept beside %s: %s", new.id, existing.id, note)
        return False
