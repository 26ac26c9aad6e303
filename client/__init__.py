"""The reference client: a phone app speaking protocol v1 over WebSocket or SSE + POST."""

from client.backoff import Backoff
from client.links import HeldConnection, Refused
from client.phone import LinkState, Phone

__all__ = ["Backoff", "HeldConnection", "LinkState", "Phone", "Refused"]
