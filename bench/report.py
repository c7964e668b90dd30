"""The derived numbers of ``run.py``'s records, and the report's markdown tables."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from harness import GB, MB
from measure import STRATEGIES
from timing import markdown_table, ratio
from workloads import WORKLOADS

if TYPE_CHECKING:
    from collections.abc import Iterable


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


def epoch1_seconds(record: dict[str, Any] | None) -> float | None:
    """Epoch-1 seconds of a successful record, else None."""
    if record is None or record.get("status") != "ok" or not record.get("epochs"):
        return None
    return record["epochs"][0].get("seconds")


def add_ratios(records: list[dict[str, Any]]) -> None:
    """Add ratios to tf.data's caches of the same workload and size, from the same run.

    Epoch-2 throughput vs ``save_load`` (``ratio_vs_load``), ``memory`` (``ratio_vs_cache``)
    and ``file`` (``ratio_vs_file``); epoch-1 time vs the bare pipeline ``none``
    (``epoch1_vs_bare``: 1.0 costs nothing over computing the source).
    """
    by_key = {(r["workload"], r["n"], r["strategy"]): r for r in records}
    for record in records:
        rate = epoch2_rate(record)
        for ratio_key, baseline in (
            ("ratio_vs_load", "save_load"),
            ("ratio_vs_cache", "memory"),
            ("ratio_vs_file", "file"),
        ):
            base = epoch2_rate(by_key.get((record["workload"], record["n"], baseline)))
            record[ratio_key] = rate / base if rate is not None and base else None
        bare = epoch1_seconds(by_key.get((record["workload"], record["n"], "none")))
        mine = epoch1_seconds(record)
        record["epoch1_vs_bare"] = mine / bare if mine is not None and bare else None


MISSING = "-"
#: How the report names each strategy (the keys are the ``--strategies`` names).
LABELS = {
    "none": "no cache (bare pipeline)",
    "memory": "`ds.cache()`",
    "file": "`ds.cache(filename)`",
    "save_load": "`Dataset.save`/`load`",
    "shardcache": "shardcache, gRPC",
    "shardcache_direct": "shardcache, direct",
    "shardcache_plane": "shardcache, data plane",
}


def label(strategy: str) -> str:
    """The report's name of a strategy."""
    return LABELS.get(strategy, strategy)


def size_text(workload: str, n: int) -> str:
    """``1,000 (0.60 GB)``: elements and payload."""
    return f"{n:,} ({WORKLOADS[workload].dataset_bytes(n) / GB:.2f} GB)"


def _num(value: float | None, digits: int = 0) -> str:
    return MISSING if value is None else f"{value:,.{digits}f}"


def _seconds(value: float | None, spread: list[float] | None = None) -> str:
    if value is None:
        return MISSING

    def fmt(x: float) -> str:
        return f"{x:.3f}" if x < 1 else f"{x:.2f}"

    if spread is None or len(spread) < 2:
        return fmt(value)
    return f"{fmt(value)} ({fmt(min(spread))}-{fmt(max(spread))})"


def _ratio(value: float | None, bold: bool = False) -> str:
    return ratio(value, 1.0, bold, MISSING)


def problems(record: dict[str, Any]) -> list[str]:
    """Human-readable problems with a record (failure, wrong element count or checksum)."""
    if record.get("status") != "ok":
        return [f"{record.get('status')}: {record.get('error')}"]
    found = []
    for index, epoch in enumerate(record["epochs"], start=1):
        if not epoch.get("elements_ok", True):
            found.append(f"epoch {index} yielded {epoch['elements']} elements")
        if epoch.get("label_sum_ok") is False:
            found.append(f"epoch {index} label checksum mismatch")
    return found


