"""``cacheserver materialize``: have the daemon run a pipeline and watch it happen, or, with
``--store``, build one index's shards of a Kubernetes Indexed Job straight into the object
store (cacheserver/materialize/indexed.py)."""

from __future__ import annotations

import signal
import sys

import click

from cacheserver.cli import TARGET_HELP
from client import CacheClient, MaterializeOperation, ShardcacheError


@click.command()
@click.argument("entry")
@click.option("--name", required=True, help="Name of the cache to produce.")
@click.option(
    "--shards", type=int, required=True, help="Number of shards; ENTRY is called once per shard."
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes on the daemon [default: the daemon's core count].",
)
@click.option("--target", default=None, help=TARGET_HELP)
@click.option("--overwrite", is_flag=True, help="Replace a READY cache of that name.")
@click.option(
    "--resume",
    is_flag=True,
    help="Attach to this cache's running or interrupted materialization, keeping "
    "its committed shards (starts one when there is none).",
)
@click.option(
    "--block-bytes",
    type=click.IntRange(min=0),
    default=None,
    help="Raw bytes per stored block of small fixed-shape elements; 0 stores one "
    "element per value, for caches read mostly with shuffle=True "
    "(docs/format.md) [default: $SHARDCACHE_BLOCK_BYTES, else 256 KiB].",
)
@click.option("--no-wait", is_flag=True, help="Print the operation's name and return at once.")
@click.option(
    "--store",
    default=None,
    metavar="s3://BUCKET/PREFIX",
    help="Indexed Job mode: build this index's shards here and publish them to "
    "this object store, without a daemon.",
)
@click.option(
    "--store-endpoint",
    default=None,
    metavar="URL",
    help="With --store: an S3-compatible server (http://minio:9000) instead of AWS.",
)
@click.option(
    "--index",
    type=click.IntRange(min=0),
    default=None,
    help="With --store: this index ($JOB_COMPLETION_INDEX); it builds the shards s "
    "with s % INDEXES == INDEX.",
)
@click.option(
    "--indexes",
    type=click.IntRange(min=1),
    default=None,
    help="With --store: the Job's completions (1 to --shards) [default: 1].",
)
def materialize(
    entry: str,
    name: str,
    shards: int,
    workers: int | None,
    target: str | None,
    overwrite: bool,
    resume: bool,
    block_bytes: int | None,
    no_wait: bool,
    store: str | None,
    store_endpoint: str | None,
    index: int | None,
    indexes: int | None,
) -> None:
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

    \b
    With --store, no daemon: one index of a Kubernetes Indexed Job.
      cacheserver materialize ENTRY --name N --shards 256 \\
          --index $JOB_COMPLETION_INDEX --indexes 16 --store s3://BUCKET/PREFIX
    This process runs ENTRY itself (TensorFlow and ENTRY's module must be
    importable here: PYTHONPATH) for the shards s with s % INDEXES == INDEX,
    uploads each and marks it published; shards already published are
    skipped, so a retried index redoes only what is missing. The index that
    publishes the last shard writes the manifest: daemons started with the same
    --store then serve cache N. One line per shard on stderr. Credentials and
    region the AWS way (AWS_* variables, pod identity). Exit status 1: a
    retry may succeed (store unreachable, the pipeline raised); 3: it will not
    (bad entry point, store refused, N is another cache); docs/deploy.md.
    """
    if store is None:
        job_only = {"--index": index, "--indexes": indexes, "--store-endpoint": store_endpoint}
        given = [flag for flag, value in job_only.items() if value is not None]
        if given:
            raise click.UsageError(
                f"{', '.join(given)} only work with --store s3://BUCKET/PREFIX (Indexed Job mode)"
            )
    else:
        daemon_only = {
            "--workers": workers is not None,
            "--target": target is not None,
            "--overwrite": overwrite,
            "--resume": resume,
            "--no-wait": no_wait,
        }
        given = [flag for flag, on in daemon_only.items() if on]
        if given:
            raise click.UsageError(
                f"{', '.join(given)} talk to a daemon; with --store this "
                "command runs without one (drop them)"
            )
        if index is None:
            raise click.UsageError(
                "--store needs --index (the Job's $JOB_COMPLETION_INDEX; 0 when it runs alone)"
            )
        _indexed(
            entry, name, shards, index, indexes or 1, store, store_endpoint or None, block_bytes
        )
        return
    with CacheClient(target) as cc:
        try:
            op = cc.materialize(
                entry,
                name,
                num_shards=shards,
                workers=workers,
                overwrite=overwrite,
                resume=resume,
                block_bytes=block_bytes,
                wait=False,
            )
            assert isinstance(op, MaterializeOperation)
            if no_wait:
                click.echo(op.name)
                return
            progress = op.wait(show_progress=True, emit=lambda line: click.echo(line, err=True))
        except ShardcacheError as exc:
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt:
            click.echo(
                f"\nstopped watching; materialize/{name} goes on in the daemon (watch it "
                "again with --resume)",
                err=True,
            )
            raise SystemExit(130) from None
    resumed = (
        f", {progress.shards_resumed} kept from an interrupted run"
        if progress.shards_resumed
        else ""
    )
    click.echo(
        f"cache {name!r} READY: {progress.elements:,} elements in "
        f"{progress.shards_total} shards{resumed}"
    )


def _indexed(
    entry: str,
    name: str,
    shards: int,
    index: int,
    indexes: int,
    store: str,
    endpoint: str | None,
    block_bytes: int | None,
) -> None:
    """One index of an Indexed Job: exit 0, 1 (a retry may cure it) or 3 (it will not)."""
    from cacheserver.materialize.indexed import IndexedJob, JobFailed, run
    from cacheserver.tier.bucket import StoreRefused
    from client.wire.status import CacheServerError, InvalidArgument, StoreUnavailable

    job = IndexedJob(entry, name, shards, index, indexes, store, endpoint, block_bytes)
    try:
        job.check()
    except (InvalidArgument, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    # Kubernetes stops a pod with SIGTERM: unwind, so the local shard files go too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        run(job, lambda line: click.echo(line, err=True))
    except JobFailed as exc:
        _fail(f"index {index}: {exc}", 3 if exc.permanent else 1)
    except StoreUnavailable as exc:
        _fail(
            f"index {index}: the object store cannot be reached: {exc}; the Job retries the "
            "index (backoffLimitPerIndex), or check --store-endpoint and the network",
            1,
        )
    except StoreRefused as exc:
        _fail(f"index {index}: {exc}", 3)
    except CacheServerError as exc:  # DataLoss of a stored document, DiskFull locally
        _fail(f"index {index}: {exc}", 1)
    except ImportError as exc:
        _fail(f"--store needs boto3 ({exc}): pip install 'shardcache[s3]'", 3)


def _fail(message: str, code: int) -> None:
    click.echo(f"Error: {message}", err=True)
    raise SystemExit(code)
