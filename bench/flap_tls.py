"""`bench flap --tls`: stillhere flapped a second time over TLS, right after the plain run
and with the same phones, schedule and seed, to show what TLS costs a reconnect.

Each reconnect of a phone over TLS is a new TLS connection before its hello. The server
hands out session tickets (the standard library's default: two per TLS 1.3 connection), so
a phone's TLS stack can resume the session on its next connection, skipping the
certificate and the key exchange's signature; browsers and phone HTTP stacks do. These
phones cannot: asyncio's connections take no TLS session to resume (there is no such
parameter), so every reconnect here is a full handshake, the most TLS can cost. The run's
authority and server certificate are made with the system's openssl
(bench/certificates.py), and the phones verify the certificate against it.
Compared: the resume time at the phones (an SSE phone's from the request's start, so it
holds the connection and its TLS handshake; a WebSocket phone's from its upgrade's end,
after them) and the server's CPU during the flapping, every handshake included, per say.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.certificates import Authority, Pair

FlapOne = Callable[[tuple[Pair, Path]], Awaitable[dict[str, Any]]]


async def measure(flap_over_tls: FlapOne, root: Path, plain: dict[str, Any]) -> dict[str, Any]:
    """Flap stillhere over TLS (`flap_over_tls` given the certificate and the authority's
    file); the figures of both runs side by side, and their ratios."""
    authority = Authority.make(root / "tls-ca")
    over_tls = await flap_over_tls((authority.issue("server"), authority.ca_file))
    side = {"plain": figures(plain), "tls": figures(over_tls)}
    ratios = {
        key: _ratio(side["tls"][key], side["plain"][key])
        for key in ("resume_p50_ms", "resume_p99_ms", "server_cpu_ms_per_say")
    }
    return {**side, "tls_over_plain": ratios}


def figures(run: dict[str, Any]) -> dict[str, Any]:
    """What the comparison reads of one flapping run."""
    resume = run.get("resume_ms") or {}
    cpu = run.get("cpu_s_during_flapping") or {}
    says = run.get("says") or 0
    server_s = cpu.get("server")
    return {
        "url": run.get("url"),
        "reconnects": run.get("reconnects"),
        "resumed": run.get("resumed"),
        "says": says,
        "resume_p50_ms": resume.get("p50"),
        "resume_p99_ms": resume.get("p99"),
        "server_cpu_s": server_s,
        "server_cpu_ms_per_say": round(server_s * 1000 / says, 2) if server_s and says else None,
        "steal_s": cpu.get("steal"),
        "machine_busy_s": cpu.get("machine"),
        "wall_s": cpu.get("wall"),
        "lost": sum(run.get(k) or 0 for k in ("lost_says", "lost_replies", "lost_events")),
    }


def problems(report: dict[str, Any]) -> list[str]:
    """What the TLS run lost, as `problems` in bench/flap.py lists the plain run's."""
    lost = ((report.get("tls") or {}).get("tls") or {}).get("lost")
    return [f"over TLS: {lost} says, replies or events lost"] if lost else []


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def lines(report: dict[str, Any]) -> list[str]:
    """The table's rows for `report["tls"]`, if the run had one."""
    tls = report.get("tls")
    if not tls:
        return []
    rows = [f"  {'over TLS vs plain':<19}{'plain':>10}{'TLS':>10}{'ratio':>8}"]
    for key, label in (
        ("reconnects", "reconnects"),
        ("resume_p50_ms", "resume p50 ms"),
        ("resume_p99_ms", "resume p99 ms"),
        ("server_cpu_ms_per_say", "server CPU ms/say"),
        ("lost", "lost"),
    ):
        ratio = tls["tls_over_plain"].get(key)
        rows.append(
            f"  {label:<19}{tls['plain'][key]!s:>10}{tls['tls'][key]!s:>10}"
            f"{'' if ratio is None else ratio!s:>8}"
        )
    return rows
