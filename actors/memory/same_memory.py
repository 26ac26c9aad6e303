"""The judge of the uncertain band: the analysis model's `same-memory` task.

A pair of memories that no tier takes and no guard stops ("Tom doesn't drink alcohol" /
"Tom is teetotal": 0.59 by MiniLM) may be one fact in other words, or two. Such a new
memory is stored at once, like any other, and the pair is queued here: off the reply's
path, each pair is a request of its own (`M1`/`M2`, as PROTOCOL 1.1.1 allows), so its
verdict never depends on what else waits, and the answer applied:

- `same`, when the model is sure of it: the new memory is muted into the one it restates
  (a `merged_into` link, a trace row that names the judge), which takes its mentions;
  unmuting it, or splitting that mention back out, undoes it. The guards need no second
  look: `recognise` queues only the pairs they let through. Sure means the model's own
  chance of `same`, read from its tokens' log-probabilities where it wrote the verdict, is
  at least `SURE`; a server that gives none must say `same` with the pair asked the other
  way round too;
- `contradiction`: the two are linked as a possible contradiction;
- `distinct`, a `same` the model is unsure of, or no usable answer (no model, an error, a
  timeout, garbage): it stays a memory of its own. Never lost for want of a judge.

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
from providers.analysis import CHANCES, Analysis, Shape
from storage.owners import Fenced
from storage.records import Memory, MemoryDraft

log = logging.getLogger("stillhere.memory")

TASK = "same-memory"
VERDICTS = ("same", "distinct", "contradiction")
UNSURE = "unsure"  # the model said `same`, but not surely enough to merge
# Pairs waiting at most: one request at a time, each up to the analysis timeout, so a model
# that hangs judges one pair per timeout; past this, new pairs are not judged (stay apart).
QUEUED_MAX = 256
# The fixed instructions, first and byte for byte the same in every request, so a server
# that keeps a cached prefix (llama.cpp, vLLM, hosted APIs) reads only the pair's own lines.
# The examples are none of the eval's pairs.
INSTRUCTIONS = """You compare two memories a personal assistant keeps about the person it talks \
with: M1, kept already, and M2, just told, each followed by a meta line (its type, people and \
themes). They are one memory only when each tells nothing the other does not: the same fact in \
other words, or in another language. Another fact about the same person, place or thing is \
something new: a detail, a date, a place, a reason, an opinion, a plan, another condition, \
another activity, or the same value for another thing.

Examples:
M1: Ben is a vegan. / M2: Ben doesn't eat any animal products. -> same
M1: Le chien de Zoé s'appelle Rex. / M2: Zoé's dog is called Rex. -> same
M1: My grandfather died last year. / M2: Grandad passed away last year. -> same
M1: I'm short-sighted. / M2: I can't see far without glasses. -> same
M1: Ben is skint. / M2: Ben has no money left until the end of the month. -> same
M1: Ring Dad on Friday. / M2: Remind me to phone my father on Friday. -> same
M1: Ben hates olives. / M2: Olives make Ben feel sick, never serve him any. -> same
M1: I teach at Oakfield Primary. / M2: I teach Year 4 on Thursdays. -> distinct (the class, the \
day)
M1: Je suis allergique aux fraises. / M2: Je suis diabétique. -> distinct (another condition)
M1: Ben lives in Cardiff. / M2: Ben's flat has a garden. -> distinct (the garden)
M1: Ben's GP is Dr Lee. / M2: Dr Lee wants Ben to have a blood test. -> distinct (a plan)
M1: Ms Cole is Ben's vet. / M2: Ms Cole thinks Ben's dog needs an operation. -> distinct (an \
opinion)
M1: Ben is gluten-free. / M2: Ben avoids sugar too. -> distinct (another diet)
M1: The gym locker code is 1234. / M2: The bike lock code is 1234. -> distinct (another thing)
M1: Ben's car is green. / M2: Ben's car is black. -> contradiction

Answer {"verdict": "same"}, {"verdict": "distinct"} or {"verdict": "contradiction"}. When \
unsure, answer distinct."""
# The answer, its verdict weighed. Its opening is sent for the model to go on from, so the
# first token it writes is the verdict: on a CPU a token written costs what several read
# do, and the opening's five are read with the pair's lines instead of written one
# by one. `ANSWER_TOKENS` is room for the whole answer, from a server that answers anew.
OPENING = '{"verdict": "'
ANSWER_TOKENS = 12
SHAPE = Shape.of(
    TASK,
    {"verdict": {"type": "string", "enum": list(VERDICTS)}},
    ANSWER_TOKENS,
    weighed="verdict",
    opening=OPENING,
)
# The model's chance of `same` a merge needs. A small model leans to `same` for two facts
# on one topic, less surely than for a restatement: with the local model
# (Qwen2.5-Coder-1.5B), the distinct pairs of the tuning set's band reach 0.755 ("Dr Patel
# is Hannah's dentist." / "Dr Patel thinks Hannah's wisdom tooth should come out."). A
# pair's chance is not exact: it moved by up to 0.05 between two ways of asking the same
# question, and with what the server's cache held from the pair before. `SURE` is above
# the highest distinct pair by that much. `stillhere eval dedup`, docs/memories.md.
SURE = 0.81


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


@dataclass(frozen=True, slots=True)
class Judgement:
    """What the judge made of a pair: a verdict (`UNSURE` for a `same` it does not take),
    or None for no usable answer; and the model's chance of `same`, when the server said."""

    verdict: str | None
    chance: float | None = None

    def __str__(self) -> str:
        return "" if self.chance is None else f"p(same) {self.chance:.2f}, "


async def judged(analysis: Analysis, existing: MemoryDraft, new: MemoryDraft) -> Judgement:
    """The pair's judgement: `same` only when the model is sure of it (`SURE`), or, from a
    server that gives no log-probabilities, says it again with the pair the other way round."""
    answer = await _ask(analysis, lines(existing, new))
    said, chance = verdict(answer), same_chance(answer)
    if said != "same":
        return Judgement(said, chance)
    if chance is None:
        again = verdict(await _ask(analysis, lines(existing, new, swapped=True)))
        return Judgement(said if again == "same" else UNSURE)
    return Judgement(said if chance >= SURE else UNSURE, chance)


async def _ask(analysis: Analysis, request: list[str]) -> dict[str, Any] | None:
    answer = await analysis.ask(TASK, request, INSTRUCTIONS, SHAPE)
    if verdict(answer) is None:
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


def same_chance(answer: dict[str, Any] | None) -> float | None:
    """The model's chance of `same`, where the server gave its log-probabilities."""
    chances = (answer or {}).get(CHANCES)
    return chances.get("same") if isinstance(chances, dict) else None


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
        judgement = await judged(self.analysis, pair.existing.draft, pair.new.draft)
        if await self._apply(pair, judgement):  # merged: its other candidates are moot
            self._queue = [p for p in self._queue if p.new.id != pair.new.id]

    async def _apply(self, pair: Pending, judgement: Judgement) -> bool:
        """Apply one judgement; True when the new memory was merged."""
        person, new, existing = pair.person, pair.new, pair.existing
        verdict, cosine = judgement.verdict, f"{judgement}cosine {pair.score:.3f}"
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
        elif verdict == UNSURE:
            note = f"judge: unsure it is the same as {existing.id} ({cosine}): kept"
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
