"""A request's query string read alike by the HTTP APIs that take one (memories, admin)."""

from __future__ import annotations

from multidict import MultiDictProxy


class InvalidField(ValueError):
    """A query parameter out of its range: answered 400 `invalid_field` with this message."""


def query_integer(query: MultiDictProxy[str], name: str, low: int, high: int) -> int | None:
    """The whole number `name` from `low` to `high`, None if absent; InvalidField if it is
    anything else (a sign, a fraction, out of range)."""
    raw = query.get(name)
    if raw is None:
        return None
    if not raw.isdecimal() or not low <= int(raw) <= high:
        raise InvalidField(f"{name} must be an integer from {low} to {high}")
    return int(raw)


def query_switch(query: MultiDictProxy[str], name: str) -> bool:
    """`on` or `off` (absent: off); InvalidField if it is anything else."""
    raw = query.get(name, "off")
    if raw not in ("on", "off"):
        raise InvalidField(f"{name} must be on or off")
    return raw == "on"
