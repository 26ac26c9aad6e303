"""The memory keeper: remember (recognise or create), search by meaning, back-fill.

It runs on the loop (its methods are coroutines the turn pipeline, the supervisor's passes
and the CLI await) and ties together the store (the truth), the embedder (fingerprints)
and the fingerprint index (fast look-ups). Recognising and creating happen under a
per-person lock, so two mentions of one new fact in quick succession make one memory.

A fingerprint that cannot be made is not a reason to lose what the person said: the memory
is stored without one, the failure is logged, and `backfill` fills it in later. Until then
only a verbatim restatement can be recognised against it. Nor is a slow embedder a reason to
hold a reply or a request: `remember` waits at most `fingerprint_wait` for the fingerprint,
stores the memory without it past that, and fills it in when the embedder answers.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import tzinfo
from typing import Protocol
from uuid import UUID

import numpy as np

from actors.clock import Clock
from actors.jobs import Jobs
from actors.memory.judging import Judge, judge_for
from actors.memory.owner import NAMING_HINT, own_names
from actors.memory.recognition import VERBATIM, Candidate, recognise, same_text
from actors.memory.search import (
    CANDIDATES,
    NAMED_ROWS,
    Found,
    Meaning,
    name_words,
    rank,
    with_neighbours,
)
from providers.embedding import Embedder, EmbeddingError
from storage.fingerprints import decode, encode
from storage.memories import Changed, Cleanup, MemoryStore, UnknownMemories
from storage.memory_index import FingerprintIndex
from storage.records import Memory, MemoryDraft, Reinforcement

log = logging.getLogger("stillhere.memory")

# What the candidates' read gives back: the memories, and the fingerprints the model made.
Rows = tuple[dict[UUID, Memory], dict[UUID, bytes]]

SUMMARY = "summary"  # the type of a conversation's summary, kept findable by meaning

# How long a memory being stored waits for its fingerprint: a local embedder answers in
# milliseconds and an API in a few hundred; a reply or a request is not held longer.
DEFAULT_FINGERPRINT_WAIT_S = 2.0

Embedding = asyncio.Task[np.ndarray]


@dataclass(frozen=True, slots=True)
class Remembered:
    """The outcome of `remember`: the memory created, or the one it reinforced."""

    memory: Memory
    created: bool
    tier: str | None = None  # how it was recognised (exact, close, shared), if it was
    score: float | None = None
    contradicts: tuple[Memory, ...] = ()  # stored beside these, linked as contradictions
    fingerprinted: bool = True
    reason: str = ""  # which path decided (tier, guard) and why


@dataclass(frozen=True, slots=True)
class Split:
    """A mention made a memory of its own, and the memory it had been counted in."""

    memory: Memory
    former: Memory


class NoSuchMention(LookupError):
    """Not a mention of that memory, or split out already."""

    def __init__(self, mention: int) -> None:
        super().__init__(f"no mention {mention} left to split")
        self.mention = mention


class SameMemory(Protocol):
    """What the keeper hands the uncertain band to (`actors.memory.same_memory`)."""

    def submit(
        self,
        person: str,
        new: Memory,
        uncertain: Sequence[Candidate],
        epoch: int | None = None,
    ) -> None: ...

    async def drain(self) -> None: ...

    async def close(self) -> None: ...


class MemoryKeeper:
    def __init__(
        self,
        store: MemoryStore,
        embedder: Embedder,
        clock: Clock,
        *,
        judge: Judge | None = None,
        candidates: int = 8,
        max_persons: int = 256,
        offload_above: int = 2048,
        fingerprint_wait: float = DEFAULT_FINGERPRINT_WAIT_S,
    ) -> None:
        self.store = store
        self.fingerprint_wait = fingerprint_wait
        # Fingerprints still being made for memories stored without them (cancelled on close:
        # the back-fill pass makes what they would have).
        self._late = Jobs()
        self.embedder = embedder
        self.clock = clock
        self.model = embedder.name
        self.judge = judge or judge_for(embedder)
        self.meaning = Meaning(embedder)
        self.candidates = candidates
        self._max_persons = max_persons
        self._offload_above = offload_above
        self._index: FingerprintIndex | None = None
        # Told (on the loop) which memories left the active set, so a live conversation
        # stops handing them to the model at once.
        self.on_withdrawn: Callable[[str, list[UUID]], None] | None = None
        # Asks the analysis model about pairs in the uncertain band, after they are stored.
        self.same_memory: SameMemory | None = None
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @property
    def index(self) -> FingerprintIndex:
        """The fingerprint index (made once the embedder's dimension is known)."""
        if self._index is None:
            if not self.embedder.dim:
                raise RuntimeError("the embedder's dimension is not known yet")
            self._index = FingerprintIndex(
                self.store,
                self.model,
                self.embedder.dim,
                max_persons=self._max_persons,
                offload_above=self._offload_above,
            )
        return self._index

    def drop(self, person: str) -> None:
        """The person's conversation went: free their index (rebuilt on the next use)."""
        if self._index is not None:
            self._index.drop(person)

    async def close(self) -> None:
        await self._late.settle(0)
        if self.same_memory is not None:
            await self.same_memory.close()  # what is queued is stored already
        if self._index is not None:
            self._index.clear()

    def _lock(self, person: str) -> asyncio.Lock:
        lock = self._locks.get(person)
        if lock is None:
            lock = self._locks[person] = asyncio.Lock()
        return lock

    # -- fingerprints -----------------------------------------------------------------------

    async def fingerprint(self, texts: list[str]) -> np.ndarray:
        """Embed `texts`; raises EmbeddingError."""
        vectors = await self.embedder.embed(texts)
        if vectors.shape != (len(texts), self.embedder.dim):
            raise EmbeddingError("bad_response", f"embedder gave shape {vectors.shape}")
        return vectors

    async def ready(self) -> FingerprintIndex:
        """The index, learning the embedder's dimension first if it has to (an API model
        says it only in its first answer)."""
        if self._index is None and not self.embedder.dim:
            await self.fingerprint(["dimension probe"])
        return self.index

    async def _fingerprint_soon(self, text: str) -> tuple[np.ndarray | None, Embedding | None]:
        """The fingerprint of `text` if the embedder gives it within `fingerprint_wait`;
        else None and the embedding still under way, for `_fill_later` once stored."""
        task = asyncio.ensure_future(self.fingerprint([text]))
        try:
            async with asyncio.timeout(self.fingerprint_wait):
                return (await asyncio.shield(task))[0], None
        except TimeoutError:
            log.info(
                "fingerprint not made within %g s: the memory is stored first and "
                "fingerprinted when the embedder answers",
                self.fingerprint_wait,
            )
            return None, task
        except EmbeddingError as failure:
            self._unfingerprinted(failure)
            return None, None
        except asyncio.CancelledError:
            task.cancel()
            raise

    @staticmethod
    def _unfingerprinted(failure: EmbeddingError) -> None:
        log.warning(
            "fingerprint failed (%s); the memory is stored without one and the back-fill "
            "pass will make it: %s",
            failure.code,
            failure,
        )

    def _fill_later(self, pending: Embedding | None, memory: UUID | None) -> None:
        """Once `pending` gives the fingerprint of `memory`, stored without one, fill it in
        (the write moves the person's generation, so the index takes it on its next look-up).
        Without a memory to fill, the embedding is not needed any more."""
        if pending is None:
            return
        if memory is None:
            pending.cancel()
            return
        self._late.start(self._fill(pending, memory), f"late fingerprint of memory {memory}")

    async def _fill(self, pending: Embedding, memory: UUID) -> None:
        try:
            vector = (await pending)[0]
        except EmbeddingError as failure:
            self._unfingerprinted(failure)
            return
        except asyncio.CancelledError:
            pending.cancel()
            raise
        if await self.store.set_fingerprint(memory, None, encode(vector), self.model):
            log.info("memory %s fingerprinted after it was stored", memory)

    # -- remembering ------------------------------------------------------------------------

    async def remember(
        self,
        person: str,
        draft: MemoryDraft,
        *,
        conversation: UUID | None = None,
        epoch: int | None = None,
    ) -> Remembered:
        """Reinforce the memory `draft` restates, or store it as a new one. Said in a
        conversation, as the person's owner under `epoch`: raises Fenced (nothing stored,
        nothing reinforced) once another node owns them."""
        vector, pending = await self._fingerprint_soon(draft.text)
        try:
            remembered = await self._remember(person, draft, conversation, epoch, vector)
        except BaseException:
            self._fill_later(pending, None)
            raise
        self._fill_later(pending, remembered.memory.id if remembered.created else None)
        return remembered

    async def _remember(
        self,
        person: str,
        draft: MemoryDraft,
        conversation: UUID | None,
        epoch: int | None,
        vector: np.ndarray | None,
    ) -> Remembered:
        async with self._lock(person):
            # A conversation's summary is a record of its own, never merged either way.
            candidates = (
                [] if draft.type == SUMMARY else await self._candidates(person, draft, vector)
            )
            verdict = recognise(draft, candidates)
            if verdict.turns_on_names():  # maybe only for want of the person's name
                me = await self.own_names(person)
                verdict = recognise(draft, candidates, me) if me else verdict
            now = self.clock.now()
            contradicts = tuple(m for m, _ in verdict.contradicts)
            if verdict.match is not None:
                match = verdict.match
                reinforced = await self.store.reinforce(
                    person,
                    match.existing.id,
                    tier=match.tier,
                    score=match.score,
                    said=draft,
                    now=now,
                    conversation=conversation,
                    reason=verdict.reason,
                    epoch=epoch,
                )
                if reinforced is not None:
                    log.info(
                        "memory recognised (tier %s, score %.3f%s): reinforced %s, now %d "
                        "mentions, instead of creating a new one (new id: none)",
                        match.tier,
                        match.score,
                        f" by {match.model}" if match.model else "",
                        reinforced.id,
                        reinforced.mention_count,
                    )
                    fingerprinted = vector is not None
                    return Remembered(
                        reinforced,
                        False,
                        match.tier,
                        match.score,
                        contradicts,
                        fingerprinted,
                        verdict.reason,
                    )
            created, generation = await self.store.create(
                person,
                draft,
                now,
                conversation=conversation,
                fingerprint=encode(vector) if vector is not None else None,
                model=self.model if vector is not None else None,
                contradicts=[m.id for m in contradicts],
                recognition=verdict.reason or None,
                epoch=epoch,
            )
            if self._index is not None:
                added = (created.id, vector) if vector is not None else None
                await self._index.applied(person, generation, added=added)
        if verdict.uncertain and self.same_memory is not None:
            self.same_memory.submit(person, created, verdict.uncertain, epoch)
        linked = {m.id for m in contradicts}
        for decision in verdict.decisions:
            log.info(
                "memory %s stored beside %s, %s: %s",
                created.id,
                decision.existing.id,
                "linked as a possible contradiction" if decision.existing.id in linked else "apart",
                decision.reason,
            )
        fingerprinted = vector is not None
        return Remembered(created, True, None, None, contradicts, fingerprinted, verdict.reason)

    async def own_names(self, person: str) -> frozenset[str]:
        """The names the person gave themself in their memories (`actors.memory.owner`)."""
        return own_names(await self.store.saying(person, NAMING_HINT))

    async def _candidates(
        self, person: str, draft: MemoryDraft, vector: np.ndarray | None
    ) -> list[Candidate]:
        """The memories `draft` may restate: the closest fingerprints, and any verbatim
        copy (which needs no fingerprint, so it is found even when one is missing)."""

        async def read(ids: Iterable[UUID]) -> tuple[Rows, int]:
            found, fingerprints, generation = await self.store.candidates(
                person, ids, draft.text, self.model
            )
            return (found, fingerprints), generation

        hits: list[tuple[UUID, float]] = []
        if vector is None:
            (found, stored), _ = await read(())
        else:
            index = await self.ready()
            hits, (found, stored) = await index.search_then(person, vector, self.candidates, read)
        close = {memory for memory, _ in hits if memory in stored}
        candidates = []
        for memory in found.values():
            if memory.status != "active" or memory.type == SUMMARY:
                continue
            if vector is not None and memory.id in close:
                theirs = decode(stored[memory.id], self.embedder.dim)
                judged = self.judge.judge(draft.text, vector, memory.text, theirs)
                candidates.append(Candidate(memory, judged))
            elif same_text(memory.text, draft.text):
                candidates.append(Candidate(memory, VERBATIM))
        return candidates

    # -- searching ---------------------------------------------------------------------------

    async def search(self, person: str, query: str, limit: int = 5) -> list[Found]:
        """The person's memories that answer `query`, best first, each followed by those
        one link away from it (see `actors.memory.search`). Raises EmbeddingError if the
        query cannot be embedded."""
        vector, named = await asyncio.gather(self.meaning.embed(query), self._named(person, query))
        return await self._found(person, query, vector, named, limit)

    async def search_by(
        self, person: str, query: str, vector: np.ndarray, limit: int = 5
    ) -> list[Found]:
        """`search` with the query's fingerprint already made by `meaning.embed`
        (`bench.search` times the two apart)."""
        return await self._found(person, query, vector, await self._named(person, query), limit)

    async def _named(self, person: str, query: str) -> list[Memory]:
        names = name_words(query)
        return await self.store.named(person, names, NAMED_ROWS) if names else []

    async def _found(
        self, person: str, query: str, vector: np.ndarray, named: list[Memory], limit: int
    ) -> list[Found]:
        index = await self.ready()
        fingerprints, rows = await index.near(
            person,
            vector.reshape(1, -1),
            max(CANDIDATES, 4 * limit),
            [m.id for m in named],
            lambda ids: self.store.found(person, ids),
        )
        candidates = [*rows.values(), *named]
        hits = rank(query, vector, self.meaning, candidates, fingerprints, limit)
        neighbours = await self.store.neighbours(person, [f.memory.id for f in hits])
        return with_neighbours(hits, neighbours)

    # -- gestures (the memories API) -------------------------------------------------------
    #
    # The store does each in one statement (or one transaction). The index takes out what
    # left the active set at once, without a rebuild; what came back (an unmute) it notices
    # by the generation the write moved, and reads on its next look-up.

    async def mute(self, person: str, ids: Sequence[UUID]) -> Changed:
        """Mute the active memories among `ids`: out of search, the model's reach and every
        default list. Raises UnknownMemories (nothing changed) for ids not the person's."""
        changed = await self.store.set_status(person, ids, "muted", only_from="active")
        await self._follow(person, changed)
        self._tell("muted", person, changed, len(ids))
        return changed

    async def unmute(self, person: str, ids: Sequence[UUID]) -> Changed:
        """Make the muted memories among `ids` active again (merged ones are skipped: see
        `consolidation.unmerge`). The index is not told: adding them back needs their
        fingerprints, which it reads on its next look-up since the generation moved."""
        changed = await self.store.set_status(person, ids, "active", only_from="muted")
        self._tell("unmuted", person, changed, len(ids))
        return changed

    async def mark_erroneous(self, person: str, memory_id: UUID, corrected_by: UUID) -> Changed:
        """Settle a contradiction: `memory_id` was wrong, `corrected_by` is right."""
        changed = await self.store.mark_erroneous(person, memory_id, corrected_by, self.clock.now())
        await self._follow(person, changed)
        log.info("memory %s marked erroneous, corrected by %s", memory_id, corrected_by)
        return changed

    async def forget(self, person: str, ids: Sequence[UUID]) -> Changed:
        """Delete memories for good. Raises UnknownMemories (nothing deleted)."""
        changed = await self.store.forget(person, ids)
        await self._follow(person, changed)
        self._tell("forgotten", person, changed, len(ids))
        return changed

    async def cleanup(
        self,
        person: str,
        categories: frozenset[str],
        *,
        everything: bool,
        zone: tzinfo,
        dry_run: bool,
    ) -> Changed:
        """Forget what a clean-up sweep takes (see `storage.memories.Cleanup`), or with
        `dry_run` only say what it would take. `zone` is the person's time zone: it decides
        when an all-day item's day is over."""
        now = self.clock.now()
        sweep = Cleanup(categories, everything, now, now.astimezone(zone).date())
        changed = await self.store.cleanup(person, sweep, dry_run=dry_run)
        if not dry_run:
            await self._follow(person, changed)
            log.info(
                "clean-up sweep of %s (%s, %s): %d memories forgotten",
                person[:8],
                ",".join(sorted(categories)),
                "everything" if everything else "past only",
                len(changed.ids),
            )
        return changed

    async def split(self, person: str, memory_id: UUID, mention: int) -> Split:
        """Make one mention of `memory_id` (a restatement recognised as it) a memory of its
        own, with its own fingerprint and the type, people, themes and times it was said
        with; a mention the judge merged is unmerged. Raises UnknownMemories if the memory
        is not the person's, NoSuchMention if it has no such mention left to split."""
        found = {m.id: m for m in await self.mentions(person, memory_id)}
        said = found.get(mention)
        if said is None or said.split_into is not None:
            raise NoSuchMention(mention)
        if said.new_id is not None:  # a memory muted into this one: unmute it
            reference = await self.store.unmerge(person, said.new_id, self.clock.now())
            if reference is None:
                raise NoSuchMention(mention)
            again = await self.store.get(person, [said.new_id, memory_id])
            self._tell("unmerged", person, Changed([said.new_id], None), 1)
            return Split(again[said.new_id], again[memory_id])
        vector, pending = await self._fingerprint_soon(said.new_text)
        async with self._lock(person):
            done = await self.store.split(
                person,
                mention,
                self.clock.now(),
                fingerprint=encode(vector) if vector is not None else None,
                model=self.model if vector is not None else None,
            )
            if done is None:
                self._fill_later(pending, None)
                raise NoSuchMention(mention)
            new, former, generation = done
            self._fill_later(pending, new.id)
            if self._index is not None:
                added = (new.id, vector) if vector is not None else None
                await self._index.applied(person, generation, added=added)
        log.info("mention %d of %s split out as memory %s", mention, former.id, new.id)
        return Split(new, former)

    async def merge(
        self,
        person: str,
        reference: UUID,
        absorbed: Sequence[tuple[UUID, float, str]],
        *,
        decided_by: str,
        reason: str | None = None,
        epoch: int | None = None,
    ) -> list[UUID]:
        """Mute each `(id, score, tier)` of `absorbed` into `reference` (the judge's and the
        consolidation pass's merges), under the person's lock; the index and a live
        conversation are told they left the active set. Returns the ids muted."""
        async with self._lock(person):
            changed = await self.store.merge(
                person,
                reference,
                absorbed,
                self.clock.now(),
                decided_by=decided_by,
                reason=reason,
                epoch=epoch,
            )
        await self._follow(person, changed)
        return changed.ids

    async def mentions(self, person: str, memory_id: UUID) -> list[Reinforcement]:
        """How `memory_id` was said again: each restatement recognised as it, and each
        memory the judge or the consolidation pass merged into it. Raises UnknownMemories."""
        if not await self.store.get(person, [memory_id]):
            raise UnknownMemories([memory_id])
        return await self.store.mentions(person, memory_id)

    async def _follow(self, person: str, changed: Changed) -> None:
        """`changed.ids` left the active set: take them out of the index, if it is at the
        generation just before (else it is dropped and rebuilt on its next look-up)."""
        if self._index is not None and changed.generation is not None:
            await self._index.applied(person, changed.generation, removed=changed.ids)
        if self.on_withdrawn is not None and changed.ids:
            self.on_withdrawn(person, changed.ids)

    @staticmethod
    def _tell(what: str, person: str, changed: Changed, asked: int) -> None:
        log.info("memories %s for %s: %d of %d asked", what, person[:8], len(changed.ids), asked)

    # -- back-fill ---------------------------------------------------------------------------

    async def backfill(self, batch: int = 64, batches: int = 16) -> int:
        """Make the fingerprints that are missing (failed) or of another model, oldest
        first; return how many were filled. Stops at the first embedder failure."""
        filled = 0
        for _ in range(batches):
            todo = await self.store.unfingerprinted(self.model, batch)
            if not todo:
                break
            try:
                vectors = await self.fingerprint([t.text for t in todo])
            except EmbeddingError as failure:
                log.warning(
                    "fingerprint back-fill failed (%s); %d or more memories still have none",
                    failure.code,
                    len(todo),
                )
                break
            for item, vector in zip(todo, vectors, strict=True):
                filled += await self.store.set_fingerprint(
                    item.id, item.model, encode(vector), self.model
                )
            if len(todo) < batch:
                break
        if filled:
            log.info("fingerprint back-fill: %d memories fingerprinted", filled)
        return filled
