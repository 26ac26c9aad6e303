"""The rehearsal model: a deterministic stand-in for a real chat model.

Tests, benchmarks and a first run without any provider configured all need a model that
answers at once, the same way every time, and that makes what it was handed visible: which
messages were new, what it said just before, which notes the turn added. It recognises a few
phrasings and calls the matching tool, so the tool path can be exercised end to end, and it
can tell a long story, so a reply can be interrupted mid-stream.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from providers.chat import ChatEvent, ChatMessage, TextDelta, ToolCall, ToolSpec
from providers.notes import (
    CUT_MARK,
    FOLLOW_ON,
    LOOSE_ENDS,
    NOTE_DURING_REPLY,
    NOTE_INTERRUPTED,
    REPLY_ASK,
    REPLY_CONTEXT,
    SUMMARY_PROMPT,
)

PREFIX = "[rehearsal] "
STORY_SENTENCES = 12  # 12 sentences of 8+ words: comfortably over 60 words
QUOTE_CHARS = 80
SUMMARY_QUOTE_CHARS = 60

_TRAILING = ".!?,;: \t"
_LEAD = r"^(?:(?:and|also|ok|okay),?\s+)?"
_END = r"[.!?,;:\s]*$"
_APOS = "['\u2019]"  # voice transcripts often write a curly apostrophe
_NAME = r"([^\W\d_][\w'-]*)"
_FLAGS = re.IGNORECASE | re.DOTALL
_QUOTED = re.compile(r'"[^"]*"')
_SENTENCE_END = re.compile(r"""[.!?]+["'\u201d)]* """)  # stops, closing quotes, a space

_REMEMBER = re.compile(_LEAD + r"(?:(?:note|remember)\s+that|remember)\s+(.+?)" + _END, _FLAGS)
_REMIND = re.compile(_LEAD + r"remind\s+me\s+to\s+(.+?)" + _END, _FLAGS)
_RECALL = re.compile(
    _LEAD + r"(?:what\s+do\s+you\s+(?:know|remember)\s+about|do\s+you\s+remember)\s+(.+?)" + _END,
    _FLAGS,
)
_PAGE = re.compile(_LEAD + r"show\s+me\s+a\s+page\s+(?:about|on)\s+(.+?)" + _END, _FLAGS)
_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)
_WHEN = re.compile(r"\s(?:on|at|by|next)\s|\s(?:tomorrow|tonight)\b", re.IGNORECASE)
_GREETING = r"^(?:(?:hi|hello|hey)[,!]?\s+)?"
_SPEAKER_EXPLICIT = (
    re.compile(_GREETING + r"this\s+is\s+" + _NAME + r"\s+speaking" + _END, _FLAGS),
    re.compile(_GREETING + _NAME + r"\s+speaking" + _END, _FLAGS),
    re.compile(_GREETING + rf"it{_APOS}?s\s+" + _NAME + r"\s+here" + _END, _FLAGS),
)
# Bare "this is X" only counts when X is capitalised, so "this is great" names nobody.
_SPEAKER_BARE = re.compile(_GREETING + r"this\s+is\s+" + _NAME + _END, _FLAGS)
_OWNER_BACK = re.compile(
    rf"^(?:it{_APOS}?s\s+me(?:\s+again)?|(?:i{_APOS}?m\s+)?back\s+to\s+the\s+owner)" + _END, _FLAGS
)
_NOT_NAMES = frozenset({"me", "i", "who", "who's", "whos", "it", "this", "that", "nobody"})
# "ask me: how was your weekend?": the reply is that question, so a first run can set up
# the questions a later say answers.
_ASK_ME = re.compile(_LEAD + r"ask\s+me\s*:\s*(.+?\?)\s*$", _FLAGS)
_UNCLEAR = re.compile(r"could answer (.+?)\. " + re.escape(REPLY_ASK))
_STORY = re.compile(
    r"^(?:please\s+)?(?:tell\s+me\s+(?:a\s+story(?:\s+about\s+(.+?))?|about\s+(.+?))"
    r"|talk\s+about\s+(.+?))(?:,?\s+please)?" + _END,
    _FLAGS,
)


