"""One S3-compatible bucket prefix: the object store under the daemons' local caches.

The only module that speaks S3, through boto3 (docs/design.md, "The object
store client"). Credentials and region come the standard AWS way (environment,
shared config and credentials files, instance or pod identity); ``endpoint``
points at an S3-compatible server instead of AWS.

What it offers is what the tier needs and no more:

* :meth:`Bucket.create` writes a small object only if none exists under its key
  (``If-None-Match: *``): the commit point of a cache, of a shard marker;
* :meth:`Bucket.upload` sends a file (multipart above ``MULTIPART_BYTES``,
  ``UPLOAD_CONCURRENCY`` parts in flight) with its SHA-256 computed on the way;
* :meth:`Bucket.download` fetches an object in ONE GET, streaming it to a file
  while hashing it (write, hash and sync each on a thread of its own beside the
  network), and refuses it (DataLoss) when size or SHA-256 differ from what the
  manifest says, so a corrupt object is never served.

Failures a retry may cure (connection refused, timeouts, 5xx, throttling) raise
:class:`StoreUnavailable`; the rest (no such bucket, access denied) raise
:class:`StoreRefused`, with what to do.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from cacheserver.tier.requests import StoreRequests
from client.format.store import disk_full
from client.wire.status import CacheServerError, DataLoss, StoreUnavailable

log = logging.getLogger(__name__)

#: Files above this size are uploaded in parts of this size.
MULTIPART_BYTES = 64 << 20
UPLOAD_CONCURRENCY = 4
_READ_BYTES = 8 << 20
_SYNC_BYTES = 32 << 20
_HELD_BLOCKS = 4  # a download's blocks received but not yet written and hashed
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_RETRYABLE_CODES = {
    "500",
    "502",
    "503",
    "504",
    "SlowDown",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "Throttling",
    "ThrottlingException",
    "RequestTimeTooSkewed",
}

Progress = Callable[[int], None]


class StoreRefused(CacheServerError):
    """The store answered, and said no (no such bucket, access denied, bad request)."""

    reason = "STORE_REFUSED"


@dataclass(frozen=True)
class StoreURL:
    """``s3://BUCKET[/PREFIX]``: where the tier keeps its objects."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> StoreURL:
        if not url.startswith("s3://"):
            raise ValueError(f"store URL {url!r} must look like s3://BUCKET/PREFIX")
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not _BUCKET_RE.fullmatch(bucket):
            raise ValueError(
                f"store URL {url!r}: {bucket!r} is not a valid bucket name "
                "(3-63 lowercase letters, digits, '.' and '-')"
            )
        prefix = prefix.strip("/")
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise ValueError(f"store URL {url!r}: the prefix has an empty, '.' or '..' part")
        return cls(bucket, prefix)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


@dataclass(frozen=True)
class StoredObject:
    """An object as a manifest names it: key (below the prefix), size, SHA-256 (hex)."""

    key: str
    size: int
    sha256: str


