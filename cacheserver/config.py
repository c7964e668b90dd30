"""The daemon's settings: one declarative table drives flags, environment and TOML.

Every setting of ``cacheserver serve`` is one :class:`Setting` row. The same
row makes the click option (``--max-bytes``), the environment variable
(``CACHESERVER_MAX_BYTES``) and the TOML key (``max_bytes`` in the file given
by ``--config``). Precedence: flag > environment > file > default. Values from
every source go through the same click type, so a bad value fails the same
way wherever it came from, and the message names the key, its source and what
is accepted. docs/operations.md holds the table for people;
tests/unit/test_config.py fails when the two disagree.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import click

from client.wire.limits import MAX_MESSAGE_BYTES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ENV_PREFIX = "CACHESERVER_"
#: CACHESERVER_* variables that are not daemon settings (the config file, the client's token).
CLIENT_ENV = frozenset({"CACHESERVER_CONFIG", "CACHESERVER_TOKEN"})
DEFAULT_LISTEN = "127.0.0.1:50051"


class ConfigError(click.UsageError):
    """A setting is missing, unknown or has a value that is not accepted."""


class ByteSize(click.ParamType):
    """A byte count: an integer, optionally with a unit (KiB, MiB, GiB, TiB, K, M, G, T)."""

    name = "bytes"
    _UNITS: ClassVar[dict[str, int]] = {
        "": 1,
        "b": 1,
        "k": 1 << 10,
        "kb": 10**3,
        "kib": 1 << 10,
        "m": 1 << 20,
        "mb": 10**6,
        "mib": 1 << 20,
        "g": 1 << 30,
        "gb": 10**9,
        "gib": 1 << 30,
        "t": 1 << 40,
        "tb": 10**12,
        "tib": 1 << 40,
    }
    _RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        m = self._RE.fullmatch(str(value))
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in self._UNITS:
            self.fail(
                f"{value!r} is not a byte size: use a non-negative integer, optionally "
                "with a unit (KiB, MiB, GiB, TiB; KB, MB, GB, TB), e.g. 500GiB",
                param,
                ctx,
            )
        return int(float(m.group(1)) * self._UNITS[unit])


class OctalMode(click.ParamType):
    """A file mode in octal, e.g. 0660."""

    name = "mode"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0o777:
            return value
        text = str(value).strip()
        if not re.fullmatch(r"0?o?[0-7]{3}", text):
            self.fail(
                f"{value!r} is not a file mode: use three octal digits such as 0660", param, ctx
            )
        return int(text[-3:], 8)


class ModulePatterns(click.ParamType):
    """Modules or packages (``mypkg.pipelines``) or entry points (``mypkg.pipelines:train``),
    comma-separated."""

    name = "modules"
    _IDENT = r"[A-Za-z_]\w*"
    _RE = re.compile(rf"{_IDENT}(\.{_IDENT})*(:{_IDENT}(\.{_IDENT})*)?")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        for item in items:
            if not self._RE.fullmatch(item):
                self.fail(
                    f"{item!r} is not a module or package name such as mypkg.pipelines, "
                    "nor an entry point such as mypkg.pipelines:train",
                    param,
                    ctx,
                )
        return ",".join(items)


class StoreURLType(click.ParamType):
    """An object store URL, s3://BUCKET/PREFIX (empty: none)."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from cacheserver.tier.bucket import StoreURL

        text = str(value).strip()
        if text:
            try:
                StoreURL.parse(text)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        return text


@dataclass(frozen=True)
class Setting:
    name: str  # TOML key; --name-with-dashes; CACHESERVER_NAME
    type: click.ParamType
    default: Any
    help: str
    multiple: bool = False
    required: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


