"""The judge of the uncertain band: the analysis model's `same-memory` task.

A pair of memories that no tier takes and no guard stops ("Tom doesn't drink alcohol" /
"Tom is teetotal": 0.59 by MiniLM) may be one fact in other words, or two. Such a new
memory is stored at once, like any other, and the pair is queued here: off the reply's
path, each pair is a request of its own (`M1`/`M2`, as PROTOCOL 1.1.1 allows), so its
verdict never depends on what else waits, and the answers applied:

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
from providers.analysis import Analysis, Shape
from storage.owners import Fenced
from storage.records import Memory, MemoryDraft

log = logging.getLogger("stillhere.memory")

TASK = "same-memory"
VERDICTS = ("same", "distinct", "contradiction")
# Pairs waiting at most: one request at a time, each up to the analysis timeout, so a model
# that hangs judges one pair per timeout; past this, new pairs are not judged (stay apart).
QUEUED_MAX = 256
# The fixed part of every request, first and byte for byte the same from call to call, so a
# server that keeps a cached prefix (llama.cpp, vLLM, hosted APIs) reads only the question's
# last sentence and the pair's own lines. The examples are none of the eval's pairs.
GROUND = """You compare two memories a personal assistant keeps about the person it talks \
with: M1, kept already, and M2, just told. Each is followed by a meta line (its type, \
people and themes). Two memories are one only when each tells nothing the other does not: \
the same fact in other words or in another language. Another fact about the same person or \
topic, a detail, a date, a place, a reason, another condition or another activity is \
something new.

Examples:
M1: Ben is a vegan. / M2: Ben doesn't eat any animal products. (one fact)
M1: Le chien de Zoé s'appelle Rex. / M2: Zoé's dog is called Rex. (one fact)
M1: My grandfather died last year. / M2: Grandad passed away last year. (one fact)
M1: I teach at Oakfield Primary. / M2: I teach Year 4 on Thursdays and Fridays. (M2 tells \
something new: the class and the days)
M1: Je suis allergique aux fraises. / M2: Je suis diabétique. (M2 tells something new: \
another condition)
M1: Ben lives in Cardiff. / M2: Ben's flat has a garden. (M2 tells something new: the garden)
M1: Ben's car is green. / M2: Ben's car is black. (a contradiction: another value)

