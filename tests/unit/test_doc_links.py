"""Every relative link in README.md and docs/*.md leads somewhere: the file exists, and an
#anchor names a heading of the page it points at (GitHub's way of making anchors)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^ *```.*?^ *```", re.S | re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#+ (.*)$", FENCE.sub("", page.read_text()), re.M):
        slug = anchor(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {linked.name}")
    return broken


def test_every_relative_link_and_anchor_in_the_docs_resolves() -> None:
    broken = {str(page.relative_to(ROOT)): found for page in PAGES if (found := broken_links(page))}
    assert not broken, broken


def test_a_missing_heading_and_a_missing_file_are_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Differences from `ds.cache()`\n\n[ok](#differences-from-dscache) "
        "[gone](#nowhere) [file](other.md)\n"
    )
    assert [b.split(":")[0] for b in broken_links(page)] == ["#nowhere", "other.md"]