class Footnotes:
    """Numbered footnotes for table cells."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, record: dict[str, Any]) -> str:
        """`` [n]`` for a record with problems (one footnote each), else the empty string."""
        found = problems(record)
        if not found:
            return ""
        self.texts.append("; ".join(found))
        return f" [{len(self.texts)}]"

    def render(self) -> list[str]:
        if not self.texts:
            return []
        return ["", *(f"[{i}] {text}" for i, text in enumerate(self.texts, 1))]


def _epochs(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    epochs = record.get("epochs", []) if record.get("status") == "ok" else []
    return (epochs[0] if epochs else {}), (epochs[1] if len(epochs) > 1 else {})


def render_epoch2_table(records: list[dict[str, Any]]) -> str:
    """Epoch 2 (reading the cache) per workload, size and strategy, with ratios."""
    columns = (
        "workload",
        "size (elements, GB)",
        "strategy",
        "epoch 2 s",
        "elements/s",
        "MB/s",
        "vs `ds.cache()`",
        "vs `cache(filename)`",
        "vs `Dataset.load`",
        "peak RssAnon MB",
    )
    lines = markdown_table(columns, []).splitlines()
    notes = Footnotes()
    for record in records:
        _, e2 = _epochs(record)
        spreads = record.get("repeat_epoch_seconds") or []
        ours = record["strategy"].startswith("shardcache")
        peak = record.get("peak_rss_anon_mb") if record.get("status") == "ok" else None
        lines.append(
            "| "
            + " | ".join(
                [
                    record["workload"],
                    size_text(record["workload"], record["n"]),
                    label(record["strategy"]) + notes.mark(record),
                    _seconds(e2.get("seconds"), spreads[1] if len(spreads) > 1 else None),
                    _num(e2.get("elements_per_s")),
                    _num(e2.get("mb_per_s"), 1),
                    _ratio(record.get("ratio_vs_cache"), ours),
                    _ratio(record.get("ratio_vs_file"), ours),
                    _ratio(record.get("ratio_vs_load"), ours),
                    _num(peak),
                ]
            )
            + " |"
        )
    return "\n".join(lines + notes.render())


#: The epoch-1 table's columns: every strategy that caches, against the bare pipeline.
EPOCH1_STRATEGIES = tuple(s for s in STRATEGIES if s != "none")


def render_epoch1_table(records: list[dict[str, Any]]) -> str:
    """Epoch 1 (filling the cache) as a ratio to the bare pipeline, one row per size."""
    present = [s for s in EPOCH1_STRATEGIES if any(r["strategy"] == s for r in records)]
    columns = ["workload", "size (elements, GB)", "bare pipeline s", *(label(s) for s in present)]
    lines = markdown_table(columns, []).splitlines()
    notes = Footnotes()
    keys = list(dict.fromkeys((r["workload"], r["n"]) for r in records))
    for workload, n in keys:
        mine = {r["strategy"]: r for r in records if (r["workload"], r["n"]) == (workload, n)}
        bare = mine.get("none")
        cells = [
            workload,
            size_text(workload, n),
            _seconds(epoch1_seconds(bare)) + (notes.mark(bare) if bare else ""),
        ]
        for strategy in present:
            record = mine.get(strategy)
            if record is None:
                cells.append(MISSING)
                continue
            seconds = epoch1_seconds(record)
            ratio = record.get("epoch1_vs_bare")
            text = _ratio(ratio, strategy.startswith("shardcache"))
            cells.append(
                (f"{text} ({_seconds(seconds)} s)" if seconds is not None else text)
                + notes.mark(record)
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + notes.render())


def render_memory_table(section: dict[str, Any]) -> str:
    """The memory section: client peak RssAnon (and epoch-2 MB/s) per size and strategy."""
    records = section.get("records", [])
    strategies = list(section.get("strategies", []))
    columns = ["dataset GiB (elements)"]
    for strategy in strategies:
        columns.append(f"{label(strategy)}: client peak RssAnon MB")
        if strategy.startswith("shardcache"):
            columns += [f"{label(strategy)}: daemon MB", f"{label(strategy)}: epoch 2 MB/s"]
    lines = markdown_table(columns, []).splitlines()
    notes = Footnotes()
    for gib in section.get("sizes_gib", []):
        row = [r for r in records if r.get("dataset_gib") == gib]
        if not row:
            continue
        cells = [f"{gib:g} ({row[0]['n']:,})"]
        for strategy in strategies:
            record = next((r for r in row if r["strategy"] == strategy), None)
            status = record.get("status") if record else None
            if record is None:
                cell = MISSING
            elif status == "oom_killed":
                cell = "**OOM-killed**"
            elif status == "skipped":
                cell = "not run (killed at a smaller size)"
            else:
                cell = _num(record.get("peak_rss_anon_mb") if status == "ok" else None)
                cell += notes.mark(record)
            cells.append(cell)
            if strategy.startswith("shardcache"):
                ok = record is not None and status == "ok"
                _, e2 = _epochs(record) if ok else ({}, {})
                cells += [
                    _num(record.get("daemon_peak_rss_anon_mb") if ok else None),
                    _num(e2.get("mb_per_s"), 0),
                ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + notes.render())


def render_growth_table(growth: dict[str, Any]) -> str:
    """The memory section's growth table: per read path, the read epoch's peak and end
    RssAnon at each multiple of the base size (the median of the runs), and their growth
    from the first to the last."""
    records, factors = growth.get("records", []), growth.get("factors", [])
    base = growth.get("base_bytes", 0) / MB
    columns = ["read path"]
    for factor in factors:
        columns += [f"{factor}x ({factor * base:,.0f} MB): peak MB", f"{factor}x: end MB"]
    columns += [
        f"growth {factors[0]}x -> {factors[-1]}x: peak MB",
        "growth: end MB",
        f"{factors[-1]}x: MB/s",
    ]
    lines = markdown_table(columns, []).splitlines()
    notes = Footnotes()
    for strategy in growth.get("paths", []):
        cells: list[str] = [label(strategy)]
        peaks: dict[int, float | None] = {}
        ends: dict[int, float | None] = {}
        by_factor: dict[int, dict[str, Any]] = {}
        for factor in factors:
            runs = [r for r in records if r["strategy"] == strategy and r["factor"] == factor]
            ok = [_epochs(r)[0] for r in runs if r.get("status") == "ok"]
            failed = next((r for r in runs if r.get("status") != "ok"), None)
            by_factor[factor] = failed or (runs[0] if runs else {})
            peaks[factor] = _median([e["peak_rss_anon_mb"] for e in ok])
            ends[factor] = _median([e["end_rss_anon_mb"] for e in ok])
            mark = notes.mark(failed) if failed is not None else ""
            cells += [_num(peaks[factor]) + mark, _num(ends[factor])]
        first, last = factors[0], factors[-1]
        for values in (peaks, ends):
            low, high = values[first], values[last]
            cells.append(MISSING if low is None or high is None else f"{high - low:+,.0f}")
        last_record = by_factor.get(last)
        cells.append(_num(_epochs(last_record)[0].get("mb_per_s") if last_record else None))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + notes.render())


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _range(values: Iterable[float]) -> str:
    """Format the range of ``values`` as ``lo to hi`` (or one number if they round equal)."""
    items = sorted(values)
    lo, hi = f"{items[0]:,.0f}", f"{items[-1]:,.0f}"
    return lo if lo == hi else f"{lo} to {hi}"


def render_notes(records: list[dict[str, Any]], daemons: list[dict[str, Any]]) -> str:
    """Secondary facts: baseline RSS, on-disk sizes, the shardcache daemon's memory."""
    lines = []
    mine = [r for r in records if "warm_rss_anon_mb" in r]
    if mine:
        lines.append(
            "- RssAnon of a measurement process after `import tensorflow`: "
            f"{_range(r['baseline_rss_anon_mb'] for r in mine)} MB; after the warm-up: "
            f"{_range(r['warm_rss_anon_mb'] for r in mine)} MB (both included in the peaks)."
        )
    for workload, n in dict.fromkeys((r["workload"], r["n"]) for r in records):
        payload = WORKLOADS[workload].dataset_bytes(n)
        sizes = []
        for record in records:
            if (record["workload"], record["n"]) != (workload, n) or record["status"] != "ok":
                continue
            disk = record.get("disk_bytes") or record.get("daemon_disk_bytes")
            if disk:
                sizes.append(f"{label(record['strategy'])} {payload / disk:.2f}")
        if sizes:
            lines.append(f"- Payload/disk, {workload} {n:,}: " + ", ".join(sizes) + ".")
    for daemon in daemons:
        if daemon.get("status") != "ok":
            lines.append(f"- `{daemon['workload']}`: no daemon, {daemon.get('error')}")
            continue
        peaks = [
            r["daemon_peak_rss_anon_mb"]
            for r in records
            if r["workload"] == daemon["workload"] and "daemon_peak_rss_anon_mb" in r
        ]
        lines.append(
            f"- cacheserver daemon ({daemon['workload']}), not in the client's column: RssAnon "
            f"{daemon['start_rss_anon_mb']:,.0f} MB after start, peak "
            f"{_range(peaks) if peaks else MISSING} MB during the shardcache rows."
        )
    return "\n".join(lines)


