"""Every measured figure lives in docs/benchmarks.md; other docs link to its sections.

The rule (also in docs/benchmarks.md's opening): outside docs/benchmarks.md, a doc's prose may
not carry

- a ratio: a number with an ``x`` (``1.22x``, ``0.9x``, ``2x``);
- a rate: a number with ``el/s``, ``elements/s``, ``images/s``, ``KB/s``, ``MB/s``, ``GB/s``,
  ``MiB/s``, ``GiB/s``, ``Mbit/s``, ``Gbit/s`` or ``a second``;
- a percentage: a number with ``%``;
- a latency: a number with ``ns``, ``us``, ``µs`` or ``ms``;
- a measured size: a number with ``MB`` or ``GB`` (decimal units: a run's RSS, an image's
  size). Sizes in binary units (``4 MiB`` chunks, ``--max-bytes 2GiB``) are settings and
  constants, and ``KB`` describes elements (``1 KB vectors``): both allowed.

Not scanned: text in backticks (inline code and fenced blocks: commands, options, sample
output). A line that has to state such a number as a setting or a documented constant ends
with ``<!-- figure-ok: why -->`` (the reason is required); keep those few.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOME = "docs/benchmarks.md"


_NUMBER = r"(?<![\w.])(?<![A-Za-z]-)\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(
    rf"{_NUMBER}x(?![\w])"
    rf"|{_NUMBER}\s?k?\s?(?:el/s|elements/s|images/s|[KMG]B/s|[MG]iB/s|[MG]bit/s)"
    rf"|{_NUMBER}\s?k?\s+(?:elements\s+)?a second"
    rf"|{_NUMBER}\s?%"
    rf"|{_NUMBER}\s?(?:ns|us|µs|ms)\b"
    rf"|{_NUMBER}\s?[MG]B\b"
)
_OK = re.compile(r"<!-- figure-ok: \S[^>]*-->")
_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`]*`")


def docs() -> list[str]:
    paths = [ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")]
    paths += (ROOT / "deploy").rglob("README*.md")
    return sorted(str(p.relative_to(ROOT)) for p in paths if p.is_file())


def figures(text: str) -> list[str]:
    """``line N: the figure`` for every figure the rule forbids in ``text``."""
    found: list[str] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or _OK.search(line):
            continue
        for match in FIGURE.finditer(_INLINE_CODE.sub("``", line)):
            found.append(f"line {number}: {match.group(0)!r}")
    return found


@pytest.mark.parametrize(
    "text",
    [
        "direct reads run at 1.22x `cache(filename)`",
        "0.9x over gRPC",
        "1.4-1.6x gRPC's rate",
        "at 818k el/s",
        "moves 2.5 GB/s",
        "reads 1,200 images/s",
        "about 60,000 elements a second",
        "the stall reads 63%",
        "a round trip costs about 1 ms",
        "about 19 us per element",
        "the client peaks at 0.55 GB",
        "RssAnon 447 MB",
    ],
)
def test_the_rule_catches_a_measured_figure(text: str) -> None:
    assert figures(text), text


@pytest.mark.parametrize(
    "text",
    [
        "`--max-bytes 2GiB` caps the data dir",
        "chunks of up to 4 MiB",
        "1 KB vectors and 602 KB images",
        "a 600 x 602 KB workload",
        "```\n48%|####  | 31/64\n```",
        "see [benchmarks.md](benchmarks.md), 'Read paths'",
        "the backoff starts at 50 ms <!-- figure-ok: the client's retry constant -->",
        "version 2.21, 0x1f, Python 3.11",
        "epoch-2 elements/s over the baseline's",
    ],
)
def test_the_rule_lets_settings_and_descriptions_through(text: str) -> None:
    assert not figures(text), figures(text)


def test_a_figure_ok_marker_needs_a_reason() -> None:
    assert figures("reads 63% <!-- figure-ok: -->")


@pytest.mark.parametrize("path", [d for d in docs() if d != HOME])
def test_no_doc_outside_benchmarks_quotes_a_figure(path: str) -> None:
    found = figures((ROOT / path).read_text())
    assert not found, (
        f"{path} quotes measured figures; move them into {HOME} under the section of the "
        f"command that measures them and link there (or mark a setting's line "
        f"<!-- figure-ok: why -->): " + "; ".join(found)
    )
