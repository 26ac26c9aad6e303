"""Same-memory benchmark: what the judge of the uncertain band costs with a real model.

Puts labelled pairs of memories to an OpenAI-compatible analysis model as the
`same-memory` task, two ways, interleaved chunk by chunk so both share the machine:

- `batched`: the request as it was, several pairs to a request (`--batch`, 8) under the
  earlier instructions, which ask for the contract's long answer (`{"pairs": [...]}`);
- `current`: the judge as it asks (`actors.memory.same_memory.judged`): one pair per
  request, the fixed instructions first (a server's cached prefix), the pair's lines last,
  a short answer by JSON Schema capped by `max_tokens`; a `same` is checked by two more
  questions (anything new, each way round). Each pair is judged twice, and the report says
  how many verdicts were the same both times.

For each way: a pair's latency (a batched request's time is each of its pairs' wait; a
judged pair's is all its questions'), requests per pair, prompt tokens, the tokens the
server read from its cache, answer tokens (per request), and the verdicts against the
labels. Run, with the local model (`../shared/local-model/serve 8092`):

    .venv/bin/python -m bench.same_memory --url http://127.0.0.1:8092/v1 --model qwen \\
        --pairs tests/data/dedup_pairs.jsonl --limit 16 --json bench/out/same_memory.json

On a shared CPU the latencies are the machine's as much as the model's: compare the two
ways of one run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from actors.memory.same_memory import TASK, judged
from providers.analysis import Shape, request_body
from storage.records import MemoryDraft

# The instructions before one pair went to a request, kept to be measured against.
BATCHED_INSTRUCTIONS = (
    "You compare memories a personal assistant keeps about the person it talks with. "
    "Each pair is an existing memory (odd number) and a new one (the next number), each "
    "followed by its type, people and themes. Answer in JSON: "
    '{"pairs": [{"existing": "M1", "new": "M2", "verdict": "same" | "distinct" | '
    '"contradiction"}]}. "same": the new memory restates the existing one, in any words or '
    'language. "distinct": another fact, even about the same thing or a different person '
    '(my daughter is not me). "contradiction": the same thing with another value, or its '
    "negation or opposite. When unsure, answer distinct."
)


def read_pairs(path: Path, limit: int) -> list[dict[str, Any]]:
    """The first `limit` pairs of a labelled file, same and not alternating, so a short run
    has both."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    same = [r for r in rows if r["same"]]
    other = [r for r in rows if not r["same"]]
    mixed = [r for pair in zip(same, other, strict=False) for r in pair]
    return mixed[:limit]


def draft(memory: dict[str, Any]) -> MemoryDraft:
    people, themes = tuple(memory.get("people", [])), tuple(memory.get("themes", []))
    return MemoryDraft(memory["text"], memory.get("type", "fact"), people, themes)


def batched_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The lines of `rows` as one request: `M1`/`M2`, `M3`/`M4`... with their meta lines."""
    out = []
    for i, row in enumerate(rows):
        for number, memory in ((2 * i + 1, draft(row["existing"])), (2 * i + 2, draft(row["new"]))):
            out.append(f"M{number}: {' '.join(memory.text.split())}")
            people, themes = ",".join(memory.people), ",".join(memory.themes)
            out.append(f"  meta: type={memory.type} people={people} themes={themes}")
    return out


class Recording:
    """An `Analysis` over HTTP that keeps each request's time and token counts."""

    label = "bench"

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str) -> None:
        self.session, self.url, self.model = session, url, model
        self.calls: list[dict[str, float]] = []

    async def ask(
        self, task: str, lines: Sequence[str], instructions: str, shape: Shape | None = None
    ) -> dict[str, Any] | None:
        body = request_body(self.model, task, lines, instructions, shape)
        started = time.monotonic()
        async with self.session.post(f"{self.url}/chat/completions", json=body) as response:
            response.raise_for_status()
            document = await response.json()
        usage = document.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.calls.append(
            {"seconds": time.monotonic() - started, "prompt": usage.get("prompt_tokens", 0),
             "cached": cached, "answer": usage.get("completion_tokens", 0)}
        )  # fmt: skip
        try:
            answer = json.loads(document["choices"][0]["message"]["content"])
        except (KeyError, IndexError, json.JSONDecodeError):
            return None
        return answer if isinstance(answer, dict) else None

    async def close(self) -> None:
        """The session is the caller's."""


