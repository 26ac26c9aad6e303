"""The memories API: a person's gestures on their long-term memory, over HTTP.

See docs/memories.md. Credentials are the protocol's (`credentials`: a device secret or an
account token, in a header, the body or the query), and every operation is scoped to the
person they name: an id of another person's memory is answered exactly like an id that does
not exist, so the API never even tells that it exists. Bad input is refused with a stable
`code` before anything changes; the store does each gesture in one statement (or, for the
few that touch two rows, one transaction), so a refused gesture has changed nothing.

Bodies are read here rather than with `request.read()`: a bulk gesture of 10,000 ids is
about 400 kB, over what a protocol frame may be.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from aiohttp import web
from multidict import MultiDictProxy

from actors.memory.consolidation import unmerge
from actors.memory.keeper import MemoryKeeper, NoSuchMention
from actors.memory.search import BadQuery, query_limit, query_text
from actors.tools import BadArgument, memory_draft
from providers.embedding import EmbeddingError
from storage.memories import (
    CLEANUP_CATEGORIES,
    ErroneousCorrector,
    Listing,
    UnknownMemories,
)
from storage.records import MEMORY_STATUSES, Memory, MemoryDraft
from storage.text import text_fault
from transport.config import Limits
from transport.errors import error_response
from transport.identity import Unauthorized
from transport.query import InvalidField, query_integer
from transport.server import SERVER_KEY, Server
from transport.sse import credentials, dumps

log = logging.getLogger("stillhere.memories")

MAX_BODY_BYTES = 1 << 20  # room for BULK_MAX_IDS ids and then some
BULK_MAX_IDS = 20_000
LIST_LIMIT = 50
LIST_MAX = 500
CONFIRM_FORGET = "forget"
CONFIRM_CLEANUP = "cleanup"
BULK_ACTIONS = ("mute", "unmute", "forget")
SCOPES = ("past", "all")
MAX_NAMES = 32  # people or themes of one memory
MAX_NAME_CHARS = 100
MAX_FILTER_CHARS = 1000
SEARCH_LIMIT = 10
SEARCH_MAX = 50
MAX_OFFSET = 1_000_000_000  # past any person's memories, and within PostgreSQL's bigint
_TYPE = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


class Refusal(Exception):
    """A gesture refused: its HTTP status, stable code, message, and any extra fields."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


def invalid(message: str) -> Refusal:
    return Refusal(400, "invalid_field", message)


def unknown(ids: Iterable[object]) -> Refusal:
    """The one answer for an id that is nobody's, another person's, or not an id at all."""
    return Refusal(404, "unknown_memory", "no such memory", ids=[str(i) for i in ids])


def unconfirmed(word: str) -> Refusal:
    return Refusal(
        400,
        "confirmation_required",
        f'this cannot be undone: confirm it with "confirm": "{word}"',
    )


@dataclass(frozen=True, slots=True)
class Gesture:
    """One request, identified: whose memory, through which keeper, with what body."""

    request: web.Request
    keeper: MemoryKeeper
    person: str
    body: dict[str, Any]
    limits: Limits


