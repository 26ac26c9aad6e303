"""Same-memory benchmark: what the judge of the uncertain band costs with a real model.

Puts labelled pairs of memories to an OpenAI-compatible analysis model as the judge does
(`actors.memory.same_memory.judged`: one request a pair, the fixed instructions first for
the server's cached prefix, the pair's lines last, the verdict weighed by the tokens'
log-probabilities), two ways, one after the other (each way's cache warmed by one
unmeasured pair first):

- `written`: the model writes the whole answer, `{"verdict": "same"}`, decoded by its
  JSON Schema: eight tokens written, the verdict the sixth;
- `current`: the request ends with the answer's opening, `{"verdict": "`, for the model
  to go on from: the opening is read with the pair's lines, and the first token written
  is the verdict.

Each pair is judged twice each way, and the report says how many verdicts were the same
both times. For each way: a pair's latency (all its questions'), requests per pair, prompt
tokens, the tokens the server read from its cache, answer tokens (per request), the time
spent reading and writing (p50, where the server says: llama.cpp's `timings`), and the
verdicts against the labels. Run, with the local model (`../shared/local-model/serve`):

    .venv/bin/python -m bench.same_memory --url http://127.0.0.1:8091/v1 --model qwen \\
        --pairs tests/data/dedup_pairs.jsonl --limit 4 --json bench/out/same_memory.json

On a shared CPU the latencies are the machine's as much as the model's: compare the two
ways of one run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from actors.memory.same_memory import judged
from providers.analysis import Shape, opened, request_body, weighed
from storage.records import MemoryDraft

WAYS = ("written", "current")


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


class Recording:
    """An `Analysis` over HTTP that keeps each request's time and token counts."""

    label = "bench"

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str) -> None:
        self.session, self.url, self.model = session, url, model
        self.calls: list[dict[str, float]] = []
        self.opening = True  # False: the answer is written whole, by its schema

    async def ask(
        self, task: str, asked: Sequence[str], instructions: str, shape: Shape | None = None
    ) -> dict[str, Any] | None:
        if shape is not None and not self.opening:
            shape = dataclasses.replace(shape, opening=None)
        body = request_body(self.model, task, asked, instructions, shape)
        started = time.monotonic()
        async with self.session.post(f"{self.url}/chat/completions", json=body) as response:
            response.raise_for_status()
            document = await response.json()
        usage = document.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        timings = document.get("timings") or {}  # llama.cpp's: reading, then writing
        self.calls.append(
            {"seconds": time.monotonic() - started, "prompt": usage.get("prompt_tokens", 0),
             "cached": cached, "answer": usage.get("completion_tokens", 0),
             "read_s": timings.get("prompt_ms", 0) / 1000,
             "write_s": timings.get("predicted_ms", 0) / 1000}
        )  # fmt: skip
        try:
            choice = document["choices"][0]
            answer = json.loads(content := opened(choice["message"]["content"], shape))
        except (KeyError, IndexError, json.JSONDecodeError):
            return None
        tokens = (choice.get("logprobs") or {}).get("content") or []
        return weighed(answer, content, tokens, shape) if isinstance(answer, dict) else None

    async def close(self) -> None:
        """The session is the caller's."""


async def _judge(model: Recording, way: str, row: dict[str, Any]) -> dict[str, Any]:
    """One pair judged one way: its verdict, time and tokens."""
    before = len(model.calls)
    model.opening = way == "current"
    said = (await judged(model, draft(row["existing"]), draft(row["new"]))).verdict
    calls = model.calls[before:]
    return {
        "same": row["same"], "verdict": said, "seconds": sum(c["seconds"] for c in calls),
        "requests": len(calls), **{k: statistics.mean(c[k] for c in calls)
                                   for k in ("prompt", "cached", "answer")},
        **{k: sum(c[k] for c in calls) for k in ("read_s", "write_s")},
    }  # fmt: skip


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows = read_pairs(args.pairs, args.limit)
    ways: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        model = Recording(session, args.url.rstrip("/"), args.model)
        for way, results in ways.items():
            # Way by way: one way's instructions in the server's cache, read once beforehand,
            # as a server that judges pairs all day keeps them.
            await _judge(model, way, rows[0])
            for row in rows:
                first, again = await _judge(model, way, row), await _judge(model, way, row)
                results.append({**first, "stable": first["verdict"] == again["verdict"]})
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
        "read_p50_s": round(statistics.median(r["read_s"] for r in results), 3),
        "write_p50_s": round(statistics.median(r["write_s"] for r in results), 3),
        "answer_tokens": round(statistics.mean(r["answer"] for r in results), 1),
        "merged_right": sum(r["same"] for r in merged),
        "false_merges": sum(not r["same"] for r in merged),
        "no_verdict": sum(r["verdict"] is None for r in results),
        "stable": sum(r["stable"] for r in results),
    }
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.same_memory", description=__doc__)
    parser.add_argument("--url", required=True, help="the analysis model's base URL (…/v1)")
    parser.add_argument("--model", default="qwen", help="model name sent (default qwen)")
    parser.add_argument("--pairs", type=Path, default=Path("tests/data/dedup_pairs.jsonl"))
    parser.add_argument("--limit", type=int, default=16, help="pairs to ask (default 16)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(measure(args))
    print(f"{report['pairs']} pairs against {args.url} ({args.model})")
    columns = ("p50_s", "p95_s", "read_p50_s", "write_p50_s", "requests", "prompt_tokens",
               "cached_tokens", "answer_tokens", "merged_right", "false_merges", "no_verdict",
               "stable")  # fmt: skip
    print(f"{'way':10}" + "".join(f"{c:>15}" for c in columns))
    for name, figures in report["ways"].items():
        print(f"{name:10}" + "".join(f"{figures.get(c, '-')!s:>15}" for c in columns))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
