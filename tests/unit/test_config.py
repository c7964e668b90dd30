"""The settings table: precedence, validation messages, and the docs that mirror it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cacheserver.config import SETTINGS, ByteSize, ConfigError, markdown_table, resolve

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cacheserver.toml"
    path.write_text(text)
    return path


def test_flags_beat_environment_beat_the_file_beat_defaults(tmp_path: Path) -> None:
    toml = write(
        tmp_path,
        'data_dir = "/from/file"\nmax_bytes = "1GiB"\ngrace = 7\n'
        'listen = ["unix:///run/a.sock", "127.0.0.1:1"]\n',
    )
    env = {"CACHESERVER_MAX_BYTES": "2GiB", "CACHESERVER_GRACE": "8"}
    values, sources = resolve({"grace": 9.0}, toml, env)
    assert values["grace"] == 9.0 and sources["grace"] == "flag --grace"
    assert (
        values["max_bytes"] == 2 << 30
        and sources["max_bytes"] == "environment CACHESERVER_MAX_BYTES"
    )
    assert values["data_dir"] == Path("/from/file") and sources["data_dir"] == f"file {toml}"
    assert values["listen"] == ("unix:///run/a.sock", "127.0.0.1:1")
    assert values["socket_mode"] == 0o660 and sources["socket_mode"] == "default"


def test_a_list_setting_from_the_environment_is_comma_separated(tmp_path: Path) -> None:
    values, _ = resolve(
        {"data_dir": tmp_path}, None, {"CACHESERVER_LISTEN": "127.0.0.1:1, unix:///s.sock"}
    )
    assert values["listen"] == ("127.0.0.1:1", "unix:///s.sock")


def test_an_unknown_file_key_names_the_closest_valid_one(tmp_path: Path) -> None:
    toml = write(tmp_path, 'data_dir = "/d"\nmax_byte = 5\n')
    with pytest.raises(
        ConfigError,
        match=r"unknown setting 'max_byte' in .*did you mean "
        r"'max_bytes'\?",
    ):
        resolve({}, toml, {})


def test_an_unknown_environment_variable_is_an_error_but_the_client_token_is_not(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"CACHESERVER_MAX_BYTE.*did you mean 'max_bytes'"):
        resolve({"data_dir": tmp_path}, None, {"CACHESERVER_MAX_BYTE": "1"})
    resolve({"data_dir": tmp_path}, None, {"CACHESERVER_TOKEN": "t"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"CACHESERVER_LOG_LEVEL": "loud"},
            "log_level from environment CACHESERVER_LOG_LEVEL: 'loud' is not one of 'debug', "
            "'info', 'warning', 'error'",
        ),
        ({"CACHESERVER_MAX_BYTES": "ten gigs"}, "max_bytes from environment .*not a byte size"),
        ({"CACHESERVER_SOCKET_MODE": "rw-rw----"}, "socket_mode .*three octal digits"),
        ({"CACHESERVER_MAX_WORKERS": "1"}, "max_workers .*1 is not in the range x>=4"),
    ],
)
def test_a_bad_value_names_the_key_its_source_and_what_is_accepted(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve({"data_dir": tmp_path}, None, env)


def test_a_bad_value_in_the_file_names_the_file(tmp_path: Path) -> None:
    toml = write(tmp_path, 'data_dir = "/d"\ngrace = "soon"\n')
    with pytest.raises(ConfigError, match=f"grace from file {re.escape(str(toml))}"):
        resolve({}, toml, {})


def test_a_missing_data_dir_says_every_way_to_give_it() -> None:
    with pytest.raises(
        ConfigError,
        match="pass --data-dir, set CACHESERVER_DATA_DIR or put data_dir in the --config file",
    ):
        resolve({}, None, {})


def test_broken_toml_is_reported_with_its_position(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is not valid TOML: .*line 1"):
        resolve({}, write(tmp_path, "data_dir = \n"), {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("4096", 4096),
        ("1KiB", 1024),
        ("1.5GiB", 3 << 29),
        ("2 GB", 2 * 10**9),
        ("10m", 10 << 20),
    ],
)
def test_byte_sizes_take_units(text: str, expected: int) -> None:
    assert ByteSize().convert(text, None, None) == expected


def test_the_operations_doc_carries_the_settings_table_exactly() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert markdown_table() in doc, (
        "docs/operations.md is out of date: paste cacheserver.config.markdown_table() into it"
    )
    assert len(SETTINGS) == markdown_table().count("\n| `")


def test_server_config_defaults_are_the_table_defaults() -> None:
    import dataclasses

    from cacheserver.rpc.server import ServerConfig

    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(ServerConfig)
        if f.name != "data_dir"
    }
    defaults["grace"] = defaults.pop("grace_seconds")
    for s in SETTINGS:
        if s.name in ("data_dir", "log_level", "log_format"):
            continue
        expected = list(s.default) if s.multiple else s.default
        assert defaults[s.name] == expected, s.name
