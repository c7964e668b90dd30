"""docs/design.md's map of the tree names every module of client/ and cacheserver/, and no other."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: A line of the map: a package folder, then modules in it (more may follow on lines of
#: modules alone; what they do on the lines after).
LINE = re.compile(r"^((?:client|cacheserver)/(?:\w+/)*)\s+((?:\w+\.py\s*)+)$")
MORE = re.compile(r"^\s+((?:\w+\.py\s*)+)$")


def _mapped() -> set[str]:
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("## Structure", 1)[1].split("```", 2)[1]
    found: set[str] = set()
    folder = None
    for line in block.splitlines():
        if match := LINE.match(line):
            folder, modules = match[1], match[2]
        elif folder is not None and (match := MORE.match(line)):
            modules = match[1]
        else:
            folder = None
            continue
        found.update(folder + module for module in modules.split())
    return found


def _modules() -> set[str]:
    return {
        str(p.relative_to(ROOT))
        for package in ("client", "cacheserver")
        for p in (ROOT / package).rglob("*.py")
        if p.name != "__init__.py" and "wire/v1" not in str(p)
    }


def test_the_design_map_lists_every_module_of_the_packages() -> None:
    missing = sorted(_modules() - _mapped())
    assert not missing, f"docs/design.md's Structure does not list {missing}"


def test_the_design_map_lists_no_module_that_does_not_exist() -> None:
    gone = sorted(_mapped() - _modules())
    assert not gone, f"docs/design.md's Structure lists {gone}, which do not exist"
