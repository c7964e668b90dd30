"""The ``cacheserver`` command line: serve, ls, info, rm, pin, unpin, ttl, demo, materialize,
top."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import click

from cacheserver import __version__, config
from cacheserver.cli import TARGET_HELP
from client import CacheClient, ShardcacheError


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def _setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="cacheserver")
def main() -> None:
    """shardcache daemon and tools: a disk-backed dataset cache for tf.data.

    Run `cacheserver serve` on the host, then use client.CacheClient in the
    training process. `cacheserver demo` shows the whole thing end to end.
    """


@main.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="CACHESERVER_CONFIG",
    help="TOML file of settings (keys as in docs/operations.md); flags and "
    "CACHESERVER_* variables override it. [env: CACHESERVER_CONFIG]",
)
@config.click_options
def serve(config_file: Path | None, **flags: object) -> None:
    """Run the daemon until SIGTERM/SIGINT, then drain streams and exit 0; SIGHUP rereads
    --auth-file.

    Binds 127.0.0.1:50051 unless --listen says otherwise. Serves gRPC health
    checking (grpc.health.v1) and server reflection on every address. Every
    setting also comes from a CACHESERVER_<NAME> variable or the --config file
    (precedence: flag > environment > file > default; docs/operations.md).

    Materialization runs nothing until allowed: --materialize-allow MODULE
    lets clients run the entry points of MODULE and its submodules (put them on
    --pythonpath), --allow-shipped-pipelines the tf.data graphs they send.
    Both run as the daemon's user, reading any file it can: allow only code and
    clients you trust (docs/materialize.md).
    """
    from cacheserver.catalog.recovery import DataDirError
    from cacheserver.metrics import MetricsListenError
    from cacheserver.rpc.server import (
        CacheServer,
        LimitsError,
        ListenError,
        ServerConfig,
        StoreError,
    )
    from cacheserver.security import SecurityConfigError

    values, _ = config.resolve(flags, config_file)
    _setup_logging(values.pop("log_level"), values.pop("log_format"))
    values["listen"] = list(values["listen"])
    values["grace_seconds"] = values.pop("grace")
    values["pythonpath"] = [Path(p).resolve() for p in values["pythonpath"]]
    values["materialize_allow"] = list(values["materialize_allow"])
    try:
        server = CacheServer(ServerConfig(**values))
    except (
        ListenError,
        LimitsError,
        DataDirError,
        SecurityConfigError,
        MetricsListenError,
        StoreError,
        OSError,
    ) as exc:
        raise click.ClickException(str(exc)) from exc
    server.run_until_signal()


def _client(target: str | None):
    return _run(lambda: CacheClient(target))  # a bad $CACHESERVER_TOKEN or $SHARDCACHE_TLS_*


def _run(fn):
    try:
        return fn()
    except ShardcacheError as exc:
        raise click.ClickException(str(exc)) from exc


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError


@main.command("ls")
@click.option(
    "--store",
    is_flag=True,
    help="List what the daemon's object store holds instead (serve --store).",
)
@click.option("--target", default=None, help=TARGET_HELP)
def ls_(store: bool, target: str | None) -> None:
    """List the daemon's caches (STORE: where each stands in its object store)."""
    with _client(target) as cc:
        caches = _run(lambda: cc.list(store=store))
    if store:
        click.echo(
            f"{'NAME':<32} {'ELEMENTS':>12} {'SHARDS':>6} {'STORED':>11} "
            f"{'COMMITTED':<19} ON THIS DAEMON"
        )
        for c in caches:
            here = "no" if c.store_state == "REMOTE" else _store(c)
            click.echo(
                f"{c.name:<32} {c.num_elements:>12,} {c.num_shards:>6} "
                f"{_size(c.store_total_bytes or c.disk_bytes):>11} "
                f"{_when(c.commit_time):<19} {here}"
            )
        return
    click.echo(
        f"{'NAME':<32} {'STATE':<8} {'ELEMENTS':>12} {'SHARDS':>6} {'ON DISK':>11} "
        f"RATIO  {'LAST READ':<19} {'HITS':>6} RETENTION"
        + ("  STORE" if any(c.store_state for c in caches) else "")
    )
    for c in caches:
        click.echo(
            f"{c.name:<32} {c.state:<8} {c.num_elements:>12,} {c.num_shards:>6} "
            f"{_size(c.disk_bytes):>11} {c.compression_ratio:.2f}x "
            f"{_when(c.last_read_time):<19} {c.hits:>6} {_retention(c)}"
            + (f"  {_store(c)}" if c.store_state else "")
        )