def _batched_verdicts(answer: dict[str, Any] | None, count: int) -> list[str | None]:
    found: list[str | None] = [None] * count
    for item in (answer or {}).get("pairs") or []:
        number = str(item.get("existing", "")).removeprefix("M") if isinstance(item, dict) else ""
        if number.isdecimal() and int(number) % 2 == 1 and int(number) // 2 < count:
            found[int(number) // 2] = item.get("verdict")
    return found


async def _judge(model: Recording, row: dict[str, Any]) -> dict[str, Any]:
    """One pair judged as the server judges it: its verdict, time and tokens."""
    before = len(model.calls)
    said = await judged(model, draft(row["existing"]), draft(row["new"]))
    calls = model.calls[before:]
    return {
        "same": row["same"], "verdict": said, "seconds": sum(c["seconds"] for c in calls),
        "requests": len(calls), **{k: statistics.mean(c[k] for c in calls)
                                   for k in ("prompt", "cached", "answer")},
    }  # fmt: skip


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows = read_pairs(args.pairs, args.limit)
    ways: dict[str, list[dict[str, Any]]] = {"batched": [], "current": []}
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        model = Recording(session, args.url.rstrip("/"), args.model)
        for start in range(0, len(rows), args.batch):
            chunk = rows[start : start + args.batch]
            answer = await model.ask(TASK, batched_lines(chunk), BATCHED_INSTRUCTIONS)
            call = model.calls[-1]
            for row, said in zip(chunk, _batched_verdicts(answer, len(chunk)), strict=True):
                ways["batched"].append(
                    {"same": row["same"], "verdict": said, "requests": 1 / len(chunk), **call}
                )
            for row in chunk:
                first, again = await _judge(model, row), await _judge(model, row)
                ways["current"].append({**first, "stable": first["verdict"] == again["verdict"]})
    return {"pairs": len(rows), "ways": {name: summary(r) for name, r in ways.items()}}


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = sorted(r["seconds"] for r in results)
    merged = [r for r in results if r["verdict"] == "same"]
    out = {
        "p50_s": round(statistics.median(seconds), 3),
        "p95_s": round(seconds[min(len(seconds) - 1, int(0.95 * len(seconds)))], 3),
        "requests": round(statistics.mean(r["requests"] for r in results), 2),
        "prompt_tokens": round(statistics.mean(r["prompt"] for r in results), 1),
        "cached_tokens": round(statistics.mean(r["cached"] for r in results), 1),
        "answer_tokens": round(statistics.mean(r["answer"] for r in results), 1),
        "merged_right": sum(r["same"] for r in merged),
        "false_merges": sum(not r["same"] for r in merged),
        "no_verdict": sum(r["verdict"] is None for r in results),
    }
    if "stable" in results[0]:
        out["stable"] = sum(r["stable"] for r in results)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.same_memory", description=__doc__)
    parser.add_argument("--url", required=True, help="the analysis model's base URL (…/v1)")
    parser.add_argument("--model", default="qwen", help="model name sent (default qwen)")
    parser.add_argument("--pairs", type=Path, default=Path("tests/data/dedup_pairs.jsonl"))
    parser.add_argument("--limit", type=int, default=16, help="pairs to ask (default 16)")
    parser.add_argument("--batch", type=int, default=8, help="pairs per batched request")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(measure(args))
    print(f"{report['pairs']} pairs against {args.url} ({args.model})")
    columns = ("p50_s", "p95_s", "requests", "prompt_tokens", "cached_tokens",
               "answer_tokens", "merged_right", "false_merges", "no_verdict", "stable")  # fmt: skip
    print(f"{'way':10}" + "".join(f"{c:>15}" for c in columns))
    for name, figures in report["ways"].items():
        print(f"{name:10}" + "".join(f"{figures.get(c, '-')!s:>15}" for c in columns))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
