"""The analysis model: small judgement questions put to an OpenAI-compatible chat model.

The contract (docs/protocol.md, "The analysis model") is fixed so any model, hosted or
fine-tuned, and any test fake can answer: one non-streamed request whose last user message
starts with the task's name, then the numbered lines; the answer is one JSON object. This
client only speaks that contract. Whether the object has the task's shape is for the caller
to check; a call that fails, runs late or answers something else is `None`, never an error,
because an analysis only ever adds to a reply and must never cost it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from providers.http import ApiClient, excerpt

log = logging.getLogger("stillhere.analysis")

TASKS = ("reply-matching", "loose-ends", "same-memory")
DEFAULT_TIMEOUT_S = 2.0

# Called once per failed call with (task, reason); the server counts them in Prometheus.
FailureHook = Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class Shape:
    """The answer a caller wants: a JSON Schema of the object, and at most how many tokens.

    `weighed` names a property (an enum of strings, or a boolean) whose answer the caller
    wants weighed, not only read: the server is asked for its tokens' log-probabilities
    (OpenAI, llama.cpp and vLLM give them), and the answer carries under `CHANCES` how
    likely the model found each of the property's values (`chances`).

    `opening` is the answer's first characters, up to where its weighed value begins
    (`{"verdict": "`), sent as the start of the assistant's message for the model to go on
    from (llama.cpp continues it; vLLM when asked to continue the final message): the model
    reads them at once instead of writing them token by token, and its first token is the
    value. No schema then (a server would decode the continuation by it from its first
    character); a server that answers anew is read as well."""

    name: str
    schema: dict[str, Any]
    max_tokens: int
    weighed: str | None = None
    opening: str | None = None

    @classmethod
    def of(
        cls,
        name: str,
        properties: dict[str, Any],
        max_tokens: int,
        weighed: str | None = None,
        opening: str | None = None,
    ) -> Shape:
        """An object of exactly these properties, each required."""
        schema = {"type": "object", "properties": properties, "required": list(properties)}
        return cls(name, {**schema, "additionalProperties": False}, max_tokens, weighed, opening)

    def values(self) -> tuple[str, ...]:
        """The weighed property's values as the answer writes them (`true`, not `"true"`)."""
        spec = self.schema["properties"][self.weighed] if self.weighed else {}
        return ("true", "false") if spec.get("type") == "boolean" else tuple(spec.get("enum", ()))

    def response_format(self) -> dict[str, Any]:
        schema = {"name": self.name, "strict": True, "schema": self.schema}
        return {"type": "json_schema", "json_schema": schema}


JSON_OBJECT = {"type": "json_object"}
# The answer's key for the chances of a weighed property's values (a model's own key of that
# name is dropped: the schema allows none).
CHANCES = "chances"
TOP_LOGPROBS = 10  # alternatives a token's log-probabilities list
REFUSED = (400, 422)  # what a server answers a response format it does not take


class Analysis(Protocol):
    """What the turn and the memory ask: the model over HTTP, or the rehearsal analysis."""

    label: str

    async def ask(
        self, task: str, lines: Sequence[str], instructions: str, shape: Shape | None = None
    ) -> dict[str, Any] | None: ...

    async def close(self) -> None: ...


class _Failed(Exception):
    def __init__(self, reason: str, detail: str, status: int = 0) -> None:
        super().__init__(detail)
        self.reason = reason
        self.status = status


def request_text(task: str, lines: Sequence[str]) -> str:
    """The last user message: the task's line, then one line per message."""
    if task not in TASKS:
        raise ValueError(f"unknown analysis task {task!r}")
    return "\n".join([task, *lines])


def request_body(
    model: str, task: str, lines: Sequence[str], instructions: str, shape: Shape | None = None
) -> dict[str, Any]:
    """The request: the fixed instructions first, byte for byte the same from call to call,
    so a server that keeps a cached prefix reads only the request's own lines; the answer's
    shape by JSON Schema (or its opening, to go on from) and its `max_tokens` when `shape`
    is given, else any JSON object."""
    messages = [
        {"role": "system", "content": instructions},
        {"role": "user", "content": request_text(task, lines)},
    ]
    body: dict[str, Any] = {"model": model, "stream": False, "temperature": 0}
    if shape is not None and shape.opening:
        messages.append({"role": "assistant", "content": shape.opening})
    else:
        body["response_format"] = JSON_OBJECT if shape is None else shape.response_format()
    body["messages"] = messages
    if shape is not None:
        body["max_tokens"] = shape.max_tokens
    if shape is not None and shape.weighed:
        body |= {"logprobs": True, "top_logprobs": TOP_LOGPROBS}
    return body