"""
# Two questions on that ground: the verdict, and whether M2 tells anything new. A pair is
# merged only when the verdict is `same` and M2 tells nothing new, each way round: a small
# model that leans to `same` for two facts on one topic seldom finds nothing new both ways.
VERDICT = GROUND + (
    'Answer {"verdict": "same"} for one fact, {"verdict": "contradiction"} for the same '
    'thing with another value or denied, else {"verdict": "distinct"}. When unsure, answer '
    "distinct."
)
NEWS = GROUND + (
    'Does M2 tell anything that M1 does not? Answer {"new": true} or {"new": false}. When '
    "unsure, answer true."
)
# The answers, asked for by their schema (a server that decodes by it, as llama.cpp and
# vLLM do, cannot answer another shape), in a few tokens.
ANSWER_TOKENS = 12


def _shape(name: str, properties: dict[str, Any]) -> Shape:
    return Shape.of(name, properties, ANSWER_TOKENS)


VERDICT_SHAPE = _shape(TASK, {"verdict": {"type": "string", "enum": list(VERDICTS)}})
NEWS_SHAPE = _shape(f"{TASK}-news", {"new": {"type": "boolean"}})


@dataclass(frozen=True, slots=True)
class Pending:
    person: str
    new: Memory
    existing: Memory
    score: float
    epoch: int | None  # the owner epoch of the conversation it was said in, if any


def lines(existing: MemoryDraft, new: MemoryDraft, swapped: bool = False) -> list[str]:
    """The request's lines: the existing memory as `M1`, the new one as `M2` (the other way
    round when `swapped`), each with its meta line. Nothing else: a pair's verdict never
    depends on what else waits."""
    first, second = (new, existing) if swapped else (existing, new)
    out: list[str] = []
    for number, memory in ((1, first), (2, second)):
        out.append(f"M{number}: {' '.join(memory.text.split())}")
        out.append(
            f"  meta: type={memory.type} people={','.join(memory.people)} "
            f"themes={','.join(memory.themes)}"
        )
    return out


async def judged(analysis: Analysis, existing: MemoryDraft, new: MemoryDraft) -> str | None:
    """The verdict, `same` only when M2 also tells nothing new, each way round; None when
    an answer is missing or of the wrong shape."""
    said = verdict(await _ask(analysis, lines(existing, new), VERDICT, VERDICT_SHAPE))
    if said != "same":
        return said
    for request in (lines(existing, new), lines(existing, new, swapped=True)):
        new_said = news(await _ask(analysis, request, NEWS, NEWS_SHAPE))
        if new_said is not False:
            return None if new_said is None else "distinct"
    return said


async def _ask(
    analysis: Analysis, request: list[str], instructions: str, shape: Shape
) -> dict[str, Any] | None:
    answer = await analysis.ask(TASK, request, instructions, shape)
    if answer is None or (verdict(answer) is None and news(answer) is None):
        why = "no answer" if answer is None else "an answer of the wrong shape"
        log.info("same-memory: %s from %s; the memory stays apart", why, analysis.label)
    return answer


def verdict(answer: dict[str, Any] | None) -> str | None:
    """The pair's verdict: `{"verdict": ...}`, or the contract's `{"pairs": [{"existing":
    "M1", "new": "M2", "verdict": ...}]}`; None for no answer or one of another shape."""
    if answer is None:
        return None
    said = answer.get("verdict")
    if said is None and isinstance(answer.get("pairs"), list) and len(answer["pairs"]) == 1:
        (item,) = answer["pairs"]
        if isinstance(item, dict) and (item.get("existing"), item.get("new")) == ("M1", "M2"):
            said = item.get("verdict")
    return said if said in VERDICTS else None


def news(answer: dict[str, Any] | None) -> bool | None:
    """Whether M2 tells anything new: `{"new": ...}`, or a verdict (a model that answers
    every same-memory request by the contract: `same` is nothing new)."""
    if answer is not None and isinstance(answer.get("new"), bool):
        return bool(answer["new"])
    said = verdict(answer)
    return None if said is None else said != "same"


class SameMemoryJudge:
    """Queues uncertain pairs and puts them to `analysis` one by one, on the loop; merges
    through `keeper`, as the consolidation pass does."""

    def __init__(
        self,
        analysis: Analysis,
        keeper: MemoryKeeper,
        *,
        queued_max: int = QUEUED_MAX,
    ) -> None:
        self.analysis = analysis
        self.keeper = keeper
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
        """Stop at shutdown: the pair being judged is finished (one request, bounded by
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
        while self._queue:
            pair = self._queue.pop(0)
            try:
                await self._judge(pair)
            except Fenced as lost:  # the pair is left apart, as unjudged
                log.info("same-memory: person %s is another node's now; pair kept apart", lost)
            except Exception:  # a judge that fails must not stop the next pair
                log.exception("same-memory judgement failed; memory %s kept apart", pair.new.id)

    async def _judge(self, pair: Pending) -> None:
        said = await judged(self.analysis, pair.existing.draft, pair.new.draft)
        if await self._apply(pair, said):  # merged: its other candidates are moot
            self._queue = [p for p in self._queue if p.new.id != pair.new.id]

    async def _apply(self, pair: Pending, verdict: str | None) -> bool:
        """Apply one verdict; True when the new memory was merged."""
        person, new, existing = pair.person, pair.new, pair.existing
        cosine = f"cosine {pair.score:.3f}"
        if verdict == "same":
            note = f"judge: the same as {existing.id} ({cosine}); merged into it"
            absorbed = [(new.id, pair.score, "judge")]
            muted = await self.keeper.merge(
                person, existing.id, absorbed, decided_by="judge", reason=note, epoch=pair.epoch
            )
            if muted:
                await self.keeper.store.set_recognition(person, new.id, note, pair.epoch)
                log.info("memory %s merged into %s by the judge", new.id, existing.id)
                return True
            note = f"judge: the same as {existing.id} ({cosine}), which it could not join: kept"
        elif verdict is None:
            note = f"no judge answered about {existing.id} ({cosine}): kept"
        else:
            if verdict == "contradiction":
                now = self.keeper.clock.now()
                await self.keeper.store.link(
                    person, new.id, existing.id, "contradicts", now, pair.epoch
                )
            note = f"judge: {verdict} from {existing.id} ({cosine})"
        await self.keeper.store.set_recognition(person, new.id, note, pair.epoch)
        log.info("memory %s kept beside %s: %s", new.id, existing.id, note)
        return False
