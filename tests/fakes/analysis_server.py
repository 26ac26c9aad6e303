"""A scripted analysis model (PROTOCOL 1.1), spoken to over real HTTP.

The test scripts each answer (a JSON object, or a failure) and reads back what was asked:
the task and the numbered lines. Unscripted requests get `default(request)`, or the
neutral answer of their task (every person message answers the latest assistant message,
no loose ends, no pairs), so a test that does not care about the analysis need not script it.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.http_fake import FakeApi


@dataclass(frozen=True, slots=True)
class Answer:
    """A completion whose text is `content` (a dict is sent as JSON), after `delay` seconds.
    `chances`: to a request that asks for log-probabilities, the token where the answer's
    first value of these begins lists them as its alternatives, as llama.cpp does."""

    content: dict[str, Any] | str
    delay: float = 0.0
    chances: dict[str, float] | None = None


@dataclass(frozen=True, slots=True)
class Down:
    """An HTTP error."""

    status: int = 503


@dataclass(frozen=True, slots=True)
class Stall:
    """Never answer (until the fake stops)."""


AnalysisResponse = Answer | Down | Stall


@dataclass(frozen=True, slots=True)
class Asked:
    """One request as the contract shapes it."""

    task: str
    lines: list[str]
    instructions: str
    body: dict[str, Any]


def asked(body: dict[str, Any]) -> Asked:
    messages = body.get("messages") or []
    user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    task, *lines = str(user).split("\n")
    return Asked(task, lines, str(system), body)


def neutral(request: Asked) -> AnalysisResponse:
    """What a model with no judgement would answer: every P line answers the latest A."""
    if request.task == "reply-matching":
        last = [line.split(":", 1)[0] for line in request.lines if line.startswith("A")]
        people = [line.split(":", 1)[0] for line in request.lines if line.startswith("P")]
        latest = last[-1] if last else None
        answers = [{"message": p, "answers": latest} for p in people]
        return Answer({"answers": answers, "open": [], "lull": False})
    if request.task == "loose-ends":
        return Answer({"loose_ends": []})
    return Answer({"pairs": []})


def opening(body: dict[str, Any]) -> str | None:
    """The answer's opening a request sends for the model to go on from: its last message,
    when that is the assistant's."""
    messages = body.get("messages") or [{}]
    return messages[-1].get("content") if messages[-1].get("role") == "assistant" else None


class FakeAnalysis(FakeApi["AnalysisResponse"]):
    """Each task has its own script, so answers queued for one are never taken by another
    (loose ends are asked after every reply, beside the test's reply matching).

    A request may end with the answer's opening, for the model to go on from. The script's
    answer is what the model writes: after the opening (a server may answer that alone), or a whole
    answer of its own (OpenAI's API ignores an opening). A server that `echoes` answers the
    opening and what the model wrote after it, with log-probabilities for what it wrote
    only, as llama.cpp does; one that would `refuse_opening` answers it with a 400."""

    path = "/v1/chat/completions"

    def __init__(
        self,
        default: Callable[[Asked], AnalysisResponse] | None = None,
        refuse_schema: bool = False,
        echoes: bool = False,
        refuse_opening: bool = False,
    ) -> None:
        super().__init__()
        self.default = default or neutral
        self.refuse_schema = refuse_schema  # answer a json_schema response format with a 400
        self.echoes = echoes
        self.refuse_opening = refuse_opening
        self.asked: list[Asked] = []
        self._scripts: dict[str, deque[AnalysisResponse]] = defaultdict(deque)

    def queue(self, *responses: AnalysisResponse, task: str = "reply-matching") -> None:
        self._scripts[task].extend(responses)

    def tasks(self, task: str) -> list[Asked]:
        return [a for a in self.asked if a.task == task]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        return await self.respond(body)

    async def respond(self, body: dict[str, Any]) -> web.Response:
        """The answer to one request; also used by the chat fake for its non-streamed calls."""
        if self.refuse_schema and (body.get("response_format") or {}).get("type") == "json_schema":
            return web.Response(status=400, text="response_format json_schema not supported")
        if self.refuse_opening and opening(body) is not None:
            return web.Response(status=400, text="assistant prefill not supported")
        request = asked(body)
        self.asked.append(request)
        script = self._scripts[request.task]
        response = script.popleft() if script else self.default(request)
        if isinstance(response, Down):
            return web.Response(status=response.status, text="analysis unavailable")
        if isinstance(response, Stall):
            await self._stopping.wait()
            return web.Response(status=503, text="stopping")
        if response.delay:
            await asyncio.sleep(response.delay)
        content = response.content
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        opened = opening(body) if self.echoes else None
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": (opened or "") + text},
            "finish_reason": "stop",
        }
        if body.get("logprobs") and response.chances:
            choice["logprobs"] = {"content": tokens(text, response.chances)}
        completion = {
            "id": "chatcmpl-analysis",
            "object": "chat.completion",
            "model": body.get("model", "fake"),
            "choices": [choice],
        }
        return web.json_response(completion, dumps=lambda v: orjson.dumps(v).decode())


def tokens(text: str, chances: dict[str, float]) -> list[dict[str, Any]]:
    """`text` as three tokens: up to the first of `chances`' values, the value (its
    alternatives: every value, by its chance), the rest."""
    at = min((i for v in chances if (i := text.find(v)) >= 0), default=-1)
    if at < 0:
        return [{"token": text, "logprob": 0.0, "top_logprobs": []}]
    value = next(v for v in chances if text.startswith(v, at))
    alternatives = [{"token": v, "logprob": math.log(p)} for v, p in chances.items() if p > 0]
    written = [
        {"token": text[:at], "logprob": 0.0, "top_logprobs": []},
        {"token": value, "logprob": math.log(chances[value]), "top_logprobs": alternatives},
        {"token": text[at + len(value) :], "logprob": 0.0, "top_logprobs": []},
    ]
    return [token for token in written if token["token"]]
