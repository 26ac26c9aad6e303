"""The threading actor of the supervisor, and of conversations with `--actor-threads 0`:
pykka's, with a lighter inbox (conversations are otherwise served by a pool, pooled.py).

pykka's `ThreadingActor` gives each actor a `queue.Queue`, whose `put` and `get` go through
a Python-level condition: about ten calls a message on the loop's side for every `tell`, and
as many on the actor's thread for every wake-up. `queue.SimpleQueue` is all that pykka's
`ActorInbox` asks for (an unbounded FIFO: `put`, a blocking `get`, `empty`) and does it in C.
"""

from __future__ import annotations

import queue
from typing import Any, Protocol

import pykka


class ThreadingActor(pykka.ThreadingActor):
    @staticmethod
    def _create_actor_inbox() -> queue.SimpleQueue[Any]:
        return queue.SimpleQueue()


class Mailbox(Protocol):
    """Anything that delivers a message to a conversation's current actor."""

    def tell(self, message: object) -> bool: ...
