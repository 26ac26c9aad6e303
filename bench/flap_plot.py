"""The flap bench's PNG: resume latency, live conversations, server RSS and the cores busy
(server, bench, the rest: mostly PostgreSQL) over time.

matplotlib is imported here only, and only when `--plot` is given (Agg backend, no display).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(path: Path, report: dict[str, Any], resume_points: list[tuple[float, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = report["series"]
    fig, axes = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    ax = axes[0]
    if resume_points:
        xs, ys = zip(*resume_points, strict=True)
        ax.scatter(xs, ys, s=3, alpha=0.4, color="tab:blue", label="hello -> welcome (reconnect)")
    ax.axhline(50.0, color="tab:red", linestyle="--", linewidth=1, label="target p99 50 ms")
    ax.set_yscale("log")
    ax.set_ylabel("resume latency (ms)")
    ax.legend(loc="upper right", fontsize=8)
    axes[1].plot(series["t"], series["live"], color="tab:green")
    axes[1].set_ylabel("live conversations\n(phones with a link up)")
    axes[2].plot(series["t"], series["rss_mb"], color="tab:purple")
    axes[2].set_ylabel("server RSS (MB)")
    lines = (
        ("server", "tab:blue", "server"),
        ("bench", "tab:orange", "bench"),
        ("other", "tab:gray", "other"),
        ("steal", "tab:red", "hypervisor (steal)"),
    )
    for key, color, label in lines:
        axes[3].plot(series["t"], series[f"cores_{key}"], color=color, label=label)
    axes[3].set_ylabel("cores busy")
    axes[3].legend(loc="upper right", fontsize=8)
    axes[3].set_xlabel("seconds since the flapping began")
    title = (
        f"stillhere flap: {report['clients']} phones, {report['transport']}, "
        f"{report['duration_s']:.0f} s, seed {report['seed']}"
    )
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