def _store(c) -> str:
    """A cache's place in the object store: STORED, PUBLISHING 40% (12.0 MiB of 30.0 MiB)..."""
    if c.store_state in ("PUBLISHING", "PULLING") and c.store_total_bytes:
        return (
            f"{c.store_state} {100 * c.store_done_bytes // c.store_total_bytes}% "
            f"({_size(c.store_done_bytes)} of {_size(c.store_total_bytes)})"
        )
    return c.store_state


@main.command()
@click.argument("name")
@click.option("--target", default=None, help=TARGET_HELP)
def info(name: str, target: str | None) -> None:
    """Show one cache: state, elements, shards, bytes, compression, fingerprint."""
    with _client(target) as cc:
        c = _run(lambda: cc.info(name))
    rows = [
        ("name", c.name),
        ("state", c.state),
        ("elements", f"{c.num_elements:,}"),
        ("shards", c.num_shards),
        ("on disk", _size(c.disk_bytes)),
        ("records", f"{_size(c.raw_bytes)} raw, {_size(c.stored_bytes)} stored"),
        ("compression", f"{c.compression_ratio:.2f}x"),
        ("fingerprint", c.fingerprint),
        ("created", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.create_time))),
        ("last read", _when(c.last_read_time)),
        ("hits", c.hits),
        ("retention", _retention(c)),
        ("direct", f"{c.direct_leases} leases now, {c.direct_reads} passes since start"),
    ]
    if c.store_state:
        rows.append(("store", _store(c) + (f": {c.store_detail}" if c.store_detail else "")))
        rows.append(("store cost", _cost(c)))
        rows.append(("resident", _residency(c)))
        if c.store_state == "PULLING":
            rows.append(
                (
                    "window",
                    f"{c.window_shards} streamed shards held ({_size(c.window_bytes)}), "
                    f"{c.window_reads} reads using them; {c.streamed_direct_reads:,} streamed "
                    "shard reads from its files by same-host readers",
                )
            )
    for key, value in rows:
        click.echo(f"{key:<12} {value}")


def _residency(c) -> str:
    """How much of a cache is on local disk: 5 of 16 shards (1.0 MiB); streamed 2.1 MiB
    from the store; hit ratio 0.31."""
    return (
        f"{c.resident_shards} of {c.num_shards} shards ({_size(c.resident_bytes)}); "
        f"streamed {_size(c.store_streamed_bytes)} from the store; hit ratio "
        f"{c.hit_ratio:.2f} ({c.resident_reads:,} of "
        f"{c.resident_reads + c.streamed_reads:,} shard reads resident)"
    )


def _cost(c) -> str:
    """What a cache's store calls cost since the daemon started: GET 8, PUT 9; 6.0 MiB in."""
    asked = ", ".join(
        f"{op} {c.store_requests[op]:,}"
        for op in ("GET", "PUT", "HEAD", "LIST", "DELETE")
        if c.store_requests.get(op)
    )
    return (
        f"{asked or 'no requests'}; {_size(c.store_bytes_in)} in, "
        f"{_size(c.store_bytes_out)} out (this daemon, since it started)"
    )