def _machine_line(machine: dict[str, Any]) -> str:
    disk = machine.get("disk") or {}
    kind = {True: "flagged rotational by the kernel", False: "non-rotational"}.get(
        disk.get("rotational"), ""
    )
    where = (
        f"; cache files on {disk.get('filesystem')} on {disk.get('device')} "
        f"({disk.get('size_gb')} GB{', ' + kind if kind else ''})"
        if disk
        else ""
    )
    return (
        f"{machine['nproc']} cores ({machine['cpu_model']}), {machine['mem_total_gib']} GiB "
        f"RAM{where}; {machine['platform']}; Python {machine['python']}, TensorFlow "
        f"{machine['tensorflow']}"
    )


def machine_line(machine: dict[str, Any]) -> str:
    """Where a payload was measured: the one line a report states it in (the date and the
    revision stay in the raw results; the report describes the figures, not their history)."""
    return f"Measured on {_machine_line(machine)}."


def group_header(
    payload: dict[str, Any], extra: tuple[str, ...] = (), with_machine: bool = True
) -> list[str]:
    """The lines each table group opens with: command, machine (unless the report states it
    once)."""
    machine = payload["machine"]
    quick = (
        " (**the quick configuration**: small sizes, for checking a change, not for quoting)"
        if payload.get("quick")
        else ""
    )
    return [
        f"- Command: `{payload['command']}`{quick}",
        *([f"- Machine: {_machine_line(machine)}"] if with_machine else []),
        *extra,
        "",
    ]


