"""Client strings in the daemon's log: escaped and truncated, so a request adds a bounded
number of bytes and cannot forge a line (docs/operations.md, "Logs")."""

from __future__ import annotations

#: Most characters of one client string a log line shows.
SHOWN_CHARS = 200


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """value for a log line: at most limit characters, escaped as repr escapes them
    (newlines, control characters, quotes, backslashes), then how much was cut."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) - limit
    escaped = repr(text[:limit] if cut > 0 else text)[1:-1]
    return f"{escaped}...({cut} more chars)" if cut > 0 else escaped