@main.command()
@click.argument("names", nargs=-1, required=True)
@click.option(
    "--store",
    is_flag=True,
    help="Also remove them from the daemon's object store: no daemon finds them there any more.",
)
@click.option("--target", default=None, help=TARGET_HELP)
def rm(names: tuple[str, ...], store: bool, target: str | None) -> None:
    """Delete caches and their files on the daemon (with --store, in the object store too).

    Without --store, a cache the object store holds stays there, and the next
    read on this daemon pulls it again."""
    with _client(target) as cc:
        for name in names:
            local, stored = _run(lambda: cc.delete(name, store=store))  # noqa: B023
            where = " and ".join(
                w
                for w, done in (("this daemon's copy", local), ("the stored copy", stored))
                if done
            )
            kept = "" if store else _kept_in_store(cc, name)
            click.echo(f"deleted {name}: {where}{kept}")


def _kept_in_store(cc, name: str) -> str:
    try:
        info = cc.info(name)
    except ShardcacheError:
        return ""
    return (
        "; the object store still holds it (rm --store removes it there)"
        if info.store_state == "REMOTE"
        else ""
    )


@main.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the demo keeps its source images and its daemon's caches "
    "[default: $XDG_CACHE_HOME/shardcache/demo, else ~/.cache/shardcache/demo].",
)
@click.option(
    "--elements",
    type=click.IntRange(min=64),
    default=3000,
    show_default=True,
    help="Images the demo pipeline generates and preprocesses.",
)
@click.option("--epochs", type=click.IntRange(min=2), default=3, show_default=True)
@click.option(
    "--image-size",
    type=click.IntRange(min=16),
    default=96,
    show_default=True,
    help="Side of the square images after resize.",
)
def demo(data_dir: Path | None, elements: int, epochs: int, image_size: int) -> None:
    """Train a small Keras model through cc.cache(), then through ds.cache().

    Starts a daemon on a unix socket with a data directory under your cache
    directory, builds an image pipeline (decode, resize, normalize), trains
    for a few epochs and prints per-epoch time, elements/s and peak memory
    for both. Needs TensorFlow: pip install 'shardcache[tf-cpu]' (or `make demo`).
    """
    from cacheserver.demo.main import run_demo

    run_demo(data_dir=data_dir, elements=elements, epochs=epochs, image_size=image_size)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "never"


def _retention(c) -> str:
    parts = ["pinned" if c.pinned else "evictable"]
    if c.ttl_seconds:
        parts.append(f"ttl {c.ttl_seconds:g}s")
    return ", ".join(parts)


@main.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--target", default=None, help=TARGET_HELP)
def pin(names: tuple[str, ...], target: str | None) -> None:
    """Keep caches: never evicted for room or by their TTL."""
    with _client(target) as cc:
        for name in names:
            _run(lambda: cc.pin(name))  # noqa: B023 - called at once
            click.echo(f"pinned {name}")


@main.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--target", default=None, help=TARGET_HELP)
def unpin(names: tuple[str, ...], target: str | None) -> None:
    """Let the daemon evict caches again (least recently read first)."""
    with _client(target) as cc:
        for name in names:
            _run(lambda: cc.unpin(name))  # noqa: B023 - called at once
            click.echo(f"unpinned {name}")


@main.command()
@click.argument("name")
@click.argument("seconds", type=click.FloatRange(min=0))
@click.option("--target", default=None, help=TARGET_HELP)
def ttl(name: str, seconds: float, target: str | None) -> None:
    """Delete cache NAME once unread for SECONDS (0 clears the TTL); pinned caches stay."""
    with _client(target) as cc:
        _run(lambda: cc.set_ttl(name, seconds or None))
    click.echo(f"{name}: ttl {seconds:g}s" if seconds else f"{name}: no ttl")


from cacheserver.cli.materialize import materialize  # noqa: E402 - registered last
from cacheserver.cli.top import top  # noqa: E402

main.add_command(materialize)
main.add_command(top)
