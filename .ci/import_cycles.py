"""Fails on an import cycle among the scripts of bench/ and tests/ (make lint runs it).

The packages (client, cacheserver) are checked by import-linter's acyclic_siblings
contract (pyproject.toml). bench/ and tests/ are folders of scripts that import each
other by bare module name (``from workloads import WORKLOADS``), which import-linter
cannot graph, so this reads their imports with ``ast`` (type-only ones included) and
sorts them with the standard library's ``graphlib``, which names a cycle when it finds one.
"""

from __future__ import annotations

import ast
import graphlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Folders whose modules import one another by bare name (sys.path holds the folder).
FOLDERS = ("bench", "tests")


def imports(path: Path) -> set[str]:
    """The top-level names path imports, anywhere in it (functions, TYPE_CHECKING too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def cycle(folder: Path) -> list[str] | None:
    """A cycle among the modules directly in folder, or None."""
    modules = {p.stem: p for p in folder.glob("*.py")}
    graph = {name: imports(path) & modules.keys() - {name} for name, path in modules.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def main() -> int:
    found = False
    for name in FOLDERS:
        for folder in sorted({p.parent for p in (ROOT / name).rglob("*.py")}):
            names = cycle(folder)
            if names:
                found = True
                print(f"import cycle in {folder.relative_to(ROOT)}/: {' -> '.join(names)}")
    if found:
        print("move what the modules share into a module both import (../shared/STYLE.md)")
        return 1
    print(f"no import cycles in {', '.join(f'{n}/' for n in FOLDERS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