Answer = tuple[int, dict[str, Any]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


PersonAct = Callable[[web.Request, Server, str, dict[str, Any]], Awaitable[Answer]]


def person_handler(act: PersonAct) -> Handler:
    """Read the body, identify the person, run `act`, and turn every refusal into an error
    object with its status. The body comes first because it may carry the credentials."""

    @functools.wraps(act)
    async def handle(request: web.Request) -> web.StreamResponse:
        server = request.app[SERVER_KEY]
        try:
            body = await read_body(request)
            person = server.identity.person(**credentials(request, body))
            status, answer = await act(request, server, person, body)
        except Unauthorized as refused:
            return error_response(refused.status, refused.code, str(refused))
        except UnknownMemories as missing:
            return refusal_response(unknown(missing.ids))
        except Refusal as refusal:
            return refusal_response(refusal)
        except InvalidField as wrong:
            return refusal_response(invalid(str(wrong)))
        return web.json_response(answer, status=status, dumps=dumps)

    return handle


def gesture(act: Callable[[Gesture], Awaitable[Answer]]) -> Handler:
    """A memories endpoint: `act` gets the person's memory keeper with the request."""

    @functools.wraps(act)
    async def with_keeper(
        request: web.Request, server: Server, person: str, body: dict[str, Any]
    ) -> Answer:
        keeper = server.runtime.memory
        if keeper is None:
            raise Refusal(503, "memory_unavailable", "this server keeps no memories")
        return await act(Gesture(request, keeper, person, body, server.settings.limits))

    return person_handler(with_keeper)


def refusal_response(refusal: Refusal) -> web.Response:
    return error_response(refusal.status, refusal.code, refusal.message, **refusal.extra)


async def read_body(request: web.Request) -> dict[str, Any]:
    """The JSON object in the body, `{}` if there is none."""
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise _too_large()
    raw = bytearray()
    async for chunk in request.content.iter_any():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise _too_large()
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise Refusal(400, "bad_json", "the body must be one JSON object") from None
    if not isinstance(body, dict):
        raise Refusal(400, "bad_json", "the body must be one JSON object")
    return body


def _too_large() -> Refusal:
    return Refusal(413, "body_too_large", f"the body is limited to {MAX_BODY_BYTES} bytes")


# -- routes ----------------------------------------------------------------------------------


def add_routes(router: web.UrlDispatcher) -> None:
    """The fixed paths first, so `bulk` and `cleanup` are never taken for ids."""
    router.add_get("/v1/memories", list_memories)
    router.add_get("/v1/memories/search", search_memories)
    router.add_post("/v1/memories/search", search_memories)
    router.add_post("/v1/memories", create_memory)
    router.add_post("/v1/memories/bulk", bulk)
    router.add_post("/v1/memories/cleanup", cleanup)
    router.add_get("/v1/memories/{id}", get_memory)
    router.add_delete("/v1/memories/{id}", forget_memory)
    router.add_post("/v1/memories/{id}/mute", mute_memory)
    router.add_post("/v1/memories/{id}/unmute", unmute_memory)
    router.add_post("/v1/memories/{id}/erroneous", mark_erroneous)
    router.add_post("/v1/memories/{id}/split", split_memory)


# -- reading ---------------------------------------------------------------------------------


@gesture
async def list_memories(g: Gesture) -> Answer:
    """`GET /v1/memories`: one page, newest-mentioned first; `next_cursor` fetches the next."""
    query = _listing(g.request.query)
    memories, more = await g.keeper.store.listing(g.person, query)
    cursor = _cursor(memories[-1]) if more and memories else None
    return 200, {"memories": [m.wire() for m in memories], "next_cursor": cursor}


@gesture
async def get_memory(g: Gesture) -> Answer:
    """`GET /v1/memories/{id}`: the memory whatever its status (an erroneous one stays
    explainable), with its links and a glimpse of the memory at each link's other end."""
    memory_id = _path_id(g.request)
    memory = await _one(g, memory_id)
    links = await g.keeper.store.links(g.person, [memory_id])
    others = await g.keeper.store.get(
        g.person, {link.target if link.source == memory_id else link.source for link in links}
    )
    shown = []
    for link in links:
        other = others.get(link.target if link.source == memory_id else link.source)
        if other is not None:
            shown.append(
                {
                    "kind": link.kind,
                    "source": str(link.source),
                    "target": str(link.target),
                    "memory": other.brief(),
                }
            )
    mentions = await g.keeper.store.mentions(g.person, memory_id)
    return 200, {"memory": memory.wire(), "links": shown, "mentions": [m.wire() for m in mentions]}


@gesture
async def split_memory(g: Gesture) -> Answer:
    """`POST /v1/memories/{id}/split` with `{"mention": n}`: a restatement counted as a
    mention of `{id}` becomes a memory of its own, as it was said (a wrong merge undone)."""
    mention = g.body.get("mention")
    if not isinstance(mention, int) or isinstance(mention, bool):
        raise invalid("mention must be the id of one of the memory's mentions (an integer)")
    try:
        split = await g.keeper.split(g.person, _path_id(g.request), mention)
    except NoSuchMention:
        raise Refusal(404, "unknown_mention", "no such mention left to split") from None
    return 201, {"memory": split.memory.wire(), "from": split.former.wire()}


@gesture
async def search_memories(g: Gesture) -> Answer:
    """`GET /v1/memories/search?q=...&limit=...`, or a POST of `{"q", "limit"}` for a
    query too long for a URL: the person's memories that answer `q`, by meaning, names
    and links (`actors.memory.search`), best first."""
    q, limit = _search_args(g)
    try:
        found = await g.keeper.search(g.person, q, limit)
    except EmbeddingError as failure:
        raise Refusal(
            503, "search_unavailable", f"the query could not be embedded ({failure.code})"
        ) from None
    return 200, {"results": [f.wire() for f in found]}


def _search_args(g: Gesture) -> tuple[str, int]:
    if g.request.method == "POST":
        q, limit = g.body.get("q"), g.body.get("limit", SEARCH_LIMIT)
    else:
        if len(g.request.query.getall("q", [])) > 1:
            raise invalid("give q once")
        q = g.request.query.get("q")
        limit = query_integer(g.request.query, "limit", 1, SEARCH_MAX) or SEARCH_LIMIT
    try:
        return query_text(q, "q"), query_limit(limit, SEARCH_MAX)
    except BadQuery as wrong:
        raise invalid(str(wrong)) from None


def _listing(query: MultiDictProxy[str]) -> Listing:
    """The list's filters and page from the query string; invalid_field for anything off."""
    statuses = _words(query, "status") or ("active",)
    for status in statuses:
        if status not in MEMORY_STATUSES:
            raise invalid(f"status must be among {', '.join(MEMORY_STATUSES)}")
    types = tuple(t.lower() for t in _words(query, "type"))
    if any(not _TYPE.match(t) for t in types):
        raise invalid("type must be memory types such as fact, appointment, task")
    text = query.get("text") or None
    if text is not None and (fault := text_fault(text, "text", blank_ok=True)) is not None:
        raise invalid(fault)
    if text is not None and len(text) > MAX_FILTER_CHARS:
        raise invalid(f"text must be at most {MAX_FILTER_CHARS} characters")
    limit = query_integer(query, "limit", 1, LIST_MAX) or LIST_LIMIT
    offset = query_integer(query, "offset", 0, MAX_OFFSET) or 0
    after = _after(query["cursor"]) if "cursor" in query else None
    if after is not None and "offset" in query:
        raise invalid("give a cursor or an offset, not both")
    return Listing(tuple(statuses), tuple(types), text, after, offset, limit)


def _words(query: MultiDictProxy[str], name: str) -> tuple[str, ...]:
    """`status=active,muted` and `status=active&status=muted` alike."""
    values = query.getall(name, [])
    return tuple(dict.fromkeys(w.strip() for v in values for w in v.split(",") if w.strip()))


def _cursor(last: Memory) -> str:
    """Where the next page starts: after this memory, in list order. Opaque to clients."""
    raw = f"{last.last_mentioned.isoformat()}|{last.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _after(cursor: str) -> tuple[datetime, UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        when, _, memory_id = raw.partition("|")
        after = datetime.fromisoformat(when), UUID(memory_id)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid("cursor is not one this server gave") from None
    if after[0].tzinfo is None:
        raise invalid("cursor is not one this server gave")
    return after


# -- creating --------------------------------------------------------------------------------


@gesture
async def create_memory(g: Gesture) -> Answer:
    """`POST /v1/memories`: through recognition, as if the model had said it, so a memory
    that is already there is reinforced (200) rather than made twice (201)."""
    draft = _draft(g.body, g.limits)
    outcome = await g.keeper.remember(g.person, draft)
    if outcome.created:
        log.info("memory %s created through the API", outcome.memory.id)
        conflicts = [m.brief() for m in outcome.contradicts]
        return 201, {"result": "created", "memory": outcome.memory.wire(), "conflicts": conflicts}
    return 200, {
        "result": "reinforced",
        "reinforced": str(outcome.memory.id),
        "memory": outcome.memory.wire(),
        "tier": outcome.tier,
        "score": outcome.score,
        "reason": outcome.reason,
    }


def _draft(body: dict[str, Any], limits: Limits) -> MemoryDraft:
    """The memory in the body, checked strictly (the model's tool is lenient; a client
    gets told exactly which field is wrong)."""
    text = body.get("text")
    fault = text_fault(text, "text")
    if fault is not None:
        raise invalid(fault)
    if len(text) > limits.max_text_chars:
        raise invalid(f"text is limited to {limits.max_text_chars} characters")
    kind = body.get("type", "fact")
    if not isinstance(kind, str) or not _TYPE.match(kind.strip().lower()):
        raise invalid("type must be a word such as fact, appointment, reminder, task, memo")
    for name in ("people", "themes"):
        _check_names(body.get(name, []), name)
    for name in ("starts_at", "ends_at", "due_at"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise invalid(f"{name} must be an ISO 8601 time or date")
    if not isinstance(body.get("all_day", False), bool):
        raise invalid("all_day must be true or false")
    fields = ("text", "type", "people", "themes", "starts_at", "ends_at", "due_at", "all_day")
    try:
        return memory_draft({k: body[k] for k in fields if k in body})
    except BadArgument as wrong:
        raise invalid(str(wrong)) from None


def _check_names(value: object, name: str) -> None:
    if not isinstance(value, list) or len(value) > MAX_NAMES:
        raise invalid(f"{name} must be a list of at most {MAX_NAMES} strings")
    for item in value:
        fault = text_fault(item, f"each of {name}", blank_ok=True)
        if fault is not None:
            raise invalid(fault)
        if len(item) > MAX_NAME_CHARS:
            raise invalid(f"{name} must be strings of at most {MAX_NAME_CHARS} characters")


# -- one memory ------------------------------------------------------------------------------


@gesture
async def mute_memory(g: Gesture) -> Answer:
    """`POST /v1/memories/{id}/mute`: an active memory goes quiet (a muted one stays so;
    an erroneous or done one keeps its status: `changed` says which)."""
    memory_id = _path_id(g.request)
    changed = await g.keeper.mute(g.person, [memory_id])
    return 200, {"memory": (await _one(g, memory_id)).wire(), "changed": bool(changed.ids)}


@gesture
async def unmute_memory(g: Gesture) -> Answer:
    """`POST /v1/memories/{id}/unmute`: a muted memory is active again. One the
    consolidation pass had muted into another is taken back out of it (`unmerge`: its
    mentions go back with it, and the pass keeps the two apart from then on)."""
    memory_id = _path_id(g.request)
    changed = await g.keeper.unmute(g.person, [memory_id])
    done = bool(changed.ids)
    if changed.skipped:
        done = await unmerge(g.keeper, g.person, memory_id) is not None
    return 200, {"memory": (await _one(g, memory_id)).wire(), "changed": done}


@gesture
async def mark_erroneous(g: Gesture) -> Answer:
    """`POST /v1/memories/{id}/erroneous` with `{"corrected_by": id}`: settle a
    contradiction. The wrong memory stays, linked to the right one, so "why did you think
    it was Lisbon?" still has an answer."""
    raw = g.body.get("corrected_by")
    if not isinstance(raw, str):
        raise invalid("corrected_by must be the id of the memory that is right")
    memory_id = _path_id(g.request)
    corrector = parse_id(raw)
    if corrector is None:
        raise unknown([raw])
    if corrector == memory_id:
        raise invalid("a memory cannot correct itself")
    try:
        changed = await g.keeper.mark_erroneous(g.person, memory_id, corrector)
    except ErroneousCorrector:
        raise invalid("corrected_by names a memory that is itself erroneous") from None
    return 200, {"memory": (await _one(g, memory_id)).wire(), "changed": bool(changed.ids)}


@gesture
async def forget_memory(g: Gesture) -> Answer:
    """`DELETE /v1/memories/{id}?confirm=forget`: gone for good, with its links."""
    if g.request.query.get("confirm") != CONFIRM_FORGET:
        raise unconfirmed(CONFIRM_FORGET)
    memory_id = _path_id(g.request)
    await g.keeper.forget(g.person, [memory_id])
    return 200, {"forgotten": str(memory_id)}


def _path_id(request: web.Request) -> UUID:
    raw = request.match_info["id"]
    memory_id = parse_id(raw)
    if memory_id is None:
        raise unknown([raw])
    return memory_id


def parse_id(raw: str) -> UUID | None:
    try:
        return UUID(raw)
    except ValueError:
        return None


async def _one(g: Gesture, memory_id: UUID) -> Memory:
    memory = (await g.keeper.store.get(g.person, [memory_id])).get(memory_id)
    if memory is None:
        raise unknown([memory_id])
    return memory


# -- many memories ---------------------------------------------------------------------------


@gesture
async def bulk(g: Gesture) -> Answer:
    """`POST /v1/memories/bulk`: mute, unmute or forget many memories in one statement.
    All or nothing: if any id is not the person's, nothing changes and the answer lists
    every such id."""
    action = g.body.get("action")
    if action not in BULK_ACTIONS:
        raise invalid(f"action must be one of {', '.join(BULK_ACTIONS)}")
    raw = g.body.get("ids")
    if not isinstance(raw, list) or not raw or len(raw) > BULK_MAX_IDS:
        raise invalid(f"ids must be a list of 1 to {BULK_MAX_IDS} memory ids")
    if not all(isinstance(i, str) for i in raw):
        raise invalid("ids must be strings")
    if action == "forget" and g.body.get("confirm") != CONFIRM_FORGET:
        raise unconfirmed(CONFIRM_FORGET)
    ids = await _owned_or_refused(g, list(dict.fromkeys(raw)))
    if action == "mute":
        changed = await g.keeper.mute(g.person, ids)
    elif action == "unmute":
        changed = await g.keeper.unmute(g.person, ids)
    else:
        changed = await g.keeper.forget(g.person, ids)
    answer: dict[str, Any] = {"action": action, "asked": len(ids), "changed": len(changed.ids)}
    if action == "unmute":
        answer["merged"] = [str(i) for i in changed.skipped or []]
    return 200, answer


async def _owned_or_refused(g: Gesture, raw: list[str]) -> list[UUID]:
    """The ids, parsed. Strings that are not ids name no memory: the refusal lists them
    with every well-formed id that is not the person's either (read only, nothing done)."""
    parsed = {r: parse_id(r) for r in raw}
    malformed = [r for r, i in parsed.items() if i is None]
    ids = [i for i in parsed.values() if i is not None]
    if malformed:
        found = await g.keeper.store.get(g.person, ids)
        raise unknown([*malformed, *(i for i in ids if i not in found)])
    return ids


@gesture
async def cleanup(g: Gesture) -> Answer:
    """`POST /v1/memories/cleanup`: forget for good, in one statement, whole categories or
    only what the calendar judges past; a dry run answers what would go and changes
    nothing."""
    categories = g.body.get("categories")
    if (
        not isinstance(categories, list)
        or not categories
        or any(c not in CLEANUP_CATEGORIES for c in categories)
    ):
        raise invalid(f"categories must be a list among {', '.join(CLEANUP_CATEGORIES)}")
    scope = g.body.get("scope", "past")
    if scope not in SCOPES:
        raise invalid("scope must be past or all")
    dry_run = g.body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise invalid("dry_run must be true or false")
    zone = _zone(g.body.get("tz", "UTC"))
    if not dry_run and g.body.get("confirm") != CONFIRM_CLEANUP:
        raise unconfirmed(CONFIRM_CLEANUP)
    changed = await g.keeper.cleanup(
        g.person, frozenset(categories), everything=scope == "all", zone=zone, dry_run=dry_run
    )
    return 200, {
        "dry_run": dry_run,
        "scope": scope,
        "count": len(changed.ids),
        "memories": [m.brief() for m in changed.taken or []],
    }


def _zone(name: object) -> ZoneInfo:
    """The person's time zone (an IANA name): it decides when an all-day item's day ends."""
    if not isinstance(name, str) or text_fault(name, "tz") is not None or len(name) > 64:
        raise invalid("tz must be an IANA time zone name, e.g. Europe/London")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise invalid(f"tz {name!r} is not a time zone this server knows") from None
