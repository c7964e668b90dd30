"""``cacheserver top``: a live view of one daemon, from its /metrics and its cache list.

Scrapes of ``/metrics`` every ``--interval`` seconds give the rates, over the last
``WINDOW_S`` seconds (readers report every 5 s: a shorter window would jump between 0 and
twice the rate): each reader's elements/s, bytes/s and input stall (the share of the time
its consumer waited for a chunk, docs/operations.md "Readers"), the daemon's bytes served,
and its object-store requests and transfers. The caches come from ListCaches
(``--target``). The frame is drawn with rich and redrawn in place; ``--once`` prints one
frame, its rates over the one ``--interval``, and exits.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

#: (metric, labels as a sorted tuple) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
METRICS_ENV = "SHARDCACHE_METRICS_URL"
DEFAULT_METRICS = "http://127.0.0.1:9464/metrics"
_READER_KEYS = ("training_job", "rank", "cache", "path")
WINDOW_S = 15.0


def scrape(url: str, token: str = "") -> Samples:
    """One scrape of /metrics as {(sample name, sorted labels): value}, with the daemon's
    --metrics-token-file token when it asks for one."""
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=10
        ) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(
            f"cannot read the daemon's metrics at {url}: {exc}; start it with "
            "--metrics-listen HOST:PORT and pass --metrics http://HOST:PORT/metrics"
        ) from exc
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@dataclass
class Reader:
    """One reader's rates over the interval."""

    labels: dict[str, str]
    elements_per_s: float = 0.0
    bytes_per_s: float = 0.0
    stall: float = 0.0  # the share of the interval its consumer waited
    chunk_ms: float = 0.0  # mean seconds per chunk, in ms


@dataclass
class Frame:
    """What one frame shows: readers, the daemon's totals and rates, the caches."""

    readers: list[Reader] = field(default_factory=list)
    served_per_s: float = 0.0
    disk_bytes: float = 0.0
    capacity_bytes: float = 0.0
    free_bytes: float = 0.0
    store_requests: dict[str, tuple[float, float]] = field(default_factory=dict)  # total, /s
    store_bytes: dict[str, tuple[float, float]] = field(default_factory=dict)
    caches: list[Any] = field(default_factory=list)


