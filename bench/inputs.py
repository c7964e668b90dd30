"""What docs/benchmarks.md's generated block was measured from, and whether the tree still is.

The inputs are the sources a benchmark's figures depend on: the bench itself and the client and
daemon code a read or a write-through goes through. Each group below is hashed (SHA-256 of every
``.py`` file's path and bytes, sorted by path); ``probes.machine_facts`` records the digests when
a bench measures, ``render.py`` writes them inside the generated block, and

    .venv/bin/python bench/render.py --check docs/benchmarks.md        # make bench-check

exits 1, naming the groups that changed, when the block was made from other sources than the
tree's (or records none). Standard library only: the unit test loads this file by its path.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

#: (group, folder under the repository root, recursive). The client is measured whole (every
#: reader and the write-through); of the daemon, what serves a read and takes a write: the RPC
#: layer, the data plane, the catalog and the object store tier. Not inputs: the daemon's CLI,
#: demo, materializer, metrics and config, the tests, the docs.
GROUPS: tuple[tuple[str, str, bool], ...] = (
    ("bench", "bench", False),
    ("client", "client", False),
    ("client/format", "client/format", True),
    ("client/numpy", "client/numpy", True),
    ("client/observe", "client/observe", True),
    ("client/read", "client/read", True),
    ("client/tf", "client/tf", True),
    ("client/wire", "client/wire", True),
    ("client/write", "client/write", True),
    ("cacheserver/catalog", "cacheserver/catalog", True),
    ("cacheserver/plane", "cacheserver/plane", True),
    ("cacheserver/rpc", "cacheserver/rpc", True),
    ("cacheserver/tier", "cacheserver/tier", True),
)

MARKER = "<!-- bench inputs:"
_RECORDED = re.compile(r"<!-- bench inputs: (?P<pairs>[^>]*?) -->")
_DIGEST_CHARS = 16


def digests(root: Path) -> dict[str, str]:
    """Each group's digest over the tree at ``root`` (a missing folder hashes as empty)."""
    out: dict[str, str] = {}
    for name, folder, recursive in GROUPS:
        base = root / folder
        files = sorted(base.rglob("*.py") if recursive else base.glob("*.py"))
        h = hashlib.sha256()
        for path in files:
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
        out[name] = h.hexdigest()[:_DIGEST_CHARS]
    return out


def marker(recorded: dict[str, str] | None) -> str:
    """The line the generated block carries: every group's digest, or none recorded."""
    if not recorded:
        return f"{MARKER} not recorded -->"
    return f"{MARKER} " + " ".join(f"{k}={v}" for k, v in sorted(recorded.items())) + " -->"


def recorded_in(text: str) -> dict[str, str] | None:
    """The digests written in a document's generated block; None when it records none."""
    found = _RECORDED.search(text)
    if found is None or found["pairs"].strip() == "not recorded":
        return None
    pairs = (item.partition("=") for item in found["pairs"].split())
    return {k: v for k, _, v in pairs}


def stale(doc_text: str, root: Path) -> str | None:
    """Why ``doc_text``'s generated block is not of the tree at ``root``; None when it is."""
    recorded = recorded_in(doc_text)
    fix = "run make bench (or bench/run.py --doc docs/benchmarks.md) to measure this tree"
    if recorded is None:
        return f"the generated block records no hash of the bench inputs: {fix}"
    current = digests(root)
    changed = sorted(
        k for k in current.keys() | recorded.keys() if current.get(k) != recorded.get(k)
    )
    if not changed:
        return None
    changed_text = ", ".join(changed)
    return f"the bench inputs changed since the generated block was measured: {changed_text}; {fix}"
