"""docs/operations.md's "Commands" table names every `cacheserver` subcommand and option as the
CLI defines them (cacheserver/cli/main.py); `serve`'s options are the settings table, checked by
tests/unit/test_config.py."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from cacheserver.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_ROW = re.compile(r"^\| `cacheserver (?P<usage>[^|]*?)` \| (?P<what>.*) \|$")
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_LINK = re.compile(r"\]\((?P<doc>[a-z-]+\.md)(?:#[^)]*)?\)")


def _commands_section() -> str:
    text = (DOCS / "operations.md").read_text()
    return text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]


def _rows() -> dict[str, tuple[str, str]]:
    """Subcommand -> (its usage, the row's text), for each row (`pin` / `unpin` share one)."""
    rows: dict[str, tuple[str, str]] = {}
    for line in _commands_section().splitlines():
        found = _ROW.match(line)
        if found is None:
            continue
        for usage in found["usage"].split("` / `"):
            rows[usage.split()[0]] = (usage, line)
    return rows


def _options(command: click.Command) -> set[str]:
    return {
        opt
        for param in command.params
        if isinstance(param, click.Option)
        for opt in param.opts + param.secondary_opts
        if opt.startswith("--")
    }


def test_the_table_has_a_row_for_every_subcommand_and_no_other() -> None:
    assert set(_rows()) == set(main.commands)


@pytest.mark.parametrize("name", sorted(set(main.commands) - {"serve"}))
def test_every_option_documented_exists_and_every_option_is_documented(name: str) -> None:
    usage, row = _rows()[name]
    command = main.commands[name]
    defined = _options(command)
    documented = set(_OPTION.findall(usage))
    assert documented <= defined, f"cacheserver {name} has no {documented - defined}"
    prose = _commands_section().split("\n\n", 2)[-1]  # the paragraphs after the table
    linked = "".join((DOCS / m["doc"]).read_text() for m in _LINK.finditer(row))
    elsewhere = set(_OPTION.findall(prose)) | {o for o in defined if o in linked}
    missing = defined - documented - elsewhere - {"--help"}
    assert not missing, (
        f"docs/operations.md, Commands: cacheserver {name}'s {sorted(missing)} are not documented"
    )


def test_serve_takes_its_config_file_as_documented() -> None:
    usage, _ = _rows()["serve"]
    assert "--config" in _OPTION.findall(usage)
    assert "--config" in _options(main.commands["serve"])