@dataclass(frozen=True, slots=True)
class _Intent:
    """A tool the last user message asks for, before it gets its id."""

    name: str
    arguments: dict[str, Any]


def _clean(text: str) -> str:
    """Tool arguments lose the sentence's trailing punctuation: "Thursday." is "Thursday"."""
    return text.strip().rstrip(_TRAILING).strip()


def _remember(text: str) -> _Intent | None:
    match = _REMEMBER.match(text)
    if match is None:
        return None
    return _Intent("remember", {"text": _clean(match.group(1)), "kind": "fact"})


def _remind(text: str) -> _Intent | None:
    """Split "remind me to <text> <when>" where <when> starts at its first time word."""
    match = _REMIND.match(text)
    if match is None:
        return None
    body = _clean(match.group(1))
    when = _WHEN.search(body)
    if when is None:
        return _Intent("schedule_reminder", {"text": body, "when": "unspecified"})
    return _Intent(
        "schedule_reminder",
        {"text": body[: when.start()].strip(), "when": body[when.start() :].strip()},
    )


def _page(text: str) -> _Intent | None:
    """ "Show me a page about the Bristol weather": a page (never a memory), titled with the
    topic's last three words at most (no leading article), as the tool wants a short title."""
    match = _PAGE.match(text)
    if match is None:
        return None
    topic = _clean(match.group(1))
    title = " ".join(_ARTICLE.sub("", topic).split()[-3:])
    body = f"A page about {topic}, to read now; shown by the rehearsal model, never remembered."
    return _Intent("show_page", {"title": title[:1].upper() + title[1:], "body": body})


def _recall(text: str) -> _Intent | None:
    """ "What do you know about Owen?": a search of the person's memories."""
    match = _RECALL.match(text)
    if match is None:
        return None
    return _Intent("search_memories", {"query": _clean(match.group(1))})


def _speaker(text: str) -> _Intent | None:
    """A lent phone: "this is Anna", "Anna speaking", "it's Anna here"; "it's me again"."""
    if text.rstrip().endswith("?"):
        return None  # "who's speaking?" asks, it does not tell
    if _OWNER_BACK.match(text):
        return _Intent("set_speaker", {"name": ""})
    for pattern in _SPEAKER_EXPLICIT:
        match = pattern.match(text)
        if match and match.group(1).lower() not in _NOT_NAMES:
            return _Intent("set_speaker", {"name": match.group(1)})
    bare = _SPEAKER_BARE.match(text)
    if bare and bare.group(1)[0].isupper() and bare.group(1).lower() not in _NOT_NAMES:
        return _Intent("set_speaker", {"name": bare.group(1)})
    return None


_RECOGNISERS: tuple[Callable[[str], _Intent | None], ...] = (
    _page,
    _remind,
    _remember,
    _recall,
    _speaker,
)


def _intent(text: str, offered: set[str]) -> _Intent | None:
    """The first recognised phrasing whose tool is offered; unoffered tools are never called."""
    for recognise in _RECOGNISERS:
        intent = recognise(text)
        if intent is not None and intent.name in offered:
            return intent
    return None


def _story(text: str) -> str | None:
    """A long reply on request, so that tests can cut a reply off mid-stream."""
    match = _STORY.match(text)
    if match is None:
        return None
    topic = _clean(next((g for g in match.groups() if g), "")) or "nothing in particular"
    return " ".join(
        f"Sentence {i} of the story about {topic}, told slowly and at length."
        for i in range(1, STORY_SENTENCES + 1)
    )


def _question(text: str) -> str | None:
    match = _ASK_ME.match(text)
    if match is None:
        return None
    question = match.group(1).strip()
    return question[:1].upper() + question[1:]


def _reply_context(messages: list[ChatMessage]) -> str | None:
    """The body of the turn's reply-matching note, if it has one."""
    note = next(
        (m.content for m in messages if m.role == "system" and m.content.startswith(REPLY_CONTEXT)),
        None,
    )
    return None if note is None else " ".join(note.splitlines()[1:])


