"""What the operator allows materialization to run: entry points by module, shipped graphs.

``cacheserver serve --materialize-allow mypkg.pipelines`` allows the entry
points ``mypkg.pipelines:fn`` and ``mypkg.pipelines.sub:fn`` (a module and every
module under it), not ``mypkg.pipelines_v2:fn``; a pattern with a colon,
``mypkg.pipelines:train``, allows that one entry point. Nothing is allowed by
default. ``--allow-shipped-pipelines`` allows serialized tf.data graphs sent by
clients, which read any file the daemon can.

The daemon checks the entry point's name before anything is imported or any
worker starts (:meth:`Policy.check`); the worker checks again, once the function is
resolved, that it is defined in an allowed module (:meth:`Policy.allows_module`),
so an allowed module's imports (``mypkg.pipelines:os.kill``) are out of reach.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from client.wire.status import MaterializeNotAllowed

_IDENT = r"[A-Za-z_]\w*"
#: A module or package (``a.b``) or one entry point (``a.b:fn``).
PATTERN_RE = re.compile(rf"{_IDENT}(\.{_IDENT})*(:{_IDENT}(\.{_IDENT})*)?")
_RISK = "allow only code you trust: it runs as the daemon's user, with the daemon's file access"


def split_patterns(values: Iterable[str]) -> tuple[str, ...]:
    """Flatten repeated and comma-separated patterns; refuse one that is not a name."""
    out: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            if not PATTERN_RE.fullmatch(item):
                raise ValueError(
                    f"{item!r} is not a module or package name ('mypkg.pipelines')"
                    " nor an entry point ('mypkg.pipelines:train')"
                )
            out.append(item)
    return tuple(dict.fromkeys(out))


def _within(module: str, pattern_module: str) -> bool:
    return module == pattern_module or module.startswith(pattern_module + ".")


@dataclass(frozen=True)
class Policy:
    """The operator's allow settings (``--materialize-allow``, ``--allow-shipped-pipelines``)."""

    allow: tuple[str, ...] = ()
    shipped_pipelines: bool = False

    @classmethod
    def from_settings(cls, allow: Iterable[str] = (), shipped_pipelines: bool = False) -> Policy:
        return cls(split_patterns(allow), bool(shipped_pipelines))

    def allows_entry_point(self, entry_point: str) -> bool:
        module = entry_point.partition(":")[0]
        return any(entry_point == p if ":" in p else _within(module, p) for p in self.allow)

    def allows_module(self, entry_point: str, module: str) -> bool:
        """Whether a function whose __module__ is module may run as entry_point."""
        for p in self.allow:
            if ":" in p:
                if entry_point == p and module == p.partition(":")[0]:
                    return True
            elif _within(module, p):
                return True
        return False

    def check(self, entry_point: str, shipped: bool) -> None:
        """Raise MaterializeNotAllowed unless the operator allowed this source."""
        if shipped:
            if not self.shipped_pipelines:
                raise MaterializeNotAllowed(
                    "this daemon does not run shipped pipelines (datasets sent as serialized "
                    "tf.data graphs): start it with `cacheserver serve "
                    "--allow-shipped-pipelines` (or CACHESERVER_ALLOW_SHIPPED_PIPELINES=true, "
                    "or allow_shipped_pipelines = true in its TOML file) only if every client "
                    "that can reach it is trusted, since a shipped pipeline reads any file the "
                    "daemon can; or materialize an allowed entry point ('module:function')"
                )
            return
        attrs = entry_point.partition(":")[2].split(".")
        if any(a.startswith("__") and a.endswith("__") for a in attrs):
            raise MaterializeNotAllowed(
                f"entry point {entry_point!r} names a dunder attribute; name a function "
                "defined in an allowed module ('module:function')"
            )
        if self.allows_entry_point(entry_point):
            return
        module = entry_point.partition(":")[0]
        allowed = f"allowed: {', '.join(self.allow)}" if self.allow else "none are allowed"
        raise MaterializeNotAllowed(
            f"entry point {entry_point!r} is not allowed on this daemon ({allowed}): the "
            f"operator can allow its module with `cacheserver serve --materialize-allow "
            f"{module}` (or CACHESERVER_MATERIALIZE_ALLOW={module}, or materialize_allow = "
            f'["{module}"] in its TOML file); {_RISK}'
        )

    def check_resolved(self, entry_point: str, fn: Any) -> None:
        """In the worker: the resolved function must be defined in an allowed module."""
        module = getattr(fn, "__module__", None)
        if isinstance(module, str) and self.allows_module(entry_point, module):
            return
        qualname = getattr(fn, "__qualname__", type(fn).__qualname__)
        raise MaterializeNotAllowed(
            f"entry point {entry_point!r} resolves to {module or '?'}.{qualname}, which is "
            f"not defined in an allowed module ({', '.join(self.allow) or 'none'}); name a "
            "function defined in the allowed module itself"
        )
