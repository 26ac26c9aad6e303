"""What an actor needs from the loop side, bundled so it can be handed over in one piece.

Actors never await: they hand coroutines to the loop with `run` and hear back by message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from random import Random
from typing import TYPE_CHECKING, Any

from actors.clock import Clock
from actors.context_cache import ContextCache
from actors.jobs import Jobs
from actors.metrics import Metrics
from actors.persona import DEFAULT as DEFAULT_PERSONA
from actors.persona import Persona
from actors.pooled import ActorPool
from providers.analysis import Analysis
from providers.chat import ChatModel
from providers.rehearsal_analysis import RehearsalAnalysis
from storage.store import Store

if TYPE_CHECKING:
    from actors.memory.keeper import MemoryKeeper

DEFAULT_INTERRUPT_WORDS = ("stop", "wait", "hold on", "hang on", "shut up", "enough", "pause")
# A reply's pieces this close together share one `reply.delta`. 100 ms is ten updates a
# second, smooth for text and well within what a voice client buffers before speaking; at
# 20 words/s it halves the frames of a paced reply, and cuts the server's CPU per turn by 12
# to 17% against 20 ms (`python -m bench.paced --windows 20ms,100ms`).
DEFAULT_DELTA_WINDOW_S = 0.1
DEFAULT_STORE_TIMEOUT_S = 5.0
DEFAULT_MAX_REPLY_CHARS = 8000


@dataclass(frozen=True, slots=True)
class ContextSettings:
    """How much context a turn gets, and how long each source may take."""

    budget_chars: int = 6000
    source_timeout_s: float = 0.5
    conversations: int = 5  # recent conversations listed
    exchange_turns: int = 6  # last turns of the most recent one, word for word
    turn_chars: int = 300  # a longer turn is shortened
    memory_chars: int = 240  # a longer memory is shortened
    recent_days: float = 3.0  # "mentioned in recent days"
    per_layer: int = 40  # memories read per layer, before the budget
    cache_s: float = 60.0  # reads kept while nothing changed, at most this long (0: off)


@dataclass(frozen=True, slots=True)
class ConversationSettings:
    window_turns: int = 40
    resume_window_s: float = 30 * 60
    speaker_reset_s: float = 30 * 60
    park_after_s: float = 10 * 60
    actor_idle_s: float = 60.0  # an actor with nothing to do this long is deactivated; 0: never
    retry_pause_s: float = 0.5
    # Longest a say waits to be stored (its turn in line, the writes before it, its own):
    # past it, PostgreSQL is taken as unavailable and the say is answered so.
    store_timeout_s: float = DEFAULT_STORE_TIMEOUT_S
    max_tool_rounds: int = 4
    # Longer, a reply is cut and ends with error `too_long`: a model that never stops must
    # not stream for ever, nor fill the record. Far above a spoken answer's length.
    max_reply_chars: int = DEFAULT_MAX_REPLY_CHARS
    delta_window_s: float = DEFAULT_DELTA_WINDOW_S
    echo_guard: bool = True  # hold back and cut a reply's opening repetition (actors/echo.py)
    interrupt_words: tuple[str, ...] = DEFAULT_INTERRUPT_WORDS
    reply_matching: bool = True  # match says and note loose ends (actors/replies.py)
    reply_candidates: int = 8  # assistant messages a say may be matched to (actors/replies.py)
    reply_horizon_s: float = 2 * 24 * 3600  # older ones are no candidates
    follow_ons: str = "auto"  # after a lull: auto (the persona decides), always or off
    context: ContextSettings = field(default_factory=ContextSettings)


@dataclass(slots=True)
class Runtime:
    loop: asyncio.AbstractEventLoop
    store: Store
    model: ChatModel
    clock: Clock
    settings: ConversationSettings = field(default_factory=ConversationSettings)
    jobs: Jobs = field(default_factory=Jobs)  # the actors' jobs on the loop
    metrics: Metrics = field(default_factory=Metrics)  # one registry per server
    memory: MemoryKeeper | None = None  # long-term memory; None: the tools say so
    analysis: Analysis = field(default_factory=RehearsalAnalysis)  # judgement questions
    persona: Persona = DEFAULT_PERSONA  # decides follow-ons (actors/persona.py)
    random: Random = field(default_factory=Random)  # their draw; seedable
    actor_pool: ActorPool | None = None  # serves the conversation actors; None: a thread each
    context_cache: ContextCache = field(init=False)  # sized by settings.context.cache_s

    def __post_init__(self) -> None:
        self.context_cache = ContextCache(self.settings.context.cache_s)

    def run(self, job: Coroutine[Any, Any, Any], what: str) -> None:
        """Start `job` as a task on the loop, from any thread; a failure is logged, never lost.

        Not `run_coroutine_threadsafe`: the concurrent future it adds (a lock, a condition,
        and callbacks chaining it to the task) serves a caller that waits, and an actor
        never does; it hears of the outcome by message."""
        self.loop.call_soon_threadsafe(self.jobs.start, job, what)

    async def settle(self, timeout: float) -> None:
        """On shutdown: let running jobs finish (turns store what they sent), then cancel
        what is left after `timeout`."""
        await asyncio.sleep(0)  # jobs asked for before now are started by then
        await self.jobs.settle(timeout)

    def call(self, fn: Any, *args: Any) -> None:
        """Run a plain callable on the loop (thread-safe), e.g. to resolve a future."""
        self.loop.call_soon_threadsafe(fn, *args)


class ActorFailed(Exception):
    """The actor failed while handling a request; the supervisor replaces it."""


class Reply:
    """A one-shot answer from an actor to a coroutine on the loop.

    The actor resolves it from its own thread; the loop awaits it without blocking.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: asyncio.Future[Any] = loop.create_future()

    def resolve(self, value: Any) -> None:
        self._loop.call_soon_threadsafe(self._set, value)

    def resolve_here(self, value: Any) -> None:
        """`resolve` for a caller on the loop itself: no hop through the loop's queue."""
        self._set(value)

    def fail(self, error: BaseException) -> None:
        self._loop.call_soon_threadsafe(self._set_error, error)

    def _set(self, value: Any) -> None:
        if not self._future.done():
            self._future.set_result(value)

    def _set_error(self, error: BaseException) -> None:
        if not self._future.done():
            self._future.set_exception(error)

    async def wait(self, timeout: float = 30.0) -> Any:
        return await asyncio.wait_for(self._future, timeout)