def _by_labels(samples: Samples, name: str, keys: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for (sample, labels), value in samples.items():
        if sample == name:
            d = dict(labels)
            out[tuple(d.get(k, "") for k in keys)] += value
    return out


def frame(before: Samples, after: Samples, seconds: float, caches: list[Any]) -> Frame:
    """The frame of two scrapes seconds apart."""
    seconds = max(seconds, 1e-9)

    def rate(name: str, keys: tuple[str, ...] = ()) -> dict[tuple[str, ...], float]:
        old, new = _by_labels(before, name, keys), _by_labels(after, name, keys)
        return {k: max(0.0, v - old.get(k, 0.0)) / seconds for k, v in new.items()}

    out = Frame(caches=caches)
    elements = rate("shardcache_reader_elements_total", _READER_KEYS)
    nbytes = rate("shardcache_reader_bytes_total", _READER_KEYS)
    stall = rate("shardcache_reader_stall_seconds_total", _READER_KEYS)
    chunk_s = rate("shardcache_reader_chunk_seconds_total", _READER_KEYS)
    chunks = rate("shardcache_reader_chunks_total", _READER_KEYS)
    for key in sorted(_by_labels(after, "shardcache_reader_elements_total", _READER_KEYS)):
        out.readers.append(
            Reader(
                dict(zip(_READER_KEYS, key)),
                elements.get(key, 0.0),
                nbytes.get(key, 0.0),
                min(1.0, stall.get(key, 0.0)),
                1000 * chunk_s.get(key, 0.0) / chunks[key] if chunks.get(key) else 0.0,
            )
        )
    out.served_per_s = sum(rate("shardcache_read_bytes_total", ("plane",)).values())
    totals = {name: value for (name, labels), value in after.items() if not labels}
    out.disk_bytes = totals.get("shardcache_disk_bytes", 0.0)
    out.capacity_bytes = totals.get("shardcache_capacity_bytes", 0.0)
    out.free_bytes = totals.get("shardcache_disk_free_bytes", 0.0)
    for name, label in (
        ("shardcache_store_requests_total", "op"),
        ("shardcache_store_bytes_total", "direction"),
    ):
        into = out.store_requests if label == "op" else out.store_bytes
        per_s = rate(name, (label,))
        for labels, value in sorted(_by_labels(after, name, (label,)).items()):
            into[labels[0]] = (value, per_s.get(labels, 0.0))
    return out


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _store_cell(c: Any) -> str:
    """A cache's store state; for one larger than the daemon's room (partially resident),
    how much of it is here and its hit ratio: PULLING 4/16 resident, hit 0.25."""
    if c.store_state == "PULLING" and c.resident_reads + c.streamed_reads:
        return f"{c.store_state} {c.resident_shards}/{c.num_shards} resident, hit {c.hit_ratio:.2f}"
    return c.store_state or "-"


def render(f: Frame, where: str) -> Any:
    """The frame as rich renderables, one under the other."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text.assemble(
        ("shardcache top", "bold"),
        f"  {where}  {time.strftime('%H:%M:%S')}\n",
        f"served {_size(f.served_per_s)}/s   disk {_size(f.disk_bytes)}"
        + (f" of {_size(f.capacity_bytes)}" if f.capacity_bytes else "")
        + f"   free {_size(f.free_bytes)}",
    )
    readers = Table(title="readers", title_justify="left", expand=True)
    for column in ("TRAINING JOB", "RANK", "CACHE", "PATH"):
        readers.add_column(column)
    for column in ("ELEMENTS/S", "READ/S", "STALL", "CHUNK"):
        readers.add_column(column, justify="right")
    for r in f.readers:
        style = "red" if r.stall >= 0.5 else "yellow" if r.stall >= 0.05 else ""
        readers.add_row(
            *(r.labels[k] for k in _READER_KEYS),
            f"{r.elements_per_s:,.0f}",
            f"{_size(r.bytes_per_s)}/s",
            Text(f"{100 * r.stall:.0f}%", style),
            f"{r.chunk_ms:.1f} ms",
        )
    if not f.readers:
        readers.add_row("(no reader reported in the last 30 s)", "", "", "", "", "", "", "")
    caches = Table(title="caches", title_justify="left", expand=True)
    for column in ("NAME", "STATE", "ELEMENTS", "ON DISK", "HITS", "STORE"):
        caches.add_column(
            column, justify="right" if column in ("ELEMENTS", "ON DISK", "HITS") else "left"
        )
    for c in f.caches:
        caches.add_row(
            c.name,
            c.state,
            f"{c.num_elements:,}",
            _size(c.disk_bytes),
            str(c.hits),
            _store_cell(c),
        )
    if not any(t for t, _ in f.store_requests.values()):
        return Group(head, readers, caches)
    store = Table(
        title="object store (this daemon, since it started)", title_justify="left", expand=True
    )
    for column in ("", *f.store_requests, *(f"BYTES {d.upper()}" for d in f.store_bytes)):
        store.add_column(column, justify="right")
    if f.store_requests:
        store.add_row(
            "total",
            *(f"{t:,.0f}" for t, _ in f.store_requests.values()),
            *(_size(t) for t, _ in f.store_bytes.values()),
        )
        store.add_row(
            "per second",
            *(f"{r:,.1f}" for _, r in f.store_requests.values()),
            *(f"{_size(r)}/s" for _, r in f.store_bytes.values()),
        )
    return Group(head, readers, caches, store)


@click.command()
@click.option(
    "--metrics",
    "metrics_url",
    envvar=METRICS_ENV,
    default=DEFAULT_METRICS,
    show_default=True,
    help=f"The daemon's /metrics URL (serve --metrics-listen) [env: {METRICS_ENV}].",
)
@click.option(
    "--target",
    default=None,
    help="The daemon's address, for its caches: HOST:PORT or unix:///path.sock "
    "[default: $SHARDCACHE_TARGET, else 127.0.0.1:50051].",
)
@click.option(
    "--metrics-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File holding the token the daemon's /metrics asks for (serve "
    "--metrics-token-file). An https:// --metrics URL is checked against the "
    "system's CAs, or the bundle in $SSL_CERT_FILE.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between frames (and between the two scrapes of --once).",
)
@click.option("--once", is_flag=True, help="Print one frame and exit (no terminal needed).")
def top(
    metrics_url: str,
    target: str | None,
    metrics_token_file: Path | None,
    interval: float,
    once: bool,
) -> None:
    """A live view of a daemon: its readers (rates, input stall), caches, store transfers.

    A reader's STALL is the share of the time its training loop asked for data the
    cache did not have ready yet: near 100% the job waits on its input, near 0% the
    cache keeps ahead (timed where the loop's pipeline is wrapped in cc.timed(); 0 otherwise).
    Rates are over the last 15 s (readers report every 5 s); with --once, over one
    --interval: give it 5 or more. Ctrl-C exits.
    """
    from rich.console import Console
    from rich.live import Live

    from client import CacheClient, ShardcacheError

    def caches(cc: CacheClient) -> list[Any]:
        try:
            return cc.list()
        except ShardcacheError:
            return []

    try:
        token = metrics_token_file.read_text().strip() if metrics_token_file else ""
    except OSError as exc:
        raise click.ClickException(
            f"cannot read --metrics-token-file {metrics_token_file}: {exc.strerror}"
        ) from exc
    console = Console()
    with CacheClient(target, report=False) as cc:
        before, when = scrape(metrics_url, token), time.monotonic()
        time.sleep(interval)
        after, now = scrape(metrics_url, token), time.monotonic()
        shown = render(frame(before, after, now - when, caches(cc)), metrics_url)
        if once:
            console.print(shown)
            return
        seen = deque([(when, before), (now, after)])
        with Live(shown, console=console, screen=False, auto_refresh=False) as live:
            try:
                while True:
                    time.sleep(interval)
                    now = time.monotonic()
                    seen.append((now, scrape(metrics_url, token)))
                    while len(seen) > 2 and now - seen[1][0] >= WINDOW_S:
                        seen.popleft()
                    (when, before), (_, after) = seen[0], seen[-1]
                    live.update(
                        render(frame(before, after, now - when, caches(cc)), metrics_url),
                        refresh=True,
                    )
            except KeyboardInterrupt:
                pass
