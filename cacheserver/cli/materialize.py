"""``cacheserver materialize``: have the daemon run a pipeline and watch it happen."""

from __future__ import annotations

import click

from client import CacheClient, MaterializeOperation, ShardcacheError

TARGET_HELP = ("daemon address: HOST:PORT or unix:///path.sock "
               "[default: $SHARDCACHE_TARGET, else 127.0.0.1:50051]")


@click.command()
@click.argument("entry")
@click.option("--name", required=True, help="Name of the cache to produce.")
@click.option("--shards", type=int, required=True,
              help="Number of shards; ENTRY is called once per shard.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes on the daemon [default: the daemon's core count].")
@click.option("--target", default=None, help=TARGET_HELP)
@click.option("--overwrite", is_flag=True, help="Replace a READY cache of that name.")
@click.option("--resume", is_flag=True,
              help="Attach to this cache's running or interrupted materialization, keeping "
                   "its committed shards (starts one when there is none).")
@click.option("--block-bytes", type=click.IntRange(min=0), default=None,
              help="Raw bytes per stored block of small fixed-shape elements; 0 stores one "
                   "element per value, for caches read mostly with shuffle=True "
                   "(docs/format.md) [default: $SHARDCACHE_BLOCK_BYTES, else 256 KiB].")
@click.option("--no-wait", is_flag=True,
              help="Print the operation's name and return at once.")
def materialize(entry: str, name: str, shards: int, workers: int | None, target: str | None,
                overwrite: bool, resume: bool, block_bytes: int | None, no_wait: bool) -> None:
    """Run ENTRY on the daemon, one shard per worker process, into cache NAME.

    ENTRY is "package.module:function", called as function(shard_index,
    num_shards) in the daemon's worker processes and returning a
    tf.data.Dataset; it must be importable on the daemon's host (start the
    daemon with `cacheserver serve --pythonpath DIR`, or set its PYTHONPATH)
    and allowed by the daemon's operator: `cacheserver serve --materialize-allow
    package.module` (or CACHESERVER_MATERIALIZE_ALLOW); otherwise it is refused
    with a message naming that setting.
    Shows a progress bar on a terminal, else a progress line every 10 s.
    Ctrl-C stops watching only: the operation goes on in the daemon (watch it
    again with --resume; cancel it with the client's op.cancel()).
    """
    with CacheClient(target) as cc:
        try:
            op = cc.materialize(entry, name, num_shards=shards, workers=workers,
                                overwrite=overwrite, resume=resume, block_bytes=block_bytes,
                                wait=False)
            assert isinstance(op, MaterializeOperation)
            if no_wait:
                click.echo(op.name)
                return
            progress = op.wait(show_progress=True, emit=lambda line: click.echo(line, err=True))
        except ShardcacheError as exc:
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt:
            click.echo(f"\nstopped watching; materialize/{name} goes on in the daemon (watch it "
                       "again with --resume)", err=True)
            raise SystemExit(130) from None
    resumed = f", {progress.shards_resumed} kept from an interrupted run" \
        if progress.shards_resumed else ""
    click.echo(f"cache {name!r} READY: {progress.elements:,} elements in "
               f"{progress.shards_total} shards{resumed}")

