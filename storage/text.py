"""What a text must be to be stored, and a refusal that says which rule it broke.

PostgreSQL's text columns refuse the NUL character (U+0000) outright, so a text holding one
is refused before it reaches the database (a search's query too: it is matched against
stored text), and the refusal names it: "must be a non-empty string" for a string that is
one is no help to whoever has to fix the client.
"""

from __future__ import annotations

NUL = "\x00"


def text_fault(value: object, field: str, *, blank_ok: bool = False) -> str | None:
    """Why `value` cannot be stored as the text `field`, in plain words; None if it can.
    A text of only whitespace is refused unless `blank_ok` (ids, names)."""
    if value is None:
        return f"{field} is missing"
    if not isinstance(value, str):
        return f"{field} must be a string, not {_kind(value)}"
    if not value or (not blank_ok and not value.strip()):
        return f"{field} is empty" if not value else f"{field} holds only whitespace"
    if NUL in value:
        where = value.index(NUL)
        return f"{field} holds a NUL character (U+0000) at {where}, which no text here may hold"
    return None


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
