"""The ``cacheserver`` command line: serve, ls, info, rm, demo, materialize."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import click

from cacheserver import __version__
from cacheserver.server import DEFAULT_LISTEN

TARGET_HELP = ("daemon address: HOST:PORT or unix:///path.sock "
               "[default: $SHARDCACHE_TARGET, else 127.0.0.1:50051]")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": round(record.created, 3), "level": record.levelname,
               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def _setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="cacheserver")
def main() -> None:
    """shardcache daemon and tools: a disk-backed dataset cache for tf.data.

    Run `cacheserver serve` on the host, then use client.CacheClient in the
    training process. `cacheserver demo` shows the whole thing end to end.
    """


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory holding the caches (LMDB shards and manifests).")
@click.option("--listen", "listen", multiple=True, default=[DEFAULT_LISTEN],
              show_default=True,
              help="Address to serve on; repeat for several. HOST:PORT (port 0 picks a free "
                   "one) or unix:///path/to.sock (created with mode 0660).")
@click.option("--grace", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds SIGTERM waits for in-flight streams before cancelling them.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json writes one JSON object per log line.")
@click.option("--pythonpath", multiple=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Directory materialization workers import entry points from (before "
                   "the daemon's PYTHONPATH); repeat for several.")
def serve(data_dir: Path, listen: tuple[str, ...], grace: float, log_level: str,
          log_format: str, pythonpath: tuple[Path, ...]) -> None:
    """Run the daemon until SIGTERM/SIGINT, then drain streams and exit 0.

    Binds 127.0.0.1:50051 unless --listen says otherwise. Serves gRPC health
    checking (grpc.health.v1) and server reflection on every address.
    """
    from cacheserver.server import CacheServer, ListenError, ServerConfig

    _setup_logging(log_level, log_format)
    try:
        server = CacheServer(ServerConfig(data_dir=data_dir, listen=list(listen),
                                          grace_seconds=grace,
                                          pythonpath=[p.resolve() for p in pythonpath]))
    except (ListenError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    server.run_until_signal()


def _client(target: str | None):
    from client import CacheClient

    return CacheClient(target)


def _run(fn):
    from client import ShardcacheError

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
@click.option("--target", default=None, help=TARGET_HELP)
def ls_(target: str | None) -> None:
    """List the daemon's caches."""
    with _client(target) as cc:
        caches = _run(cc.list)
    click.echo(f"{'NAME':<32} {'STATE':<8} {'ELEMENTS':>12} {'SHARDS':>6} {'ON DISK':>11} RATIO")
    for c in caches:
        click.echo(f"{c.name:<32} {c.state:<8} {c.num_elements:>12,} {c.num_shards:>6} "
                   f"{_size(c.disk_bytes):>11} {c.compression_ratio:.2f}x")


@main.command()
@click.argument("name")
@click.option("--target", default=None, help=TARGET_HELP)
def info(name: str, target: str | None) -> None:
    """Show one cache: state, elements, shards, bytes, compression, fingerprint."""
    with _client(target) as cc:
        c = _run(lambda: cc.info(name))
    rows = [
        ("name", c.name), ("state", c.state), ("elements", f"{c.num_elements:,}"),
        ("shards", c.num_shards), ("on disk", _size(c.disk_bytes)),
        ("records", f"{_size(c.raw_bytes)} raw, {_size(c.stored_bytes)} stored"),
        ("compression", f"{c.compression_ratio:.2f}x"), ("fingerprint", c.fingerprint),
        ("created", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.create_time))),
    ]
    for key, value in rows:
        click.echo(f"{key:<12} {value}")


@main.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--target", default=None, help=TARGET_HELP)
def rm(names: tuple[str, ...], target: str | None) -> None:
    """Delete caches and their files."""
    with _client(target) as cc:
        for name in names:
            _run(lambda: cc.delete(name))  # noqa: B023 - called at once
            click.echo(f"deleted {name}")


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the demo keeps its source images and its daemon's caches "
                   "[default: $XDG_CACHE_HOME/shardcache/demo, else ~/.cache/shardcache/demo].")
@click.option("--elements", type=click.IntRange(min=64), default=3000, show_default=True,
              help="Images the demo pipeline generates and preprocesses.")
@click.option("--epochs", type=click.IntRange(min=2), default=3, show_default=True)
@click.option("--image-size", type=click.IntRange(min=16), default=96, show_default=True,
              help="Side of the square images after resize.")
def demo(data_dir: Path | None, elements: int, epochs: int, image_size: int) -> None:
    """Train a small Keras model through cc.cache(), then through ds.cache().

    Starts a daemon on a unix socket with a data directory under your cache
    directory, builds an image pipeline (decode, resize, normalize), trains
    for a few epochs and prints per-epoch time, elements/s and peak memory
    for both. Needs TensorFlow: pip install 'shardcache[tf-cpu]' (or `make demo`).
    """
    from cacheserver.demo import run_demo

    run_demo(data_dir=data_dir, elements=elements, epochs=epochs, image_size=image_size)


from cacheserver.materialize_cli import materialize  # noqa: E402 - registered last

main.add_command(materialize)
