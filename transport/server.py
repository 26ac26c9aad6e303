"""What every request handler reaches: the parts of one running server."""

from __future__ import annotations

from dataclasses import dataclass, field
from weakref import WeakSet

import pykka
from aiohttp import web

from actors.directory import Directory
from actors.runtime import Runtime
from actors.supervisor import Supervisor
from transport.config import Settings
from transport.identity import Identity


@dataclass(slots=True)
class Server:
    settings: Settings
    runtime: Runtime
    identity: Identity
    directory: Directory
    supervisor: pykka.ActorRef[Supervisor]
    sockets: WeakSet[web.WebSocketResponse] = field(default_factory=WeakSet)


SERVER_KEY = web.AppKey("stillhere.server", Server)