class Bucket:
    """The objects under one ``s3://BUCKET/PREFIX``; keys below are relative to PREFIX."""

    def __init__(
        self, url: str, endpoint: str | None = None, *, timeout: float = 30.0, attempts: int = 3
    ) -> None:
        self.url = StoreURL.parse(url)
        self.endpoint = endpoint or None
        self._timeout, self._attempts = timeout, attempts
        self._client: Any = None
        self._lock = threading.Lock()
        self.requests = StoreRequests(self.url.prefix)

    def __str__(self) -> str:
        return str(self.url)

    @property
    def client(self) -> Any:
        """The boto3 S3 client, made on first use (boto3 loads in ~0.3 s)."""
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                self._client = boto3.session.Session().client(
                    "s3",
                    endpoint_url=self.endpoint,
                    config=Config(
                        connect_timeout=min(self._timeout, 10),
                        read_timeout=self._timeout,
                        retries={"mode": "standard", "max_attempts": self._attempts},
                        max_pool_connections=32,
                        s3={"addressing_style": "path"} if self.endpoint else {},
                        # every object fetched is checked against the manifest's SHA-256;
                        # botocore's CRC of each GET's body would be a second pass over it
                        response_checksum_validation="when_required",
                    ),
                )
                self.requests.attach(self._client)
            return self._client

    def _key(self, key: str) -> str:
        return f"{self.url.prefix}/{key}" if self.url.prefix else key

    # ------------------------------------------------------------------ small objects

    def check(self) -> None:
        """Raise unless the bucket exists and answers (StoreUnavailable / StoreRefused)."""
        with self._errors("reach the bucket"):
            self.client.head_bucket(Bucket=self.url.bucket)

    def get_json(self, key: str) -> Any | None:
        """The JSON document under key, or None when there is no such object."""
        with self._errors(f"read {key}"):
            try:
                body = self.client.get_object(Bucket=self.url.bucket, Key=self._key(key))["Body"]
            except self._client.exceptions.NoSuchKey:
                return None
            data = body.read()
        try:
            return json.loads(data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise DataLoss(
                f"{self.url}/{key} is not valid JSON ({exc}); remove the cache from "
                "the store (cacheserver rm --store) and build it again"
            ) from None

    def create(self, key: str, doc: Any) -> bool:
        """Write doc (JSON) under key only if no object is there yet: True if this call made it.

        The conditional create (If-None-Match: *) is atomic in the store: of any
        number of callers racing, exactly one gets True.
        """
        body = json.dumps(doc, indent=1).encode()
        with self._errors(f"create {key}"):
            try:
                self.client.put_object(
                    Bucket=self.url.bucket,
                    Key=self._key(key),
                    Body=body,
                    IfNoneMatch="*",
                    ContentType="application/json",
                )
            except self._client.exceptions.ClientError as exc:
                if _code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                    return False
                raise
        return True

    def names(self, prefix: str) -> list[str]:
        """The next path components under prefix (the 'directories' of a listing)."""
        full = (
            self._key(prefix).rstrip("/") + "/"
            if prefix
            else (f"{self.url.prefix}/" if self.url.prefix else "")
        )
        out: list[str] = []
        with self._errors(f"list {prefix or '/'}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.url.bucket, Prefix=full, Delimiter="/"
            )
            for page in pages:
                out += [
                    p["Prefix"][len(full) :].rstrip("/") for p in page.get("CommonPrefixes", [])
                ]
        return out

    def keys(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under prefix, keys relative to the bucket's prefix."""
        full, strip = self._key(prefix), len(self._key(""))
        with self._errors(f"list {prefix}"):
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.url.bucket, Prefix=full
            ):
                for obj in page.get("Contents", []):
                    yield obj["Key"][strip:], obj["Size"]

    def delete(self, keys: list[str]) -> None:
        """Delete keys (missing ones are not an error), 1,000 per request."""
        with self._errors("delete objects"):
            for i in range(0, len(keys), 1000):
                self.client.delete_objects(
                    Bucket=self.url.bucket,
                    Delete={
                        "Objects": [{"Key": self._key(k)} for k in keys[i : i + 1000]],
                        "Quiet": True,
                    },
                )

    # ------------------------------------------------------------------ shard files

    def upload(self, path: Path, key: str, progress: Progress | None = None) -> StoredObject:
        """Upload the file at path under key; its size and SHA-256.

        The hash is computed beside the upload, in a thread of its own (both read the page
        cache; hashlib releases the GIL), not in a pass before it."""
        from boto3.s3.transfer import TransferConfig

        size = path.stat().st_size
        config = TransferConfig(
            multipart_threshold=MULTIPART_BYTES,
            multipart_chunksize=MULTIPART_BYTES,
            max_concurrency=UPLOAD_CONCURRENCY,
        )
        with ThreadPoolExecutor(1, thread_name_prefix="shardcache-sha") as hasher:
            digest = hasher.submit(sha256_file, path)
            with self._errors(f"upload {key}"):
                self.client.upload_file(
                    str(path), self.url.bucket, self._key(key), Config=config, Callback=progress
                )
            return StoredObject(key, size, digest.result())

    def download(
        self,
        obj: StoredObject,
        dest: Path,
        progress: Progress | None = None,
        durable: bool = True,
    ) -> None:
        """Fetch obj into dest in one GET; DataLoss (dest removed) if size or SHA-256 differ.

        The network thread receives; a :class:`_Sink` writes, hashes and syncs the blocks
        beside it. A durable file is synced whole before it is renamed into place; scratch
        that no restart keeps (a stream window's shard) is not synced, and is written and
        hashed on the receiving thread."""
        tmp = dest.with_name(f".{dest.name}.part")
        try:
            with (
                self._errors(f"download {obj.key}"),
                open(tmp, "wb") as f,
                _Sink(f, durable) as sink,
            ):
                body = self.client.get_object(Bucket=self.url.bucket, Key=self._key(obj.key))[
                    "Body"
                ]
                for block in body.iter_chunks(_READ_BYTES):
                    sink.put(block)
                    if progress is not None:
                        progress(len(block))
                size, sha256 = sink.close()
            if size != obj.size or sha256 != obj.sha256:
                raise DataLoss(
                    f"object {self.url}/{obj.key} is corrupt: {size} bytes with SHA-256 "
                    f"{sha256[:16]}..., the manifest says {obj.size} bytes, "
                    f"{obj.sha256[:16]}...; it was not served. Remove the cache from the store "
                    "(cacheserver rm --store NAME) and build it again"
                )
            os.replace(tmp, dest)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise disk_full(dest) from exc
            raise
        finally:
            tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ errors

    def _errors(self, what: str) -> _Translate:
        return _Translate(self, what)


class _Translate:
    """Turns botocore's exceptions into StoreUnavailable (retry may cure) or StoreRefused."""

    def __init__(self, bucket: Bucket, what: str) -> None:
        self.bucket, self.what = bucket, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, CacheServerError):
            return
        from boto3.exceptions import S3UploadFailedError
        from botocore import exceptions as bx

        where = f"{self.bucket}" + (f" at {self.bucket.endpoint}" if self.bucket.endpoint else "")
        if isinstance(exc, bx.ClientError | S3UploadFailedError):
            code = _code(exc) if isinstance(exc, bx.ClientError) else str(exc)
            if isinstance(exc, S3UploadFailedError) or code in _RETRYABLE_CODES:
                raise StoreUnavailable(f"could not {self.what} in {where}: {exc}") from exc
            hint = {
                "NoSuchBucket": "create the bucket, or fix --store",
                "404": "create the bucket, or fix --store",
                "AccessDenied": "grant this daemon's credentials access to the bucket",
                "403": "grant this daemon's credentials access to the bucket",
                "InvalidAccessKeyId": "fix the credentials (AWS_ACCESS_KEY_ID ...)",
                "SignatureDoesNotMatch": "fix the credentials (AWS_SECRET_ACCESS_KEY ...)",
            }.get(code, "see the store's message")
            raise StoreRefused(f"could not {self.what} in {where}: {exc}; {hint}") from exc
        if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
            raise StoreRefused(
                f"could not {self.what} in {where}: {exc}; set AWS_ACCESS_KEY_ID "
                "and AWS_SECRET_ACCESS_KEY, a shared credentials file, or "
                "an instance or pod identity"
            ) from exc
        from urllib3.exceptions import HTTPError

        if isinstance(exc, bx.BotoCoreError | HTTPError):  # connection, timeout, broken stream
            raise StoreUnavailable(f"could not {self.what} in {where}: {exc}") from exc