def _clarify(note: str) -> str | None:
    """The one question asked when a say could answer several of ours."""
    unclear = _UNCLEAR.search(note)
    if unclear is None:
        return None
    return f"{PREFIX}Sorry, which did you mean: {unclear.group(1)}?"


def _follow_on(messages: list[ChatMessage]) -> str:
    """A follow-on picks up the first loose end or open thread it was handed, by its words."""
    note = next(
        (m.content for m in messages if m.role == "system" and m.content.startswith(LOOSE_ENDS)),
        "",
    )
    picked = _QUOTED.search(note)
    if picked is None:
        return f"{PREFIX}One more thing: I enjoyed this. Talk soon!"
    return f"{PREFIX}One more thing, about {picked.group(0)}: tell me more when you like."


def _new_start(messages: list[ChatMessage]) -> int:
    """Index of the trailing run of user messages: the turn's new messages."""
    start = len(messages)
    while start > 0 and messages[start - 1].role == "user":
        start -= 1
    return start


def _has_note(messages: list[ChatMessage], note: str) -> bool:
    return any(m.role == "system" and note in m.content for m in messages)


def _quote(text: str, limit: int = QUOTE_CHARS) -> str:
    """The start of `text` on one line, "…" when cut: all of it within `limit` characters,
    else its first sentence if that fits, else whole words up to `limit` (a first word
    longer than that is cut inside)."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    first = _SENTENCE_END.search(line)
    if first is not None and first.end() - 1 <= limit:
        words = line[: first.end() - 1]
    elif " " in line[: limit + 1]:
        words = line[: limit + 1].rsplit(" ", 1)[0]
    else:
        words = line[:limit]
    return (words.rstrip(_TRAILING) or words) + "…"


def _said(message: ChatMessage) -> str:
    """What an assistant message said, without the cut mark or the rehearsal's label."""
    return message.content.replace(CUT_MARK, "").strip().removeprefix(PREFIX).strip()


def _echo(messages: list[ChatMessage], start: int) -> str:
    """The everyday reply: say back what the model was handed, so tests can read it. Asked
    again with an instruction after the talk (an echo cut), the says are the ones before it;
    a quote is never empty: with nothing to quote, the sentence is left out."""
    while start == len(messages) and messages and messages[-1].role == "system":
        messages = messages[:-1]
        start = _new_start(messages)
    new, before = messages[start:], messages[:start]
    parts = [PREFIX.strip()]
    if new and new[-1].content.strip():
        parts.append(f'You said "{new[-1].content.strip()}".')
    said = (_said(m) for m in reversed(before) if m.role == "assistant")
    previous = next((text for text in said if text), "")
    if previous:
        parts.append(f'Just before, I said: "{_quote(previous)}".')
    if len(new) > 1:
        during = " while I was writing" if _has_note(messages, NOTE_DURING_REPLY) else ""
        parts.append(f"You sent {len(new)} messages{during}.")
    if _has_note(messages, NOTE_INTERRUPTED):
        parts.append("I know I was interrupted.")
    note = _reply_context(messages)
    if note:
        parts.append(f"[{note}]")
    earlier = sum(1 for m in before if m.role in ("user", "assistant"))
    parts.append(f"({earlier} earlier turns in view.)")
    return " ".join(parts)


def _confirm(call: ToolCall, result: str) -> str:
    """One sentence per executed tool call, for the round after the tool results."""
    args = call.arguments
    if call.name == "search_memories":
        return _recalled(result)
    if call.name == "remember":
        return f"Noted: {_clean(str(args.get('text', '')))}."
    if call.name == "schedule_reminder":
        text, when = _clean(str(args.get("text", ""))), _clean(str(args.get("when", "")))
        return f"I'll remind you to {text} ({when or 'unspecified'})."
    if call.name == "show_page":
        return f"Here is a page: {_clean(str(args.get('title', '')))}."
    if call.name == "set_speaker":
        name = str(args.get("name") or "").strip()
        if not name:
            return "Back to the owner."
        return f"Hello {name}, I'll keep in mind it's you speaking."
    return f"Done: {call.name}."


