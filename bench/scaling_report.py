"""Markdown for the "Scaling curves" section of docs/benchmarks.md (``bench/scaling.py``)."""

from __future__ import annotations

from typing import Any

from report import GB, MB
from workloads import WORKLOADS

NAMES = {"shardcache": "shardcache", "shardcache_read": "shardcache", "memory": "ds.cache()",
         "file": "cache(file)", "save_load": "Dataset.load"}


def _epoch2(record: dict[str, Any]) -> dict[str, Any] | None:
    if record.get("status") != "ok" or len(record.get("epochs", [])) < 2:
        return None
    return record["epochs"][1]  # type: ignore[no-any-return]


def _rate(record: dict[str, Any] | None) -> float | None:
    epoch = _epoch2(record) if record else None
    return epoch["elements_per_s"] if epoch else None


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value and base else "-"


def _daemon(record: dict[str, Any]) -> str:
    mb = record.get("daemon_peak_rss_anon_mb")
    return f"{mb:,.0f}" if mb and record["strategy"].startswith("shardcache") else "-"


def _row(record: dict[str, Any], extra: list[str], bases: tuple[float | None, ...] = ()) -> str:
    """A table row: ``extra`` cells, epoch 2, ratios of its rate to ``bases``, memory."""
    epoch = _epoch2(record)
    if epoch is None:
        return "| " + " | ".join([*extra, f"failed: {record.get('error')}"]) + " |"
    ratios = [_ratio(epoch["elements_per_s"], base) for base in bases]
    checks = "" if epoch.get("elements_ok") and epoch.get("label_sum_ok") is not False \
        else " (element check FAILED)"
    return "| " + " | ".join([
        *extra, f"{epoch['seconds']:.2f}{checks}", f"{epoch['elements_per_s']:,.0f}",
        f"{epoch['mb_per_s']:,.0f}", *ratios, f"{record['peak_rss_anon_mb']:,.0f}",
        _daemon(record),
    ]) + " |"


def _size_table(run: Any) -> list[str]:
    records = [r for r in run.records if r["section"] == "size"]
    if not records and not run.skipped:
        return []
    lines = ["| dataset | strategy | epoch 2 s | elements/s | MB/s | vs Dataset.load | "
             "vs ds.cache() | client peak RssAnon MB | daemon peak RssAnon MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    sizes = sorted({r["n"] for r in records} | {s["n"] for s in run.skipped
                                                if s["section"] == "size"})
    for n in sizes:
        at = [r for r in records if r["n"] == n]
        load = _rate(next((r for r in at if r["strategy"] == "save_load"), None))
        memory = _rate(next((r for r in at if r["strategy"] == "memory"), None))
        gb = n * WORKLOADS["flat-602k"].element_bytes / GB
        for r in at:
            name = NAMES[r["strategy"]] + (f" ({r['label']})" if r.get("label") else "")
            lines.append(_row(r, [f"{n:,} x 602 KB ({gb:.1f} GB)", name], (load, memory)))
        for s in (s for s in run.skipped if s["section"] == "size" and s["n"] == n):
            lines.append(f"| {n:,} x 602 KB ({gb:.1f} GB) | {NAMES[s['strategy']]} | "
                         f"not run: {s['why']} | | | | | | |")
    return lines


def _builds(run: Any) -> list[str]:
    if not run.builds:
        return []
    lines = ["", "Building the caches (write MB/s: payload over wall time; materialization's "
             "wall time includes starting its workers, each importing TensorFlow):", "",
             "| cache | how | wall s | payload MB/s | stored MB/s | steady payload MB/s "
             "(after the first stored element) |", "|---|---|---|---|---|---|"]
    for b in run.builds:
        stored = f"{b['stored_bytes'] / MB / b['seconds']:,.0f}" if b.get("stored_bytes") else "-"
        steady = f"{b['steady_bytes_per_s'] / MB:,.0f}" if b.get("steady_bytes_per_s") else "-"
        lines.append(f"| {b['n']:,} x 602 KB | {b['method']} | {b['seconds']:.1f} | "
                     f"{b['payload_bytes'] / MB / b['seconds']:,.0f} | {stored} | {steady} |")
    lines += ["", f"Larger sizes were built by {run.build_method} (least projected time for "
              "the largest size)."]
    return lines


def _ceilings(run: Any) -> list[str]:
    if not run.ceilings:
        return []
    lines = ["", "Read cold (sizes from `--cold-from-gib`, by default those above RAM; page "
             "cache dropped before epoch 2; the ceiling is a plain sequential `read()` of the "
             "same shard files, 1 MiB at a time, after dropping the page cache again, in the "
             "same run):", "",
             "| dataset | plain read of the shard files MB/s | shardcache epoch 2, file MB/s | "
             "vs plain read | shardcache epoch 2, payload MB/s |", "|---|---|---|---|---|"]
    for c in run.ceilings:
        lines.append(f"| {c['n']:,} x 602 KB ({c['file_bytes'] / GB:.1f} GB of files) | "
                     f"{c['file_mb_per_s']:,.0f} | {c['epoch_file_mb_per_s']:,.0f} | "
                     f"{c['epoch_file_mb_per_s'] / c['file_mb_per_s']:.2f}x | "
                     f"{c['epoch_payload_mb_per_s']:,.0f} |")
    return lines