_PATH = click.Path(path_type=Path)
_LEVELS = click.Choice(["debug", "info", "warning", "error"])

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "data_dir",
        click.Path(file_okay=False, path_type=Path),
        None,
        "Directory holding the caches (LMDB shards and manifests).",
        required=True,
    ),
    Setting(
        "listen",
        click.STRING,
        (DEFAULT_LISTEN,),
        "Address to serve on; repeat for several (environment: comma-separated; TOML: a "
        "list). HOST:PORT (port 0 picks a free one) or unix:///path/to.sock.",
        multiple=True,
    ),
    Setting(
        "grace",
        click.FloatRange(min=0),
        30.0,
        "Seconds SIGTERM waits for in-flight streams before cancelling them.",
    ),
    Setting(
        "shutdown_delay",
        click.FloatRange(min=0),
        0.0,
        "Seconds between health turning NOT_SERVING and the drain on SIGTERM, so load "
        "balancers and probes stop sending new calls first.",
    ),
    Setting("log_level", _LEVELS, "info", "debug, info, warning or error."),
    Setting(
        "log_format",
        click.Choice(["text", "json"]),
        "text",
        "json writes one JSON object per log line.",
    ),
    Setting(
        "max_bytes",
        ByteSize(),
        0,
        "Most bytes all caches may use on disk (0: no limit); least recently read "
        "unpinned caches are evicted to make room.",
    ),
    Setting(
        "min_free_bytes",
        ByteSize(),
        0,
        "Free space to leave on the data dir's filesystem; caches are evicted (then writes "
        "refused) to keep it.",
    ),
    Setting(
        "ttl_sweep_interval",
        click.FloatRange(min=0.05),
        60.0,
        "Seconds between sweeps that delete caches idle for longer than their TTL.",
    ),
    Setting(
        "lease_ttl",
        click.FloatRange(min=0.1),
        30.0,
        "Seconds a same-host direct reader's lease lives unless renewed (the client "
        "renews every third of it); a killed reader's cache is evictable after this.",
    ),
    Setting(
        "data_listen",
        click.STRING,
        "auto",
        "Address of the data plane, the port remote readers receive record bytes on "
        "(gRPC opens each read; docs/operations.md): HOST:PORT, auto (the first TCP "
        "--listen host, a free port, announced to readers) or off (reads stay on gRPC). "
        "It takes --tls-*, the stream limits and --stream-idle-timeout from gRPC's.",
    ),
    Setting(
        "metrics_listen",
        click.STRING,
        "",
        "HOST:PORT serving Prometheus metrics at /metrics (empty: off).",
    ),
    Setting(
        "metrics_token_file",
        _PATH,
        None,
        "File holding a bearer token every /metrics scrape must carry (Prometheus: "
        "authorization in the scrape config); empty: none.",
    ),
    Setting(
        "metrics_tls",
        click.BOOL,
        False,
        "Serve /metrics over HTTPS with --tls-cert/--tls-key (and, with --tls-client-ca, "
        "only to scrapers with a client certificate it signed).",
    ),
    Setting(
        "metrics_readers",
        click.BOOL,
        True,
        "Export the readers' reports on /metrics, labelled by training job, rank and "
        "cache (--no-metrics-readers: accepted and dropped, for a daemon shared across "
        "trust boundaries).",
    ),
    Setting("tls_cert", _PATH, None, "PEM certificate chain: serve TCP addresses over TLS."),
    Setting("tls_key", _PATH, None, "PEM private key of --tls-cert."),
    Setting(
        "tls_client_ca",
        _PATH,
        None,
        "PEM CA bundle: require client certificates signed by it (mutual TLS).",
    ),
    Setting(
        "auth_token_file",
        _PATH,
        None,
        "File holding a bearer token every RPC but health must carry; its holder may do "
        "everything (--auth-file grants less).",
    ),
    Setting(
        "auth_file",
        _PATH,
        None,
        "TOML file of principals (a token, its SHA-256 or a client certificate's name) and "
        "their grants: read, write, admin over cache-name patterns (docs/operations.md, "
        "Security). Reread on SIGHUP and when it changes.",
    ),
    Setting("socket_mode", OctalMode(), 0o660, "Mode of unix sockets, octal."),
    Setting(
        "max_message_bytes",
        ByteSize(),
        MAX_MESSAGE_BYTES,
        "Largest record a WriteCache message may carry (a chunk of records, or one larger "
        "record alone) and largest StartMaterialize graph, plus 64 KiB of framing; other "
        "calls take at most 64 KiB (ReadElements 1 MiB).",
    ),
    Setting(
        "max_streams_per_client",
        click.IntRange(min=1),
        48,
        "Concurrent streams (ReadShard, ReadElements, WriteCache, WatchOperation) one "
        "client host may hold (all unix-socket clients count as one); at most --max-streams.",
    ),
    Setting(
        "max_streams",
        click.IntRange(min=0),
        0,
        "Concurrent streams daemon-wide (0: 7/8 of --max-workers); must be below "
        "--max-workers, so that a stream beyond it is refused at once.",
    ),
    Setting(
        "max_workers",
        click.IntRange(min=4),
        64,
        "Threads serving streams; unary calls and health checks have 16 threads of their "
        "own, so streams never hold the threads those need.",
    ),
    Setting(
        "stream_idle_timeout",
        click.FloatRange(min=0),
        120.0,
        "Seconds a stream may wait on a reader that takes no message before the daemon "
        "ends it with UNAVAILABLE (the client library resumes the read); 0: never.",
    ),
    Setting(
        "pythonpath",
        click.Path(exists=True, file_okay=False, path_type=Path),
        (),
        "Directory materialization workers import entry points from (before the "
        "daemon's PYTHONPATH); repeat for several (environment: comma-separated; TOML: a "
        "list).",
        multiple=True,
    ),
    Setting(
        "materialize_allow",
        ModulePatterns(),
        (),
        "Module or package whose entry points StartMaterialize may run (mypkg.pipelines "
        "allows mypkg.pipelines:fn and mypkg.pipelines.sub:fn), or one entry point "
        "(mypkg.pipelines:train); repeat or comma-separate for several (TOML: a list). "
        "Empty: materialization of entry points is refused.",
        multiple=True,
    ),
    Setting(
        "store",
        StoreURLType(),
        "",
        "Object store under the local caches, s3://BUCKET/PREFIX: committed caches are "
        "published there, caches this daemon lacks are pulled from there, and eviction "
        "drops only copies the store holds. Credentials and region the standard AWS way "
        "(AWS_* environment, shared config, instance or pod identity). Empty: none.",
    ),
    Setting(
        "store_endpoint",
        click.STRING,
        "",
        "URL of an S3-compatible server for --store (e.g. http://minio:9000); empty: AWS.",
    ),
    Setting(
        "store_pull",
        click.Choice(["all", "on-read"]),
        "all",
        "What a daemon fetches of a stored cache it lacks once asked for it: all (every "
        "shard, in the background) or on-read (only the shards read from it: in a fleet, "
        "the shards it owns; docs/fleet.md).",
    ),
    Setting(
        "allow_shipped_pipelines",
        click.BOOL,
        False,
        "Run datasets that clients send as serialized tf.data graphs (materialize(ds)); "
        "such a graph reads any file the daemon can: allow only if every client that "
        "can reach the daemon is trusted.",
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}