def _confirmation(messages: list[ChatMessage]) -> str:
    asked = next((m for m in reversed(messages) if m.role == "assistant" and m.tool_calls), None)
    calls = asked.tool_calls if asked is not None else []
    results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    return " ".join(_confirm(c, results.get(c.id, "")) for c in calls) or "Done."


def _recalled(result: str) -> str:
    """What a memory search found, said plainly: each memory's text, as the tool gave it."""
    try:
        found = orjson.loads(result).get("results") or []
    except (orjson.JSONDecodeError, AttributeError):
        found = []
    texts = [str(r.get("text", "")) for r in found if isinstance(r, dict)]
    if not texts:
        return "I don't know anything about that yet."
    return "Here is what I remember: " + " ".join(texts)


def _summary(messages: list[ChatMessage]) -> str:
    """A summary from the transcript the archive hands over as `You: ...`/`Me: ...` lines."""
    transcript = next((m.content for m in reversed(messages) if m.role == "user"), "")
    lines = [line.strip() for line in transcript.splitlines()]
    spoken = [line for line in lines if line.startswith(("You:", "Me:"))]
    first = next((line[4:].strip() for line in spoken if line.startswith("You:")), "")
    began = f' It began with "{_quote(first, SUMMARY_QUOTE_CHARS)}".' if first else ""
    return f"Summary: {len(spoken)} turns.{began}"


def _is_summary_request(messages: list[ChatMessage]) -> bool:
    first = messages[0] if messages else None
    return first is not None and first.role == "system" and first.content == SUMMARY_PROMPT


def _answer(messages: list[ChatMessage], tools: list[ToolSpec]) -> str | _Intent:
    """Decide the whole reply up front: a text, or one tool call."""
    if messages and messages[-1].role == "tool":
        return _confirmation(messages)
    if _is_summary_request(messages):
        return _summary(messages)
    start = _new_start(messages)
    last = messages[-1].content.strip() if start < len(messages) else ""
    intent = _intent(last, {t.name for t in tools})
    if intent is not None:
        return intent
    if _has_note(messages, FOLLOW_ON):
        return _follow_on(messages)
    note = _reply_context(messages)
    asked = _clarify(note) if note else None
    return asked or _question(last) or _story(last) or _echo(messages, start)


def _words(text: str) -> Iterator[str]:
    """One delta per word with its trailing space, like a model streaming tokens."""
    return (m.group(0) for m in re.finditer(r"\S+\s*", text))


class RehearsalModel:
    """The built-in model: deterministic answers, optionally paced like a real one."""

    label = "rehearsal (built-in, not a real model)"

    def __init__(self, *, latency: float = 0.0, tokens_per_s: float = 0.0) -> None:
        if latency < 0 or tokens_per_s < 0:
            raise ValueError("latency and tokens_per_s must not be negative")
        self.latency = latency
        self.tokens_per_s = tokens_per_s

    async def stream(
        self, messages: list[ChatMessage], tools: list[ToolSpec]
    ) -> AsyncGenerator[ChatEvent, None]:
        answer = _answer(messages, tools)
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        if isinstance(answer, _Intent):
            yield ToolCall("rehearsal-1", answer.name, dict(answer.arguments))
            return
        pause = 1 / self.tokens_per_s if self.tokens_per_s > 0 else 0.0
        loop = asyncio.get_running_loop()
        start = loop.time()
        for index, word in enumerate(_words(answer)):
            # Paced by the clock, as a remote model is: when our loop runs late, the words
            # due meanwhile come together (they would be waiting in the socket), instead of
            # every word coming a pause after the late one. Without pacing, still yield to
            # the loop between words (sleep(0) takes no time, and reads no clock), so an
            # interrupt can land mid-reply, as it can with a real model.
            if index and not pause:
                await asyncio.sleep(0)
            elif index and (wait := start + index * pause - loop.time()) > 0:
                await asyncio.sleep(wait)
            yield TextDelta(word)

    async def close(self) -> None:
        """Nothing to release: the rehearsal model holds no connection."""
