"""The server's own account of its hellos, its loop and its says, read from its `/metrics`.

The phones time a resume from the hello going out to the welcome coming in, so their
figure also holds the time each frame waits in a busy loop, the server's or the bench's
own. The server's `stillhere_hello_seconds` histogram holds only the server's handling
(hello read to welcome and replay queued), and `stillhere_loop_lag_seconds` how late its
loop ran a timer: the server's share of the waiting. `stillhere_gc_pause_seconds` times
each of its garbage collections, during which nothing in it ran. Read before and after the
flapping, the difference of each is the flapping's, and its buckets bound each percentile
(and the longest, p100) from above. `stillhere_resends_joined` counts the says resent while
their write was still pending, which waited on it rather than writing again.
"""

from __future__ import annotations

import contextlib
import math

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

Buckets = dict[float, float]  # cumulative count by upper bound in seconds (`le`)

# The report's key of each histogram read, its bucket series, and the labels kept. Only
# resuming hellos: one that starts a new conversation after a `leave` first waits for the
# old one to be archived.
HISTOGRAMS: dict[str, tuple[str, dict[str, str]]] = {
    "server_hello_ms": ("stillhere_hello_seconds_bucket", {"outcome": "resumed"}),
    "server_loop_lag_ms": ("stillhere_loop_lag_seconds_bucket", {}),
    **{
        f"server_gc{g}_ms": ("stillhere_gc_pause_seconds_bucket", {"generation": str(g)})
        for g in range(3)
    },
}


async def scrape(base_url: str, http: aiohttp.ClientSession | None = None) -> list[Sample]:
    """Every sample of one read of a running server's `/metrics` (with `http`, a session
    that reaches it: one verifying its certificate, over TLS)."""
    async with contextlib.AsyncExitStack() as stack:
        if http is None:
            http = await stack.enter_async_context(aiohttp.ClientSession())
        response = await stack.enter_async_context(http.get(base_url + "/metrics"))
        response.raise_for_status()
        text = await response.text()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


async def server_buckets(
    base_url: str, http: aiohttp.ClientSession | None = None
) -> dict[str, Buckets]:
    """The buckets of each of HISTOGRAMS, by report key, from one scrape of a running
    server (through `http`, as `scrape`)."""
    out: dict[str, Buckets] = {key: {} for key in HISTOGRAMS}
    for sample in await scrape(base_url, http):
        for key, (name, labels) in HISTOGRAMS.items():
            if sample.name == name and labels.items() <= sample.labels.items():
                out[key][float(sample.labels["le"])] = sample.value
    return out


async def server_count(
    base_url: str, name: str, http: aiohttp.ClientSession | None = None
) -> float | None:
    """The value of the sample `name` (a counter's ends in `_total`) in one scrape of a
    running server (through `http`, as `scrape`); None if it does not expose it."""
    samples = await scrape(base_url, http)
    return next((sample.value for sample in samples if sample.name == name), None)


def server_figures(
    before: dict[str, Buckets], after: dict[str, Buckets]
) -> dict[str, dict[str, float | None] | None]:
    """Each histogram's `bounded_percentiles` between two `server_buckets` reads; None for
    one the server does not expose."""
    return {
        key: bounded_percentiles(before[key], after[key]) if after[key] else None
        for key in HISTOGRAMS
    }


def bounded_percentiles(
    before: Buckets, after: Buckets, points: tuple[int, ...] = (50, 95, 99, 100)
) -> dict[str, float | None]:
    """For each percentile, the smallest bucket bound (ms) under which it lies, for the
    observations counted between `before` and `after`; None for one above the last finite
    bound."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    out: dict[str, float | None] = {"n": total}
    for point in points:
        rank = math.ceil(total * point / 100)
        bound = next((b for b, c in zip(bounds, counts, strict=True) if c >= rank), math.inf)
        out[f"p{point}_le"] = round(bound * 1000.0, 3) if math.isfinite(bound) and total else None
    return out
