"""The consolidation pass: near-duplicates already stored are muted into one reference.

Recognition only compares a new memory with what exists; duplicates stored before it
worked (or while a fingerprint was missing) stay. This pass compares what exists with
itself, with the same rule (`recognise`: the tiers, then the guards), and for each group
keeps the most complete memory as the reference: the longest text, then the most people
and themes, then the earliest. The others are muted into it (a `merged_into` link; the
reference takes their mention counts) and traced. Nothing is deleted: `unmerge` undoes a
merge, and the two are then kept apart for good (a `distinct` link).

Groups are stars, not chains: every memory muted is recognised by the reference itself and
agrees with every other memory of its group, so "trip in May" cannot glue "trip to Lisbon
in May" and "trip to Porto in May" together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from uuid import UUID

from actors.memory.guards import guard
from actors.memory.keeper import MemoryKeeper
from actors.memory.recognition import Candidate, recognise
from storage.records import Memory

log = logging.getLogger("stillhere.memory")


@dataclass(frozen=True, slots=True)
class Merge:
    reference: UUID
    muted: tuple[UUID, ...]


@dataclass(slots=True)
class Report:
    persons: int = 0
    merges: list[Merge] = field(default_factory=list)
    fingerprints_filled: int = 0

    @property
    def muted(self) -> int:
        return sum(len(m.muted) for m in self.merges)

    def wire(self) -> dict[str, object]:
        return {
            "persons": self.persons,
            "groups": len(self.merges),
            "muted": self.muted,
            "fingerprints_filled": self.fingerprints_filled,
        }


def completeness(memory: Memory) -> tuple[int, int, float]:
    """Sort key, most complete first: longest text, most people and themes, earliest."""
    return (
        -len(memory.text),
        -(len(memory.people) + len(memory.themes)),
        memory.first_mentioned.timestamp(),
    )


async def consolidate(keeper: MemoryKeeper, person: str) -> list[Merge]:
    """Mute the person's near-duplicates into their references; return what was merged."""
    store = keeper.store
    generation = await store.generation(person)
    index = await keeper.ready()
    pairs = await index.neighbours(person, keeper.candidates, keeper.judge.floor)
    ids = {x for a, b, _ in pairs for x in (a, b)}
    memories = await store.get(person, ids)
    vectors = await store.fingerprints_of(person, ids, keeper.model, keeper.embedder.dim)
    apart = {
        frozenset((link.source, link.target))
        for link in await store.links(person, memories)
        if link.kind in ("distinct", "contradicts")
    }
    me = await keeper.own_names(person)
    edges: dict[UUID, dict[UUID, tuple[float, str]]] = {}
    for a, b, _ in pairs:
        first, second = memories.get(a), memories.get(b)
        if first is None or second is None or frozenset((a, b)) in apart:
            continue
        if first.status != "active" or second.status != "active":
            continue
        if a not in vectors or b not in vectors:
            continue  # re-fingerprinted meanwhile: the next pass sees it
        judged = keeper.judge.judge(first.text, vectors[a], second.text, vectors[b])
        # Decided as recognition decides a new memory: tiers, the guards, the one-word swap.
        match = recognise(first.draft, [Candidate(second, judged)], me).match
        if match is None:
            continue
        edges.setdefault(a, {})[b] = (match.score, match.tier)
        edges.setdefault(b, {})[a] = (match.score, match.tier)
    merges: list[Merge] = []
    taken: set[UUID] = set()
    for reference in sorted((memories[m] for m in edges), key=completeness):
        if reference.id in taken:
            continue
        group: list[tuple[Memory, float, str]] = []
        near = sorted(edges[reference.id].items(), key=lambda item: -item[1][0])
        for other, (score, found) in near:
            member = memories[other]
            if other in taken or any(guard(member.draft, g.draft, me) for g, _, _ in group):
                continue
            group.append((member, score, found))
        if not group:
            continue
        absorbed = [(m.id, score, found) for m, score, found in group]
        muted = await keeper.merge(person, reference.id, absorbed, decided_by="consolidation")
        if not muted:
            continue
        taken.update([reference.id, *muted])
        merges.append(Merge(reference.id, tuple(muted)))
        for m, score, found in group:
            if m.id in muted:
                log.info(
                    "consolidation: memory %s muted into %s (tier %s, score %.3f)",
                    m.id,
                    reference.id,
                    found,
                    score,
                )
    # The generation read before the pass: the pass's own merges make the person look
    # changed once more, and the next pass finds nothing left to do.
    await store.mark_consolidated(person, generation)
    return merges


async def unmerge(keeper: MemoryKeeper, person: str, muted: UUID) -> UUID | None:
    """Undo one merge: `muted` is active again; returns the reference it had gone into."""
    reference = await keeper.store.unmerge(person, muted, keeper.clock.now())
    if reference is not None:
        log.info("consolidation undone: memory %s taken back out of %s", muted, reference)
    return reference


async def maintain(keeper: MemoryKeeper, *, everyone: bool = False) -> Report:
    """The periodic pass: fill missing fingerprints, then consolidate every person whose
    memories changed since their last pass (or everyone). Among several nodes each part
    runs on one node at a time (`storage.passes`): what another node is doing is skipped,
    and a person another node consolidated since the list was read is left alone."""
    store = keeper.store
    report = Report()
    async with store.claim("backfill") as mine:
        if mine:
            report.fingerprints_filled = await keeper.backfill()
    if everyone:
        persons = await store.persons()
    else:
        persons = [p for p, _ in await store.dirty_persons()]
    for person in persons:
        async with store.claim("consolidation", person) as mine:
            if not mine or not (everyone or await store.dirty(person)):
                continue
            report.merges.extend(await consolidate(keeper, person))
            report.persons += 1
    if report.merges or report.fingerprints_filled:
        log.info(
            "memory pass: %d persons looked at, %d duplicates muted into %d references, "
            "%d fingerprints filled in",
            report.persons,
            report.muted,
            len(report.merges),
            report.fingerprints_filled,
        )
    return report


async def scheduled_pass(keeper: MemoryKeeper) -> dict[str, object]:
    """The pass as the supervisor's sweep runs it: never raises (a failed pass is logged
    and tried again at the next sweep), answers a line for the sweep's report."""
    try:
        return (await maintain(keeper)).wire()
    except Exception as error:
        log.exception("memory pass failed; it runs again at the next sweep")
        return {"error": repr(error)}