class AnalysisModel:
    """An `Analysis` backed by any OpenAI-compatible `/chat/completions` endpoint."""

    def __init__(
        self,
        url: str,
        model: str,
        key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        on_failure: FailureHook | None = None,
    ) -> None:
        self.label = f"openai-compatible {model} at {url}"
        self.timeout = timeout
        self.on_failure = on_failure
        self._model = model
        # What the server answered with a 400: "schema" (a json_schema format), "opening"
        # (an answer's opening to go on from). Each is left out of its requests from then
        # on; a server may take one and not the other.
        self._refused: set[str] = set()
        # A total timeout: a judgement that is late is no use to the reply waiting for it.
        self._api = ApiClient(
            f"{url.rstrip('/')}/chat/completions", key, aiohttp.ClientTimeout(total=timeout)
        )

    async def close(self) -> None:
        await self._api.close()

    async def ask(
        self, task: str, lines: Sequence[str], instructions: str, shape: Shape | None = None
    ) -> dict[str, Any] | None:
        """The answer's JSON object; None (logged, counted) when there is none to use."""
        body = request_body(self._model, task, lines, instructions, shape)
        if _feature(body) in self._refused:
            body = _plain(body)
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                return await self._answer(body, shape)
        except TimeoutError:
            self._failed(task, "timeout", f"no answer within {self.timeout:g} s", started)
        except _Failed as failure:
            self._failed(task, failure.reason, str(failure), started)
        return None

    async def _answer(self, body: dict[str, Any], shape: Shape | None) -> dict[str, Any]:
        try:
            return await self._post(body, shape)
        except _Failed as failure:
            feature = _feature(body)
            if failure.status not in REFUSED or feature is None:
                raise
        self._refused.add(feature)
        log.warning(
            "the analysis server refuses %s: asking for json_object, without "
            "log-probabilities, from now on",
            "an answer's opening" if feature == "opening" else "json_schema answers",
        )
        return await self._post(_plain(body), shape)

    async def _post(self, body: dict[str, Any], shape: Shape | None) -> dict[str, Any]:
        api = self._api
        with api.network_failures(_Failed):  # "timeout" or "connect", as the chat client's
            async with api.session().post(
                api.endpoint, data=orjson.dumps(body), headers=api.headers("application/json")
            ) as response:
                raw = await response.read()
        if not 200 <= response.status < 300:
            detail = api.scrub(f"answered {response.status}: {excerpt(raw)}")
            raise _Failed("http", detail, response.status)
        content, tokens = _completion(raw)
        content = opened(content, shape)
        return weighed(_answer_object(content), content, tokens, shape)

    def _failed(self, task: str, reason: str, detail: str, started: float) -> None:
        took = time.monotonic() - started
        log.warning("analysis %s failed (%s) after %.0f ms: %s", task, reason, took * 1000, detail)
        if self.on_failure is not None:
            self.on_failure(task, reason)


def _feature(body: dict[str, Any]) -> str | None:
    """What a server may refuse in `body`: its answer's opening, its json_schema format, or
    nothing (the plain request, any JSON object)."""
    if body["messages"][-1]["role"] == "assistant":
        return "opening"
    return "schema" if body.get("response_format") != JSON_OBJECT else None