def _element_table(run: Any) -> list[str]:
    records = [r for r in run.records if r["section"] == "element"]
    if not records:
        return []
    lines = ["| element | elements | strategy | epoch 2 s | elements/s | MB/s | vs Dataset.load "
             "| vs cache(file) | client peak RssAnon MB | daemon peak RssAnon MB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for workload in dict.fromkeys(r["workload"] for r in records):
        at = [r for r in records if r["workload"] == workload]
        load = _rate(next((r for r in at if r["strategy"] == "save_load"), None))
        file = _rate(next((r for r in at if r["strategy"] == "file"), None))
        size = WORKLOADS[workload].element_bytes
        label = f"{size / 1000:,.0f} KB" if size < MB else f"{size / MB:.1f} MB"
        for r in at:
            lines.append(_row(r, [label, f"{r['n']:,}", NAMES[r["strategy"]]], (load, file)))
    return lines


def _parallel_table(run: Any) -> list[str]:
    records = [r for r in run.records if r["section"] == "parallel"]
    if not records:
        return []
    base = _rate(next((r for r in records if r.get("parallel_shards") == 1
                       and not r.get("shuffle")), None))
    lines = [f"On the {records[0]['n']:,}-element cache (warm page cache):", "",
             "| read | epoch 2 s | elements/s | MB/s | vs k=1 in order | client peak RssAnon MB "
             "| daemon peak RssAnon MB |", "|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(_row(r, [f"parallel_shards={r['parallel_shards']}"
                              + (", shuffle=True" if r.get("shuffle") else "")], (base,)))
    return lines


def _profile(run: Any) -> list[str]:
    p = run.profile
    if not p:
        return []
    if "error" in p:
        return [f"Profile failed: {p['error']}"]
    wall = p["seconds"]
    lines = [f"One in-order epoch of the {p['elements']:,}-element cache in a fresh client: "
             f"{wall:.2f} s ({p['elements'] / wall:,.0f} elements/s). CPU over the epoch: "
             f"client {p['cpu_seconds']['client']:.2f} s ({p['cpu_seconds']['client'] / wall:.2f}"
             f" cores), daemon {p['cpu_seconds']['daemon']:.2f} s "
             f"({p['cpu_seconds']['daemon'] / wall:.2f} cores). Runnable but waiting for a CPU "
             f"(other processes had it): client {p['runqueue_wait_seconds']['client']:.2f} s, "
             f"daemon {p['runqueue_wait_seconds']['daemon']:.2f} s (summed over threads).", ""]
    lines += ["By thread name (`python`: the Python threads and TensorFlow's, which inherit "
              "the name; from `/proc/<pid>/task/*/schedstat`):", "",
              "| process | thread | CPU s | cores | run-queue wait s |", "|---|---|---|---|---|"]
    for role in ("client", "daemon"):
        for name, (seconds, waiting) in list(p["thread_cpu_seconds"][role].items())[:6]:
            if seconds >= 0.01 * wall:
                lines.append(f"| {role} | `{name}` | {seconds:.2f} | {seconds / wall:.2f} | "
                             f"{waiting:.2f} |")
    lines.append("")
    for role in ("client", "daemon"):
        frames = p["frames"][role]
        held = frames["samples"] / (p["rate_hz"] * wall)
        lines += [f"{role}: the GIL was held in {held:.0%} of py-spy's samples "
                  f"({frames['samples']:,}); by leaf function:", "",
                  "| function (GIL held) | share |", "|---|---|"]
        lines += [f"| `{name}` | {share:.0%} |" for name, share in frames["top"]]
        lines.append("")
    return lines


def render(run: Any, facts: dict[str, Any], command: str) -> str:
    """The whole markdown report of one run."""
    head = [
        f"Reproduce (from the repository root): `{command}`", "",
        f"- Machine: nproc={facts['nproc']}, {facts['cpu_model']}, {facts['mem_total_gib']} GiB "
        f"RAM, {facts['disk_free_gb_at_start']:.0f} GB free disk at the start",
        f"- Revision: {facts['git_revision'] or 'unknown'}; run at {facts['date_utc']}; "
        f"wall time {facts['wall_seconds'] / 60:.1f} min",
        f"- Load average (1/5/15 min): {facts['loadavg']} at the start, "
        f"{facts['loadavg_end']} at the end",
        "- Each row: one measure.py process (two epochs, epoch 2 shown; batches of "
        f"{run.args.batch_size}); MB = 10^6 bytes of payload; peak RssAnon over the whole "
        "process (TensorFlow import and warm-up included), the daemon's sampled meanwhile",
        f"- Client options: {dict(run.args.client_option) or 'none'}",
        "",
    ]
    parts = head
    for title, body in (("Dataset size (602 KB float32 elements)", _size_table(run)
                         + _builds(run) + _ceilings(run)),
                        ("Element size (about "
                         f"{run.args.element_total_gib:g} GiB each)", _element_table(run)),
                        ("parallel_shards", _parallel_table(run)),
                        ("Profile", _profile(run))):
        if body:
            parts += [f"#### {title}", "", *body, ""]
    return "\n".join(parts)