SERVER_NAMES = {"seaweedfs": "SeaweedFS", "moto": "moto (server mode)"}


def _raw_of(entry: dict[str, Any], client: str) -> dict[str, Any] | None:
    found = [r for r in entry.get("raw", []) if r["client"] == client and r["status"] == "ok"]
    return found[0] if found else None


def render_store(section: dict[str, Any], with_machine: bool = True) -> list[str]:
    """The object store tier's tables, from one run of ``store.py`` (``with_machine=False``: in
    a report that states the machine once)."""
    config = section["config"]
    lines = ["### The object store tier", ""]
    if section.get("error"):
        return [*lines, f"Not measured: {section['error']}", ""]
    what = (
        f"- Raw: {config['objects']} objects of {config['object_mib']} MiB of random bytes, one "
        "at a time, file to store and back; publish and pull: a cache of "
        f"{config['cache_mib']} MiB ({config['element_bytes'] // 1024} KiB elements of random "
        "int32) written with `cc.cache`; servers on loopback, on the machine's own disk"
    )
    lines += group_header(section, (what,), with_machine)
    raw_rows: list[list[str]] = []
    tier_rows: list[list[str]] = []
    for entry in section["servers"]:
        server = SERVER_NAMES.get(entry["server"], entry["server"])
        if entry.get("status") != "ok":
            raw_rows.append([server, MISSING, entry.get("error", "not run")[:120], ""])
        for raw in entry.get("raw", []):
            raw_rows.append(
                [
                    server,
                    raw["client"],
                    _num(raw.get("put_mb_per_s")),
                    _num(raw.get("get_mb_per_s")),
                ]
                if raw["status"] == "ok"
                else [server, raw["client"], f"{raw['status']}: {raw['error'][:120]}", ""]
            )
        t, boto3 = entry.get("tier"), _raw_of(entry, "boto3") or {}
        if t and t.get("status") != "ok":
            tier_rows.append([server, f"{t.get('status')}: {t.get('error', '')[:200]}"])
        elif t:
            rounds = t.get("rounds", [])  # none in records from before the pulls had rounds
            to_disk = (
                [
                    str(len(rounds)),
                    _num(statistics.median(r["raw_get_mb_per_s"] for r in rounds)),
                    f"{t['to_disk_s']:.2f}",
                    _num(t["to_disk_mb_per_s"]),
                    f"**{t['to_disk_vs_raw_get']:.2f}x**",
                ]
                if rounds
                else ["1", _num(boto3.get("get_mb_per_s")), MISSING, MISSING, MISSING]
            )
            tier_rows.append(
                [
                    server,
                    f"{t['stored_bytes'] / MB:,.0f} ({t['shards']})",
                    f"{t['publish_s']:.2f}",
                    _num(t["publish_mb_per_s"]),
                    ratio(t["publish_mb_per_s"], boto3.get("put_mb_per_s"), True),
                    *to_disk,
                    f"{t['pull_s']:.2f}",
                    f"{t['pull_vs_raw_get']:.2f}x"
                    if rounds
                    else ratio(t["pull_mb_per_s"], boto3.get("get_mb_per_s")),
                    f"{t['first_element_s']:.2f}",
                ]
            )
    lines += [
        "What the store moves through each client library (MB/s of object bytes; boto3 "
        "as the daemon uses it):",
        "",
        markdown_table(["store", "client", "PUT MB/s", "GET MB/s"], raw_rows),
    ]
    if tier_rows:
        lines += [
            "",
            "shardcache's publish (commit to STORED, ratio to the raw boto3 PUT above) "
            "and pulls into a cold daemon, each right after a raw boto3 GET of the same "
            "store: the pull to disk (from the read's `iter` to STORED: every shard "
            "fetched, checked, synced and in place) and the pull and read (from "
            "`cc.dataset` to the last element); medians of the rounds, and the median "
            "of each round's ratio to its raw GET:",
            "",
            markdown_table(
                [
                    "store",
                    "cache MB (shards)",
                    "publish s",
                    "publish MB/s",
                    "vs raw PUT",
                    "rounds",
                    "raw GET MB/s",
                    "pull to disk s",
                    "pull to disk MB/s",
                    "vs raw GET",
                    "pull and read s",
                    "vs raw GET",
                    "first element s",
                ],
                tier_rows,
            ),
        ]
    return [*lines, ""]
