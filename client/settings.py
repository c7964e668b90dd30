"""The client's settings: every environment variable the client library reads, in one table.

Each :class:`Setting` row is one variable: its name, the values it takes, its default
and what it does. A value is read when it is used (``SETTING.get()``), not at import,
so a variable set after ``import client`` counts. An unset or empty variable is its
default; any other value goes through the row's parser, and a bad one is an
InvalidArgumentError naming the variable and the values it takes. Booleans are spelled
true/false, 1/0, yes/no or on/off, in any case ("auto" too where a setting has it).

docs/operations.md carries :func:`markdown_table`; tests/unit/test_client_settings.py
fails when the two differ, or when a module of the client reads a variable this table
does not hold. A call's argument (``CacheClient(target=...)``, ``direct=``, ...) always
beats the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from client.errors import InvalidArgumentError
from client.wire.limits import LABEL_PATTERN, MAX_RANK

T = TypeVar("T")
Auto = bool | str  # True, False or "auto"

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_BOOL_WORDS = "true or false (also 1/0, yes/no, on/off)"


def parse_bool(text: str) -> bool:
    """true/1/yes/on or false/0/no/off, in any case."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"is not {_BOOL_WORDS}")


def parse_auto(text: str) -> Auto:
    """ "auto", or a boolean as parse_bool takes it."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return parse_bool(text)
    except ValueError:
        raise ValueError(f"is not auto, {_BOOL_WORDS}") from None


def parse_int(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """A parser of whole numbers from minimum to maximum (None: no bound)."""
    bounds = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"is not a whole number {bounds}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(f"is not {bounds}")
        return value

    return parse


def parse_seconds(text: str) -> float:
    """A positive number of seconds."""
    try:
        value = float(text.strip())
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError("is not a positive number of seconds")
    return value


def parse_choice(*words: str) -> Callable[[str], str]:
    """A parser of one of words, in any case."""

    def parse(text: str) -> str:
        word = text.strip().lower()
        if word not in words:
            raise ValueError(f"is not one of {', '.join(words)}")
        return word

    return parse


def parse_text(text: str) -> str:
    return text.strip()


def parse_label(text: str) -> str:
    """A label the daemon's metrics take (client/wire/limits.py LABEL_PATTERN)."""
    if not re.fullmatch(LABEL_PATTERN, text.strip()):
        raise ValueError("is not 1-64 of A-Z a-z 0-9 _ . -")
    return text.strip()


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: name, parser, default (when unset or empty), the values
    it takes and what it does, as docs/operations.md lists them."""

    name: str
    parse: Callable[[str], T]
    default: T
    takes: str
    help: str
    #: The default as the docs show it, when it is not a value (e.g. "the program's name").
    shown_default: str = ""

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        """The variable's value now (environ: os.environ), parsed; the default when unset."""
        text = (os.environ if environ is None else environ).get(self.name, "")
        if not text.strip():
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            raise InvalidArgumentError(
                f"${self.name}={text!r} {exc}; set it to {self.takes}, "
                f"or unset it for the default ({self.shown()})"
            ) from None

    def shown(self) -> str:
        """The default as the docs and errors show it."""
        if self.shown_default or self.default is None:
            return self.shown_default or "none"
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        return str(self.default)