def _plain(body: dict[str, Any]) -> dict[str, Any]:
    """`body` as the plainest server takes it: any JSON object, no log-probabilities, no
    opening to go on from."""
    plain = {k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")}
    asked = [m for m in body["messages"] if m["role"] != "assistant"]
    return {**plain, "messages": asked, "response_format": JSON_OBJECT}


def opened(content: str, shape: Shape | None) -> str:
    """The whole answer: `content`, or the shape's opening and `content` where the server
    gave only what the model wrote after it (llama.cpp gives both, a server that ignores the
    opening a whole answer of its own)."""
    opening = shape.opening if shape is not None else None
    if opening and not content.lstrip().startswith("{"):
        return opening + content
    return content


def _completion(raw: bytes) -> tuple[str, list[Any]]:
    """The text of the completion's first choice, and its tokens' log-probabilities (none
    unless asked for and given)."""
    try:
        choice = orjson.loads(raw)["choices"][0]
        content = choice["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        raise _Failed("bad_response", f"not a chat completion: {excerpt(raw)}") from None
    if not isinstance(content, str):
        raise _Failed("bad_response", "the completion carries no text")
    tokens = (choice.get("logprobs") or {}).get("content") if isinstance(choice, dict) else None
    return content, tokens if isinstance(tokens, list) else []


def weighed(
    answer: dict[str, Any], content: str, tokens: Sequence[Any], shape: Shape | None
) -> dict[str, Any]:
    """`answer` (read from `content`) with the chances of its weighed property, when the
    shape weighs one and the server gave `tokens` with their log-probabilities."""
    answer.pop(CHANCES, None)
    if shape is not None and shape.weighed:
        found = chances(tokens, content, shape.weighed, shape.values())
        if found is not None:
            answer[CHANCES] = found
    return answer


def chances(
    tokens: Sequence[Any], content: str, prop: str, values: Sequence[str]
) -> dict[str, float] | None:
    """How likely the model found each of `values` for `prop`, read from the tokens where
    the answer's value of `prop` is written, as shares of the chances there (a constrained
    server writes one of the values). A value may take several tokens (`A` then `2`): see
    `_spelled`. None when the server gave no log-probabilities there. The tokens are the
    end of `content`: what the model wrote after an opening it was given is all they
    cover."""
    found = re.search(rf'"{re.escape(prop)}"\s*:\s*"?', content)
    if found is None:
        return None
    texts = [token.get("token", "") if isinstance(token, dict) else "" for token in tokens]
    written = "".join(texts)
    at = len(content) - len(written) if content.endswith(written) else 0
    for i, text in enumerate(texts):
        at += len(text)
        if at > found.end():
            return _spelled(tokens[i:], values)
    return None


def _spelled(tokens: Sequence[Any], values: Sequence[str]) -> dict[str, float] | None:
    """Each value's share from the tokens where the value begins. An alternative that leads
    to one value alone gives it its chance, times that of the tokens written before it; the
    written token, while it still leads to several, goes on to the next token. An
    alternative not written that leads to several cannot be split between them: its chance
    counts in the whole, given to none, so the shares then add up to less than 1."""
    mass = dict.fromkeys(values, 0.0)
    unsplit, before, carried = 0.0, "", 1.0
    for token in tokens:
        written = str(token.get("token", "")) if isinstance(token, dict) else ""
        for text, chance in _alternatives(token):
            leads = _leading(before + text, values)
            if len(leads) == 1:
                mass[leads[0]] += carried * chance
            elif leads and text != written:
                unsplit += carried * chance
        before += written
        logprob = token.get("logprob") if isinstance(token, dict) else None
        if len(_leading(before, values)) < 2 or not isinstance(logprob, int | float):
            break
        carried *= math.exp(logprob)
    total = sum(mass.values())
    return {v: m / (total + unsplit) for v, m in mass.items()} if total > 0 else None


def _alternatives(token: Any) -> list[tuple[str, float]]:
    """A token's alternatives as (text, chance), each once (the written token is listed
    among them too)."""
    listed = [token, *(token.get("top_logprobs") or [])] if isinstance(token, dict) else []
    found: dict[str, float] = {}
    for alternative in listed:
        text = str(alternative.get("token", "")) if isinstance(alternative, dict) else ""
        logprob = alternative.get("logprob") if isinstance(alternative, dict) else None
        if text not in found and isinstance(logprob, int | float):
            found[text] = math.exp(logprob)
    return list(found.items())


def _leading(spelled: str, values: Sequence[str]) -> list[str]:
    """The values that `spelled` (the value's tokens so far) begins, or is, when closed."""
    stem = spelled.lstrip(' \t\n"')
    closed = stem.rstrip(' \t\n"},')
    if not stem:
        return []
    return [v for v in values if v.startswith(stem) or (closed != stem and v == closed)]


def _answer_object(content: str) -> dict[str, Any]:
    # Local models asked for JSON still like to wrap it in a Markdown fence.
    text = content.strip().removeprefix("```json").removeprefix("```").removesuffix("```")
    try:
        answer = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise _Failed("not_json", f"the answer is not JSON: {content[:200]}") from None
    if not isinstance(answer, dict):
        raise _Failed("not_json", f"the answer is not a JSON object: {content[:200]}")
    return answer
