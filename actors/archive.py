"""Ending a conversation: mark it archived, then have the model write its summary.

The conversation table is the record; the summary is an index for later search.
"""

from __future__ import annotations

import logging
from uuid import UUID

from actors.memory.keeper import SUMMARY
from actors.runtime import Runtime
from providers.chat import ChatMessage, ModelError, TextDelta
from providers.notes import SUMMARY_PROMPT
from storage.records import MemoryDraft, Turn

log = logging.getLogger("stillhere.archive")


async def archive(rt: Runtime, conversation: UUID, reason: str, person: str, epoch: int) -> bool:
    """Archive and summarise, as the person's owner under `epoch`; False if someone else
    archived it first."""
    if not await mark_archived(rt, conversation, reason, person, epoch):
        return False
    await write_summary(rt, conversation, reason)
    return True


async def mark_archived(
    rt: Runtime, conversation: UUID, reason: str, person: str, epoch: int
) -> bool:
    """The ending itself, without the summary; False if someone else archived it first."""
    if not await rt.store.archive(conversation, reason, rt.clock.now(), person, epoch):
        return False
    rt.metrics.archives.labels(reason=reason).inc()
    return True


async def write_summary(rt: Runtime, conversation: UUID, reason: str) -> None:
    """Summarise an archived conversation onto its row."""
    turns = await rt.store.all_turns(conversation)
    summary = await summarise(rt, turns)
    await rt.store.set_summary(conversation, summary)
    if rt.memory is not None and turns:  # findable by meaning weeks later
        person = await rt.store.conversation_person(conversation)
        draft = MemoryDraft(summary, SUMMARY)
        await rt.memory.remember(person, draft, conversation=conversation)
    log.info("archived conversation %s (%s), %d turns", str(conversation)[:8], reason, len(turns))


def transcript(turns: list[Turn]) -> str:
    return "\n".join(f"{'You' if t.role == 'user' else 'Me'}: {t.text}" for t in turns)


async def summarise(rt: Runtime, turns: list[Turn]) -> str:
    if not turns:
        return "An empty conversation."
    messages = [
        ChatMessage("system", SUMMARY_PROMPT),
        ChatMessage("user", transcript(turns)),
    ]
    try:
        parts = [e.text async for e in rt.model.stream(messages, []) if isinstance(e, TextDelta)]
    except ModelError as failure:
        log.warning("summary failed (%s); keeping a plain one", failure.code)
        parts = []
    return "".join(parts).strip() or _plain_summary(turns)


def _plain_summary(turns: list[Turn]) -> str:
    first = next((t.text for t in turns if t.role == "user"), turns[0].text)
    return f"{len(turns)} turns, beginning with: {first[:120]}"