TARGET: Setting[str] = Setting(
    "SHARDCACHE_TARGET",
    parse_text,
    "127.0.0.1:50051",
    "HOST:PORT or unix:///path.sock",
    "The daemon's address when CacheClient() is given neither target= nor targets= and "
    "SHARDCACHE_TARGETS is unset.",
)
TARGETS: Setting[str | None] = Setting(
    "SHARDCACHE_TARGETS",
    parse_text,
    None,
    "comma-separated HOST:PORT or dns:///NAME:PORT",
    "A fleet of daemons when CacheClient() is given neither target= nor targets= "
    "([fleet.md](fleet.md)).",
)
RESOLVE_SECONDS: Setting[float] = Setting(
    "SHARDCACHE_RESOLVE_SECONDS",
    parse_seconds,
    10.0,
    "a positive number of seconds",
    "How often a fleet's dns:/// targets are resolved again ([fleet.md](fleet.md)).",
)
TOKEN: Setting[str | None] = Setting(
    "CACHESERVER_TOKEN",
    parse_text,
    None,
    "text without spaces",
    "The bearer token every call carries when CacheClient(token=) is not given (the "
    "daemon's --auth-token-file).",
)
TLS_CA: Setting[str | None] = Setting(
    "SHARDCACHE_TLS_CA",
    parse_text,
    None,
    "a PEM file's path",
    "The CA a client trusts for the daemon's certificate when CacheClient(tls_ca=) is not "
    "given: TLS on TCP targets (a unix socket speaks none).",
)
TLS_CERT: Setting[str | None] = Setting(
    "SHARDCACHE_TLS_CERT",
    parse_text,
    None,
    "a PEM file's path",
    "The client's certificate for mutual TLS when CacheClient(tls_cert=) is not given; "
    "with SHARDCACHE_TLS_KEY.",
)
TLS_KEY: Setting[str | None] = Setting(
    "SHARDCACHE_TLS_KEY",
    parse_text,
    None,
    "a PEM file's path",
    "The key of SHARDCACHE_TLS_CERT when CacheClient(tls_key=) is not given.",
)
DIRECT: Setting[Auto] = Setting(
    "SHARDCACHE_DIRECT",
    parse_auto,
    "auto",
    "auto, true or false",
    "Read caches straight from the daemon's data dir when direct= is not given: auto "
    "where the files can be read here ([direct.md](direct.md)).",
)
LOCAL_DATA_DIR: Setting[str | None] = Setting(
    "SHARDCACHE_LOCAL_DATA_DIR",
    parse_text,
    None,
    "a directory",
    "Where the daemon's data dir is mounted here, when not at the daemon's own path and "
    "local_data_dir= is not given ([direct.md](direct.md)).",
)
DATA_PLANE: Setting[Auto] = Setting(
    "SHARDCACHE_DATA_PLANE",
    parse_auto,
    "auto",
    "auto or off",
    "Remote reads take record bytes from the daemon's data port when it announces one; off "
    "keeps them on gRPC ([reading.md](reading.md)).",
)
BLOCK_BYTES: Setting[int] = Setting(
    "SHARDCACHE_BLOCK_BYTES",
    parse_int(0),
    256 << 10,
    "a whole number of bytes >= 0",
    "Raw bytes per stored block a write aims at when block_bytes= is not given; 0 stores one "
    "element per value ([writing.md](writing.md#choosing-the-block-size)).",
)
COMPRESS: Setting[str] = Setting(
    "SHARDCACHE_COMPRESS",
    parse_choice("always", "spare-cpu"),
    "always",
    "always or spare-cpu",
    "always compresses every record a write epoch stores, spare-cpu only while the process "
    "has CPU to spare ([writing.md](writing.md#compressing-only-with-cpu-to-spare)).",
)
WRITE_TAP: Setting[bool] = Setting(
    "SHARDCACHE_WRITE_TAP",
    parse_bool,
    True,
    "true or false",
    "cc.cache()'s write epochs tap batchable sources; false sends every one through "
    "from_generator ([writing.md](writing.md)).",
)
TUNE_MALLOC: Setting[bool] = Setting(
    "SHARDCACHE_TUNE_MALLOC",
    parse_bool,
    True,
    "true or false",
    "Raise glibc's mmap and trim thresholds for the read path; false leaves malloc alone "
    "([design.md](design.md#malloc-on-the-read-path)).",
)
JOB: Setting[str | None] = Setting(
    "SHARDCACHE_JOB",
    parse_label,
    None,
    "1-64 of A-Z a-z 0-9 _ . -",
    "The training job this process's readers report as when CacheClient(job=) is not given "
    "([reading.md](reading.md)).",
    shown_default="the program's name",
)
RANK: Setting[int | None] = Setting(
    "SHARDCACHE_RANK",
    parse_int(0, MAX_RANK),
    None,
    f"a whole number from 0 to {MAX_RANK}",
    "The rank this process's readers report as when CacheClient(rank=) is not given "
    "([reading.md](reading.md)).",
    shown_default="TF_CONFIG's task index, else 0",
)

#: Every setting, in the order docs/operations.md lists them.
SETTINGS: tuple[Setting[Any], ...] = (
    TARGET,
    TARGETS,
    RESOLVE_SECONDS,
    TOKEN,
    TLS_CA,
    TLS_CERT,
    TLS_KEY,
    DIRECT,
    LOCAL_DATA_DIR,
    DATA_PLANE,
    BLOCK_BYTES,
    COMPRESS,
    WRITE_TAP,
    TUNE_MALLOC,
    JOB,
    RANK,
)


def markdown_table() -> str:
    """The settings as the markdown table docs/operations.md carries."""
    rows = ["| environment | takes | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = s.shown_default or ("(none)" if s.default is None else f"`{s.shown()}`")
        rows.append(f"| `{s.name}` | {s.takes} | {default} | {s.help} |")
    return "\n".join(rows)


__all__ = [
    "SETTINGS",
    "Auto",
    "Setting",
    "markdown_table",
    "parse_auto",
    "parse_bool",
    "parse_choice",
    "parse_int",
    "parse_label",
    "parse_seconds",
    "parse_text",
]
