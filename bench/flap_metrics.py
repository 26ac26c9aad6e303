"""The server's own account of its hellos, read from its `/metrics`.

The phones time a resume from the hello going out to the welcome coming in, so their
figure also holds the time each frame waits in a busy loop, the server's or the bench's
own. The server's `stillhere_hello_seconds` histogram holds only the server's handling
(hello read to welcome and replay queued). Read before and after the flapping, the
difference is the flapping's resuming hellos, and its buckets bound each percentile from
above.
"""

from __future__ import annotations

import math

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

HELLO_BUCKET = "stillhere_hello_seconds_bucket"


async def hello_buckets(base_url: str) -> dict[float, float]:
    """Cumulative counts of resuming hellos by upper bound in seconds (`le`), from a
    running server. (A hello that starts a new conversation after a `leave` first waits
    for the old one to be archived: not a resume.)"""
    async with aiohttp.ClientSession() as http, http.get(base_url + "/metrics") as response:
        response.raise_for_status()
        text = await response.text()
    return {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == HELLO_BUCKET and sample.labels.get("outcome") == "resumed"
    }


def bounded_percentiles(
    before: dict[float, float], after: dict[float, float], points: tuple[int, ...] = (50, 95, 99)
) -> dict[str, float | None]:
    """For each percentile, the smallest bucket bound (ms) under which it lies, for the
    hellos counted between `before` and `after`; None for one above the last finite bound."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    out: dict[str, float | None] = {"n": total}
    for point in points:
        rank = math.ceil(total * point / 100)
        bound = next((b for b, c in zip(bounds, counts, strict=True) if c >= rank), math.inf)
        out[f"p{point}_le"] = round(bound * 1000.0, 3) if math.isfinite(bound) and total else None
    return out
