"""Turn measurement records into the markdown pasted into ``docs/benchmarks.md``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workloads import WORKLOADS

if TYPE_CHECKING:
    from collections.abc import Iterable

GB = 1_000_000_000
MB = 1_000_000

COLUMNS = (
    "workload",
    "size (elements, GB)",
    "strategy",
    "epoch1 s",
    "epoch2 s",
    "epoch2 elem/s",
    "epoch2 MB/s",
    "peak RssAnon MB",
    "ratio vs load",
    "ratio vs cache()",
)
MISSING = "-"


def add_derived(record: dict[str, Any]) -> None:
    """Add per-epoch ``elements_per_s`` and ``mb_per_s`` (payload bytes) to ``record``."""
    element_bytes = WORKLOADS[record["workload"]].element_bytes
    for epoch in record.get("epochs", []):
        seconds = epoch["seconds"]
        epoch["elements_per_s"] = epoch["elements"] / seconds if seconds > 0 else None
        epoch["mb_per_s"] = (
            epoch["elements"] * element_bytes / MB / seconds if seconds > 0 else None
        )


def epoch2_rate(record: dict[str, Any] | None) -> float | None:
    """Epoch-2 elements/s of a successful record, else None."""
    if record is None or record.get("status") != "ok" or len(record.get("epochs", [])) < 2:
        return None
    return record["epochs"][1].get("elements_per_s")


def representative(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pick the run a table row shows: the first failed run, else the median epoch-2 time.

    The epoch times of all runs are attached as ``repeat_epoch_seconds`` (one list per epoch).
    """
    failed = [run for run in runs if run.get("status") != "ok"]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda run: run["epochs"][-1]["seconds"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["repeat_epoch_seconds"] = [
        [run["epochs"][i]["seconds"] for run in runs] for i in range(len(chosen["epochs"]))
    ]
    return chosen


def add_ratios(records: list[dict[str, Any]]) -> None:
    """Add epoch-2 throughput ratios vs ``save_load`` and vs ``memory`` of the same size."""
    by_key = {(r["workload"], r["n"], r["strategy"]): r for r in records}
    for record in records:
        rate = epoch2_rate(record)
        for ratio_key, baseline in (("ratio_vs_load", "save_load"), ("ratio_vs_cache", "memory")):
            base = epoch2_rate(by_key.get((record["workload"], record["n"], baseline)))
            record[ratio_key] = rate / base if rate is not None and base else None


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return MISSING
    return f"{value:,.{digits}f}"


def _seconds(value: float | None, spread: list[float] | None = None) -> str:
    if value is None:
        return MISSING

    def fmt(x: float) -> str:
        return f"{x:.3f}" if x < 1 else f"{x:.2f}"

    if spread is None or len(spread) < 2:
        return fmt(value)
    return f"{fmt(value)} ({fmt(min(spread))}-{fmt(max(spread))})"


def _ratio(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}x"


def _row(record: dict[str, Any], footnote: int | None) -> list[str]:
    workload = WORKLOADS[record["workload"]]
    n = record["n"]
    size = f"{n:,} ({workload.dataset_bytes(n) / GB:.2f} GB)"
    strategy = record["strategy"] + (f" [{footnote}]" if footnote is not None else "")
    epochs = record.get("epochs", []) if record.get("status") == "ok" else []
    e1 = epochs[0] if len(epochs) > 0 else {}
    e2 = epochs[1] if len(epochs) > 1 else {}
    peak = record.get("peak_rss_anon_mb") if record.get("status") == "ok" else None
    spreads = record.get("repeat_epoch_seconds") or []
    return [
        workload.name,
        size,
        strategy,
        _seconds(e1.get("seconds"), spreads[0] if len(spreads) > 0 else None),
        _seconds(e2.get("seconds"), spreads[1] if len(spreads) > 1 else None),
        _num(e2.get("elements_per_s")),
        _num(e2.get("mb_per_s"), 1),
        _num(peak),
        _ratio(record.get("ratio_vs_load")),
        _ratio(record.get("ratio_vs_cache")),
    ]


def _problems(record: dict[str, Any]) -> list[str]:
    """Human-readable problems with a record (failure, wrong element count or checksum)."""
    if record.get("status") != "ok":
        return [f"{record.get('status')}: {record.get('error')}"]
    problems = []
    for index, epoch in enumerate(record["epochs"], start=1):
        if not epoch.get("elements_ok", True):
            problems.append(f"epoch {index} yielded {epoch['elements']} elements")
        if epoch.get("label_sum_ok") is False:
            problems.append(f"epoch {index} label checksum mismatch")
    return problems


def render_table(records: list[dict[str, Any]]) -> str:
    """Render the results table, with footnotes for failed or suspicious rows."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    footnotes: list[str] = []
    for record in records:
        problems = _problems(record)
        footnote = None
        if problems:
            footnotes.append("; ".join(problems))
            footnote = len(footnotes)
        lines.append("| " + " | ".join(_row(record, footnote)) + " |")
    if footnotes:
        lines.append("")
        lines.extend(f"[{i}] {text}" for i, text in enumerate(footnotes, start=1))
    return "\n".join(lines)


def _range(values: Iterable[float]) -> str:
    """Format the range of ``values`` as ``lo to hi`` (or one number if they round equal)."""
    items = sorted(values)
    lo, hi = f"{items[0]:,.0f}", f"{items[-1]:,.0f}"
    return lo if lo == hi else f"{lo} to {hi}"


def render_notes(records: list[dict[str, Any]], daemons: list[dict[str, Any]]) -> str:
    """Render secondary facts: baseline RSS, on-disk sizes, shardcache daemon memory."""
    lines = ["Notes:", ""]
    for name in sorted({r["workload"] for r in records}):
        mine = [r for r in records if r["workload"] == name and "warm_rss_anon_mb" in r]
        if mine:
            lines.append(
                f"- `{name}`: RssAnon of a measurement process after `import tensorflow`: "
                f"{_range(r['baseline_rss_anon_mb'] for r in mine)} MB; after the warm-up, "
                f"before building the pipeline: {_range(r['warm_rss_anon_mb'] for r in mine)} MB "
                "(both included in the peaks above)."
            )
    for key in sorted({(r["workload"], r["n"]) for r in records}, key=lambda k: (k[0], k[1])):
        workload = WORKLOADS[key[0]]
        payload = workload.dataset_bytes(key[1])
        sizes = []
        for record in records:
            if (record["workload"], record["n"]) != key or record.get("status") != "ok":
                continue
            disk = record.get("disk_bytes") or record.get("daemon_disk_bytes")
            if disk:
                sizes.append(
                    f"{record['strategy']} {disk / GB:.3f} GB (payload/disk {payload / disk:.2f})"
                )
        if sizes:
            lines.append(
                f"- On-disk size, {key[0]} {key[1]:,} elements (payload {payload / GB:.3f} GB): "
                + ", ".join(sizes)
                + "."
            )
    for daemon in daemons:
        if daemon.get("status") != "ok":
            lines.append(f"- `{daemon['workload']}`: no daemon, {daemon.get('error')}")
            continue
        peaks = ", ".join(
            f"{r['n']:,} elements {r['daemon_peak_rss_anon_mb']:,.0f} MB"
            for r in records
            if r["workload"] == daemon["workload"] and "daemon_peak_rss_anon_mb" in r
        )
        lines.append(
            f"- cacheserver daemon (`{daemon['workload']}`), not included in the shardcache rows: "
            f"RssAnon {daemon['start_rss_anon_mb']:,.0f} MB after start; peak during the "
            f"shardcache run: {peaks or MISSING}."
        )
    return "\n".join(lines)
