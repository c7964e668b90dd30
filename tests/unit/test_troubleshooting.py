"""docs/troubleshooting.md quotes messages the code still prints.

Every line of a ```text block on the page is a message with `<...>` where a value goes; each
piece between those must lie inside one string literal of cacheserver/ or client/ (the pieces
of an f-string or a %-format between its holes), so a reworded message fails here until the
page follows it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
HOLE = re.compile(r"'?<[^<>]*>'?")  # a value; !r puts quotes round a name
PRINTF = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrgfx%]")


def literal_pieces() -> list[str]:
    """The constant text of every string literal in the packages, cut at its holes."""
    pieces: list[str] = []
    for package in ("cacheserver", "client"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.JoinedStr):
                    parts = [v.value for v in node.values if isinstance(v, ast.Constant)]
                    pieces.extend(str(p) for p in parts)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    pieces.extend(PRINTF.split(node.value))
    return pieces


def quoted_messages(page: Path = PAGE) -> list[str]:
    blocks = re.findall(r"^ *```text\n(.*?)^ *```", page.read_text(), re.S | re.M)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def missing_pieces(message: str, pieces: list[str]) -> list[str]:
    """The pieces of message (its text between holes) no literal holds."""
    wanted = [p for p in HOLE.split(message.removeprefix("Error: ")) if len(p.strip()) > 3]
    return [w for w in wanted if not any(w in piece for piece in pieces)]


def test_every_quoted_message_is_still_printed_by_the_code() -> None:
    pieces = literal_pieces()
    messages = quoted_messages()
    assert len(messages) >= 9, messages
    stale = {m: missing_pieces(m, pieces) for m in messages}
    assert not {m: p for m, p in stale.items() if p}, stale


def test_a_reworded_message_is_caught() -> None:
    pieces = literal_pieces()
    assert (
        missing_pieces("cannot reach cacheserver at <target> within <s>s: start it", pieces) == []
    )
    assert missing_pieces("cannot reach the cacheserver at <target>", pieces) == [
        "cannot reach the cacheserver at "
    ]
