"""The rules API: a person's standing instructions to the assistant, over HTTP.

`GET /v1/rules`, `POST /v1/rules` `{"text": ...}`, `DELETE /v1/rules/{id}`; see
docs/context.md. Same credentials as the protocol and the memories API (header, body or
query), same error objects with stable codes. Every operation is scoped to the person the
credentials name: another person's rule id is answered exactly like an unknown id. Rules
live in the conversation store, not the memory keeper, so they work on a server that keeps
no long-term memory.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from storage.store import Store
from storage.text import text_fault
from transport.memory_api import Answer, Handler, Refusal, parse_id, person_handler
from transport.server import Server

log = logging.getLogger("stillhere.rules")

MAX_RULE_CHARS = 500  # a rule is a sentence or two, handed to the model every turn
MAX_RULES = 50  # per person: all of them are in every context


@dataclass(frozen=True, slots=True)
class RuleRequest:
    request: web.Request
    server: Server
    store: Store
    person: str
    body: dict[str, Any]


def rule_gesture(act: Callable[[RuleRequest], Awaitable[Answer]]) -> Handler:
    """A rules endpoint: `act` gets the store with the identified person and body."""

    @functools.wraps(act)
    async def with_store(
        request: web.Request, server: Server, person: str, body: dict[str, Any]
    ) -> Answer:
        return await act(RuleRequest(request, server, server.runtime.store, person, body))

    return person_handler(with_store)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/v1/rules", list_rules)
    router.add_post("/v1/rules", create_rule)
    router.add_delete("/v1/rules/{id}", delete_rule)


@rule_gesture
async def list_rules(r: RuleRequest) -> Answer:
    """`GET /v1/rules`: every rule of the person, oldest first (the order they were given)."""
    return 200, {"rules": [rule.wire() for rule in await r.store.rules.of(r.person)]}


@rule_gesture
async def create_rule(r: RuleRequest) -> Answer:
    """`POST /v1/rules` `{"text": "always answer in French"}`: 201 with the rule."""
    text = r.body.get("text")
    fault = text_fault(text, "text")
    if fault is not None:
        raise Refusal(400, "invalid_field", fault)
    text = " ".join(text.split())
    if len(text) > MAX_RULE_CHARS:
        raise Refusal(400, "invalid_field", f"text is limited to {MAX_RULE_CHARS} characters")
    rule = await r.store.rules.add(r.person, text, r.server.runtime.clock.now(), limit=MAX_RULES)
    if rule is None:
        raise Refusal(409, "too_many_rules", f"a person keeps at most {MAX_RULES} rules")
    log.info("rule %s added for %s", rule.id, r.person[:8])
    return 201, {"rule": rule.wire()}


@rule_gesture
async def delete_rule(r: RuleRequest) -> Answer:
    """`DELETE /v1/rules/{id}`: gone at once (the next turn's context no longer has it)."""
    raw = r.request.match_info["id"]
    rule_id = parse_id(raw)
    if rule_id is None or not await r.store.rules.delete(r.person, rule_id):
        raise Refusal(404, "unknown_rule", "no such rule", ids=[raw])
    log.info("rule %s deleted for %s", rule_id, r.person[:8])
    return 200, {"deleted": str(rule_id)}
