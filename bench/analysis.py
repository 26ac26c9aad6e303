"""`python -m bench.analysis`: what reply matching costs an OpenAI-compatible model (a local
one on the CPU, above all): prompt and answer tokens, and latency p50/p95, the requests the
server makes today side by side with the requests it made before (`old`), in one run, so
that whatever else the machine is doing weighs on both alike.

The says asked about are those of `tests/data/turn_cases.jsonl` the rules are not sure of
(the only ones a turn asks about). `new`: one say at a time, the fixed instructions with
their examples, the answer asked for by JSON Schema (one label) and capped by `max_tokens`.
`old`: the says with every candidate in one request, instructions asking for entries,
"open" and "lull", any JSON object, no cap. `evicted`: the `new` request, each right after
a `loose-ends` request with other instructions, of the kind turns made once their reply
had gone out: on a one-slot server that keeps only its last prompt (llama.cpp without its
host-memory prompt cache), what a matching request pays when another task came between.

Requests go in blocks of four of a kind (which kind goes first rotates), after one untimed
request of each, so that each mostly finds its fixed instructions in the server's prompt
cache, which a one-slot server keeps for the last prompt only. Tokens are the server's own
counts (`usage`; `cached` is the part of the prompt it did not read again, where the
server says). Latency is the whole request, from sending to the answer read; for
`evicted`, the matching request alone.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from actors import replies
from actors.asking import numbered
from bench.flap import percentiles
from bench.results import write_json
from providers.analysis import Shape, request_body
from providers.rehearsal_analysis import sure_reply_matching

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
TARGET_P50_S = 1.5  # reply matching, on a laptop-class CPU
BLOCK = 4  # requests of one kind in a row: a one-slot server keeps the last prefix only
# The reply-matching instructions the server sent before it asked one say at a time.
OLD_REPLY_INSTRUCTIONS = (
    "You read a conversation between an assistant (A lines, oldest first) and a person "
    "(P lines). For each P message say which A message it answers: its label, or null when "
    "it starts something new. When it could answer several A questions equally, list them "
    'in "unclear" and put the likeliest in "answers". List in "open" the A questions still '
    'waiting for an answer after the P messages. Set "lull" to true when the person is '
    'winding the topic down ("you\'re welcome", "haha, true"). Answer only this JSON: '
    '{"answers": [{"message": "P1", "answers": "A2", "unclear": ["A1", "A2"]}], '
    '"open": ["A1"], "lull": false}'
)

OLD_LOOSE_INSTRUCTIONS = (
    "You read an exchange between an assistant (A lines, oldest first) and a person (P "
    "lines). List what neither side addressed: a point or question of the person's that the "
    "assistant's last message skipped, a question of the assistant's the person left "
    "unanswered, or a thread left open (a story not finished, something promised). Each "
    'has "by" (person or assistant, whose line it is), "ref" (that line\'s label), "text" '
    '(what is left open, in a few words) and "kind" (point, question or thread). Answer '
    'only this JSON: {"loose_ends": [{"by": "person", "ref": "P2", "text": "...", '
    '"kind": "point"}]}'
)

Request = tuple[str, list[str], str, Shape | None]  # task, lines, instructions, shape


def rows(name: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (DATA / name).read_text("utf-8").splitlines() if line]


def reply_requests(limit: int) -> list[tuple[Request, Request]]:
    """(old, new) for the first `limit` says the rules are unsure of."""
    pairs = []
    for row in rows("turn_cases.jsonl"):
        if not row["kind"].startswith("match/"):
            continue
        turns = row["turns"]
        assistant = [t["text"] for t in turns[:-1] if t["role"] == "assistant"][-8:]
        lines = numbered(assistant, [turns[-1]["text"]], replies.LINE_CHARS)
        if len(assistant) < 2 or sure_reply_matching(lines)[1][0]:
            continue
        old = (replies.TASK, lines, OLD_REPLY_INSTRUCTIONS, None)
        new = (replies.TASK, lines, replies.INSTRUCTIONS, replies.shape(assistant))
        pairs.append((old, new))
    return pairs[:limit]


def loose_request() -> Request:
    """A loose-ends request as turns made them after each reply, to evict the cached prefix."""
    lines = ["A1: How was your weekend?", "P1: can you remind me to call Sam at 5?"]
    return ("loose-ends", [*lines, "A2: Sure, I'll remind you at 5."], OLD_LOOSE_INSTRUCTIONS, None)


async def timed(
    http: aiohttp.ClientSession, args: argparse.Namespace, request: Request
) -> dict[str, Any]:
    """One request: seconds, tokens, and whether its answer was JSON."""
    body = request_body(args.model, *request)
    started = time.monotonic()
    async with http.post(f"{args.url.rstrip('/')}/chat/completions", json=body) as response:
        document = await response.json(content_type=None)
    seconds = time.monotonic() - started
    if response.status != 200:
        raise SystemExit(f"the server answered {response.status}: {str(document)[:300]}")
    usage = document.get("usage") or {}
    content = document["choices"][0]["message"]["content"]
    try:
        orjson.loads(content)
        json_ok = True
    except orjson.JSONDecodeError:
        json_ok = False
    return {
        "s": seconds,
        "prompt": usage.get("prompt_tokens"),
        "answer": usage.get("completion_tokens"),
        "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "json": json_ok,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return round(sum(values) / len(values), 1) if values else None

    return {
        "latency_s": percentiles([r["s"] for r in runs]),
        "prompt_tokens": mean("prompt"),
        "cached_tokens": mean("cached"),
        "answer_tokens": mean("answer"),
        "not_json": sum(not r["json"] for r in runs),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    pairs = reply_requests(args.requests)
    kinds = {"old": [o for o, _ in pairs], "new": [n for _, n in pairs]}
    kinds["evicted"] = kinds["new"]
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for warm in pairs[0]:
            await timed(http, args, warm)
        order = list(kinds)
        for start in range(0, len(pairs), BLOCK):
            for kind in order:
                for request in kinds[kind][start : start + BLOCK]:
                    if kind == "evicted":
                        await timed(http, args, loose_request())
                    runs[kind].append(await timed(http, args, request))
            order = order[1:] + order[:1]
    figures = {kind: summary(rows) for kind, rows in runs.items()}
    p50 = figures["new"]["latency_s"]["p50"]
    target = {"target_p50_s": TARGET_P50_S, "target_met": p50 is not None and p50 <= TARGET_P50_S}
    task = {"requests": len(pairs), **figures, **target}
    return {"url": args.url, "model": args.model, "tasks": {replies.TASK: task}}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"analysis requests to {result['model']} at {result['url']}",
        f"  {'task':<16}{'prompts':<9}{'n':>4}{'p50 s':>8}{'p95 s':>8}"
        f"{'prompt tok':>12}{'cached':>8}{'answer tok':>12}{'not json':>10}",
    ]
    for task, figures in result["tasks"].items():
        for which in ("old", "new", "evicted"):
            f = figures[which]
            lat = f["latency_s"]
            lines.append(
                f"  {task:<16}{which:<9}{lat['n']:>4}{lat['p50']:>8}{lat['p95']:>8}"
                f"{f['prompt_tokens']!s:>12}{f['cached_tokens']!s:>8}"
                f"{f['answer_tokens']!s:>12}{f['not_json']:>10}"
            )
        met = "met" if figures["target_met"] else "NOT met"
        lines.append(f"  {task}: new p50 <= {figures['target_p50_s']:g} s: {met}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.analysis", description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8091/v1", help="the API's base URL")
    parser.add_argument("--model", default="qwen", help="model name sent (qwen)")
    parser.add_argument("--requests", type=int, default=12, help="timed requests a task (12)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a request (300)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = asyncio.run(measure(args))
    print(table(result))
    if args.json is not None:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
