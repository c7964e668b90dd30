"""The report's plots (matplotlib, Agg backend: no display needed), drawn from a results file.

- ``epoch2_throughput.png``: epoch-2 MB/s per strategy, one panel per workload, a bar per size;
- ``epoch1_cost.png``: epoch-1 time over the bare pipeline's, per strategy and workload size;
- ``memory_rss.png``: the client's peak anonymous RSS against the dataset size in the
  memory-limited cgroup, the limit drawn in, where ``ds.cache()`` was OOM-killed marked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from report import EPOCH1_STRATEGIES, GB, size_text
from workloads import WORKLOADS

GIB = 1 << 30
#: Plain names for plot labels (the report's table names carry markdown backticks).
NAMES = {
    "none": "no cache (bare)",
    "memory": "ds.cache()",
    "file": "ds.cache(filename)",
    "save_load": "Dataset.save/load",
    "save_load_gzip": "Dataset.save/load GZIP",
    "shardcache": "shardcache, gRPC",
    "shardcache_direct": "shardcache, direct",
    "shardcache_read": "shardcache, read only",
}
COLORS = {
    "none": "#9e9e9e",
    "memory": "#1f77b4",
    "file": "#2ca02c",
    "save_load": "#8c564b",
    "save_load_gzip": "#bcbd22",
    "shardcache": "#ff7f0e",
    "shardcache_direct": "#d62728",
}
DPI = 110


def _element_text(workload: str) -> str:
    size = WORKLOADS[workload].element_bytes
    return f"{size / 1000:,.0f} KB" if size >= 10_000 else f"{size:,} B"


def _ok(record: dict[str, Any]) -> bool:
    return record.get("status") == "ok" and len(record.get("epochs", [])) >= 2


def epoch2_throughput(records: list[dict[str, Any]], path: Path, subtitle: str) -> Path:
    """Horizontal bars: epoch-2 payload MB/s per strategy, one panel per workload."""
    workloads = list(dict.fromkeys(r["workload"] for r in records))
    strategies = list(dict.fromkeys(r["strategy"] for r in records))
    fig, axes = plt.subplots(len(workloads), 1, squeeze=False,
                             figsize=(9, 1.2 + 0.55 * len(strategies) * len(workloads)))
    for ax, workload in zip(axes[:, 0], workloads):
        sizes = sorted({r["n"] for r in records if r["workload"] == workload})
        height = 0.8 / len(sizes)
        for k, n in enumerate(sizes):
            for i, strategy in enumerate(strategies):
                record = next((r for r in records if (r["workload"], r["n"], r["strategy"])
                               == (workload, n, strategy)), None)
                y = i + (k - (len(sizes) - 1) / 2) * height
                if record is None or not _ok(record):
                    ax.text(0, y, "  failed" if record else "", va="center", fontsize=8)
                    continue
                value = record["epochs"][1]["mb_per_s"]
                ax.barh(y, value, height=height * 0.9, color=COLORS.get(strategy, "#555"),
                        alpha=1.0 if k == len(sizes) - 1 else 0.55)
                ax.text(value, y, f" {value:,.0f}" + (f"  ({n:,} el.)" if len(sizes) > 1
                                                       else ""), va="center", fontsize=7.5)
        ax.set_yticks(range(len(strategies)), [NAMES.get(s, s) for s in strategies])
        ax.invert_yaxis()
        ax.set_xlabel("epoch 2 throughput, MB/s of element payload (higher is better)")
        ax.set_xlim(right=ax.get_xlim()[1] * 1.18)
        sizes_text = ", ".join(size_text(workload, n) for n in sizes)
        ax.set_title(f"{workload}: {_element_text(workload)} elements; {sizes_text}"
                     + ("\n(darker bar: the largest size)" if len(sizes) > 1 else ""),
                     fontsize=9.5)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Epoch 2: reading the cache\n" + subtitle, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def epoch1_cost(records: list[dict[str, Any]], path: Path, subtitle: str) -> Path:
    """Grouped bars: epoch-1 time / the bare pipeline's, per workload size and strategy."""
    keys = list(dict.fromkeys((r["workload"], r["n"]) for r in records))
    strategies = [s for s in EPOCH1_STRATEGIES if any(r["strategy"] == s for r in records)]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.6 * len(keys) + 2), 4.6))
    width = 0.8 / max(1, len(strategies))
    for i, strategy in enumerate(strategies):
        xs, ys = [], []
        for j, key in enumerate(keys):
            record = next((r for r in records if (r["workload"], r["n"], r["strategy"])
                           == (*key, strategy)), None)
            if record and record.get("epoch1_vs_bare") is not None:
                xs.append(j + (i - (len(strategies) - 1) / 2) * width)
                ys.append(record["epoch1_vs_bare"])
        label = NAMES[strategy] + (" (write-through)" if strategy.startswith("shardcache")
                                   else "")
        bars = ax.bar(xs, ys, width * 0.92, label=label, color=COLORS.get(strategy))
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(keys)),
                  [f"{w} ({_element_text(w)})\n{n:,} el., {WORKLOADS[w].dataset_bytes(n) / GB:.2f}"
                   " GB" for w, n in keys], fontsize=8)
    ax.set_ylabel("epoch 1 time / bare pipeline's\n(lower is better)")
    top = max([b.get_height() for b in ax.patches] + [1.0])
    ax.set_ylim(0, top * 1.15)
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    ax.set_title("Epoch 1: filling the cache, as a multiple of computing the pipeline alone\n"
                 + subtitle, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def memory_rss(section: dict[str, Any], path: Path, subtitle: str) -> Path:
    """Lines: client peak RssAnon (GiB) vs dataset size (GiB) in the memory-limited cgroup."""
    limit = section["limit_bytes"] / GIB
    records = section.get("records", [])
    fig, ax = plt.subplots(figsize=(8, 5))
    sizes = section.get("sizes_gib", [])
    for strategy in section.get("strategies", []):
        mine = [r for r in records if r["strategy"] == strategy]
        ok = [r for r in mine if r.get("status") == "ok"]
        xs = [r["dataset_gib"] for r in ok]
        ys = [r["peak_rss_anon_mb"] * 1e6 / GIB for r in ok]
        color = COLORS.get(strategy)
        ax.plot(xs, ys, marker="o", color=color, label=f"{NAMES[strategy]}: client")
        if strategy.startswith("shardcache"):
            daemon = [(r["dataset_gib"], r["daemon_peak_rss_anon_mb"] * 1e6 / GIB) for r in ok
                      if "daemon_peak_rss_anon_mb" in r]
            if daemon:
                ax.plot(*zip(*daemon), linestyle=":", marker=".", color=color,
                        label=f"{NAMES[strategy]}: daemon")
        killed = next((r for r in mine if r.get("status") == "oom_killed"), None)
        if killed is not None:
            x = killed["dataset_gib"]
            ax.plot([*xs[-1:], x], [*ys[-1:], limit], linestyle="--", color=color)
            ax.plot([x], [limit], marker="X", markersize=13, color="black", linestyle="none")
            ax.annotate(f"{NAMES[strategy]}\nOOM-killed at {x:g} GiB", (x, limit),
                        textcoords="offset points", xytext=(8, -34), fontsize=8.5)
    ax.axhline(limit, color="black", linestyle="--", linewidth=1)
    ax.text(max(sizes or [limit]) * 1.06, limit, f"cgroup memory limit {limit:g} GiB "
            "(the measurement's RAM)", va="bottom", ha="right", fontsize=8.5)
    ax.axvline(limit, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("dataset size, GiB of element payload (602 KB elements)")
    ax.set_ylabel("peak anonymous RSS (RssAnon), GiB")
    ax.set_xlim(0, max(sizes or [limit]) * 1.08)
    ax.set_ylim(0, limit * 1.25)
    ax.legend(fontsize=8.5, loc="lower right", bbox_to_anchor=(1, 0.12))
    ax.set_title("Client memory against dataset size, past the memory available\n" + subtitle,
                 fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