def click_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with one option per setting (defaults applied later)."""
    for s in reversed(SETTINGS):
        default = "" if s.default is None else s.default
        if isinstance(s.type, OctalMode):
            default = f"0{s.default:o}"
        shown = ", ".join(default) if s.multiple else default
        help_text = f"{s.help} [env: {s.env}" + (f"; default: {shown}]" if shown != "" else "]")
        if s.type is click.BOOL:  # a switch: --name / --no-name
            fn = click.option(f"{s.flag}/--no-{s.flag[2:]}", s.name, default=None, help=help_text)(
                fn
            )
            continue
        fn = click.option(
            s.flag, s.name, type=s.type, multiple=s.multiple, default=None, help=help_text
        )(fn)
    return fn


def _closest(key: str) -> str:
    match = difflib.get_close_matches(key, BY_NAME, n=1, cutoff=0.5)
    return f"; did you mean {match[0]!r}?" if match else ""


def _accepted(s: Setting) -> str:
    return s.type.name if not s.multiple else f"a list of {s.type.name}"


def _convert(s: Setting, value: Any, source: str) -> Any:
    try:
        if s.multiple:
            items = (
                value
                if isinstance(value, list | tuple)
                else [v for v in re.split(r"[,\s]+", str(value)) if v]
            )
            return tuple(s.type.convert(v, None, None) for v in items)
        return s.type.convert(value, None, None)
    except click.BadParameter as exc:
        accepted = "" if isinstance(s.type, click.Choice) else f" (accepted: {_accepted(s)})"
        raise ConfigError(f"{s.name} from {source}: {exc.message}{accepted}") from None


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read --config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path} is not valid TOML: {exc}") from None
    for key in doc:
        if key not in BY_NAME:
            raise ConfigError(
                f"unknown setting {key!r} in {path}{_closest(key)} (settings: {', '.join(BY_NAME)})"
            )
    return doc


def resolve(
    flags: Mapping[str, Any], config_file: Path | None, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge flags > environment > TOML file > defaults; returns (values, sources)."""
    environ = os.environ if environ is None else environ
    file_values = load_toml(config_file) if config_file is not None else {}
    for key in environ:
        if (
            key.startswith(ENV_PREFIX)
            and key.removeprefix(ENV_PREFIX).lower() not in BY_NAME
            and key not in CLIENT_ENV
        ):
            raise ConfigError(
                f"unknown environment variable {key}"
                f"{_closest(key.removeprefix(ENV_PREFIX).lower())}"
            )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for s in SETTINGS:
        flag = flags.get(s.name)
        if flag not in (None, ()):
            values[s.name], sources[s.name] = flag, f"flag {s.flag}"
        elif s.env in environ:
            sources[s.name] = f"environment {s.env}"
            values[s.name] = _convert(s, environ[s.env], sources[s.name])
        elif s.name in file_values:
            sources[s.name] = f"file {config_file}"
            values[s.name] = _convert(s, file_values[s.name], sources[s.name])
        elif s.required:
            raise ConfigError(
                f"{s.name} is required: pass {s.flag}, set {s.env} or put "
                f"{s.name} in the --config file"
            )
        else:
            values[s.name], sources[s.name] = s.default, "default"
    return values, sources


def markdown_table() -> str:
    """The settings as the markdown table docs/operations.md carries."""
    rows = [
        "| setting (TOML key) | flag | environment | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        if s.required:
            default = "(required)"
        elif isinstance(s.type, OctalMode):
            default = f"`0{s.default:o}`"
        elif s.multiple and s.default:
            default = "`" + ", ".join(s.default) + "`"
        elif s.default in (None, "", ()):
            default = "(none)"
        else:
            default = f"`{s.default}`"
        rows.append(f"| `{s.name}` | `{s.flag}` | `{s.env}` | {default} | {s.help} |")
    return "\n".join(rows)