class _Sink:
    """Where a download's blocks go, beside the thread that receives them.

    Durable: each block is written (in order, on one thread) and hashed (in order, on
    another) at once, ``_HELD_BLOCKS`` blocks at most held; every ``_SYNC_BYTES`` the writer
    starts an fdatasync on a third thread and goes on writing, so that the disk, the hash
    and the network all move at once. :meth:`close` waits for all of it and fsyncs the file
    whole; the first error of any of them is raised by :meth:`put` or :meth:`close`.

    Not durable (a stream window's scratch copy): :meth:`put` writes and hashes the block on
    the receiving thread itself. A window has several fetches in flight (one per reader and
    one ahead), which keep the cores busy; three threads started per shard and two handoffs
    per block cost more CPU than they overlap (docs/design.md, "A pull: receive, write, hash ...").
    """

    def __init__(self, f: BinaryIO, durable: bool = True) -> None:
        self._f = f
        self._durable = durable
        self._digest = hashlib.sha256()
        self._size = self._synced = 0
        self._held: deque[tuple[Future[None], Future[None]]] = deque()
        self._sync: Future[None] | None = None
        self._pools = (
            [
                ThreadPoolExecutor(1, thread_name_prefix=f"shardcache-{role}")
                for role in ("sink", "sha", "sync")
            ]
            if durable
            else []
        )

    def __enter__(self) -> _Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        for pool in self._pools:
            pool.shutdown(wait=True, cancel_futures=True)

    def put(self, block: bytes) -> None:
        if not self._durable:
            self._f.write(block)
            self._digest.update(block)
            self._size += len(block)
            return
        writer, hasher, _ = self._pools
        while len(self._held) >= _HELD_BLOCKS:
            self._wait_oldest()
        self._held.append(
            (writer.submit(self._write, block), hasher.submit(self._digest.update, block))
        )

    def close(self) -> tuple[int, str]:
        """Wait for every block to be written and hashed; fsync the file. (size, SHA-256)."""
        while self._held:
            self._wait_oldest()
        if self._sync is not None:
            self._sync.result()
        self._f.flush()
        if self._durable:
            os.fsync(self._f.fileno())
        return self._size, self._digest.hexdigest()

    def _wait_oldest(self) -> None:
        for done in self._held.popleft():
            done.result()

    def _write(self, block: bytes) -> None:  # the writer thread
        self._f.write(block)
        self._size += len(block)
        if self._size - self._synced >= _SYNC_BYTES and (self._sync is None or self._sync.done()):
            if self._sync is not None:
                self._sync.result()  # a failed sync's error
            self._f.flush()
            self._sync = self._pools[2].submit(os.fdatasync, self._f.fileno())
            self._synced = self._size


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_READ_BYTES):
            digest.update(block)
    return digest.hexdigest()
