"""The client's settings table (client/settings.py): parsers, errors, the docs' table, and that
no module of the client reads a variable the table does not hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from client import settings
from client.errors import InvalidArgumentError
from client.format.blocks import blocked, check_block_bytes
from client.format.layout import Layout, Leaf
from client.settings import SETTINGS, markdown_table

ROOT = Path(__file__).resolve().parents[2]
NAMES = {s.name for s in SETTINGS}
_VARIABLE = re.compile(r"\b(?:SHARDCACHE_[A-Z_]+|CACHESERVER_TOKEN)\b")


@pytest.mark.parametrize("text", ["true", "1", "yes", "on", "TRUE", " On "])
def test_every_spelling_of_true_is_true(text: str) -> None:
    assert settings.WRITE_TAP.get({"SHARDCACHE_WRITE_TAP": text}) is True


@pytest.mark.parametrize("text", ["false", "0", "no", "off", "False", " OFF "])
def test_every_spelling_of_false_is_false(text: str) -> None:
    assert settings.TUNE_MALLOC.get({"SHARDCACHE_TUNE_MALLOC": text}) is False


@pytest.mark.parametrize(
    ("text", "value"),
    [("auto", "auto"), ("AUTO", "auto"), ("yes", True), ("0", False), ("off", False)],
)
def test_a_setting_with_auto_takes_auto_and_the_booleans(text: str, value: object) -> None:
    assert settings.DIRECT.get({"SHARDCACHE_DIRECT": text}) == value
    assert settings.DATA_PLANE.get({"SHARDCACHE_DATA_PLANE": text}) == value


@pytest.mark.parametrize(
    "environ", [{}, {"SHARDCACHE_BLOCK_BYTES": ""}, {"SHARDCACHE_BLOCK_BYTES": "  "}]
)
def test_an_unset_or_empty_variable_is_the_default(environ: dict[str, str]) -> None:
    assert settings.BLOCK_BYTES.get(environ) == 256 << 10


@pytest.mark.parametrize(
    ("setting", "text", "says"),
    [
        (settings.WRITE_TAP, "maybe", "is not true or false (also 1/0, yes/no, on/off)"),
        (settings.DIRECT, "sometimes", "is not auto, true or false"),
        (settings.BLOCK_BYTES, "256KiB", "is not a whole number >= 0"),
        (settings.BLOCK_BYTES, "-1", "is not >= 0"),
        (settings.RANK, "two", "is not a whole number from 0 to 1048576"),
        (settings.RANK, "1048577", "is not from 0 to 1048576"),
        (settings.RESOLVE_SECONDS, "0", "is not a positive number of seconds"),
        (settings.RESOLVE_SECONDS, "nan", "is not a positive number of seconds"),
        (settings.COMPRESS, "never", "is not one of always, spare-cpu"),
        (settings.JOB, "my job", "is not 1-64 of A-Z a-z 0-9 _ . -"),
    ],
)
def test_a_bad_value_names_the_variable_and_what_it_takes(
    setting: settings.Setting[object], text: str, says: str
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        setting.get({setting.name: text})
    message = str(caught.value)
    assert message.startswith(f"${setting.name}={text!r} {says}")
    assert message.endswith(
        f"; set it to {setting.takes}, or unset it for the default ({setting.shown()})"
    )


def test_good_values_of_each_kind_are_parsed() -> None:
    assert settings.RANK.get({"SHARDCACHE_RANK": " 7 "}) == 7
    assert settings.RESOLVE_SECONDS.get({"SHARDCACHE_RESOLVE_SECONDS": "0.5"}) == 0.5
    assert settings.COMPRESS.get({"SHARDCACHE_COMPRESS": " Spare-CPU "}) == "spare-cpu"
    assert settings.JOB.get({"SHARDCACHE_JOB": "train-v2.1"}) == "train-v2.1"
    assert settings.TARGET.get({"SHARDCACHE_TARGET": "unix:///run/c.sock "}) == "unix:///run/c.sock"


def test_values_are_read_when_used_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout((Leaf("float32", (256,)),))  # 1 KiB records
    monkeypatch.setenv("SHARDCACHE_BLOCK_BYTES", "4096")
    assert check_block_bytes(None) == 4096
    assert blocked(layout).block_elements == 4
    monkeypatch.setenv("SHARDCACHE_BLOCK_BYTES", "lots")
    with pytest.raises(InvalidArgumentError, match=r"\$SHARDCACHE_BLOCK_BYTES='lots'"):
        check_block_bytes(None)


def test_the_operations_doc_carries_the_client_settings_table_exactly() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert markdown_table() in doc, (
        "docs/operations.md is out of date: paste client.settings.markdown_table() into it"
    )
    assert len(SETTINGS) == len(NAMES) == markdown_table().count("\n| `")


def test_every_variable_the_docs_name_exists() -> None:
    from cacheserver.cli.top import METRICS_ENV  # cacheserver top's own, not the library's

    named: dict[str, str] = {}
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "deploy").rglob("*")]:
        if path.is_file():
            for name in _VARIABLE.findall(path.read_text(errors="replace")):
                named.setdefault(name, str(path.relative_to(ROOT)))
    unknown = {name: where for name, where in named.items() if name not in NAMES | {METRICS_ENV}}
    assert not unknown, f"documented but not read by anything: {unknown}"
    assert not NAMES - set(named), f"not documented: {NAMES - set(named)}"


def test_the_client_reads_the_environment_only_through_the_table() -> None:
    for path in sorted((ROOT / "client").rglob("*.py")):
        if path.name == "settings.py" and path.parent.name == "client":
            continue
        text = path.read_text()
        unknown = set(_VARIABLE.findall(text)) - NAMES
        assert not unknown, f"{path.relative_to(ROOT)} names {unknown}, not in client/settings.py"
        for line in text.splitlines():
            if re.search(r"os\.(environ|getenv)", line):
                # TF_CONFIG is TensorFlow's variable (a rank's default), not a shardcache setting
                assert "TF_CONFIG" in line, f"{path.relative_to(ROOT)} reads os.environ: {line}"
