"""What materialization may run: the operator's allow list and the shipped-pipeline switch."""

from __future__ import annotations

import os
from pathlib import Path

import click
import grpc
import pytest
from click.testing import CliRunner

from cacheserver import config
from cacheserver.catalog.catalog import Catalog
from cacheserver.cli.main import main
from cacheserver.materialize.materializer import Materializer
from cacheserver.materialize.policy import Policy, split_patterns
from client import MaterializeNotAllowedError
from client.wire.status import MaterializeNotAllowed


def test_a_module_allows_its_entry_points_and_its_submodules_not_one_sharing_its_prefix() -> None:
    policy = Policy.from_settings(["mypkg.pipelines"])
    assert policy.allows_entry_point("mypkg.pipelines:train")
    assert policy.allows_entry_point("mypkg.pipelines.sub:fn")
    assert policy.allows_entry_point("mypkg.pipelines:Builder.build")
    assert not policy.allows_entry_point("mypkg.pipelines_v2:train")
    assert not policy.allows_entry_point("mypkg:train")
    assert not policy.allows_entry_point("os:kill")


def test_an_entry_point_pattern_allows_that_entry_point_only() -> None:
    policy = Policy.from_settings(["mypkg.pipelines:train"])
    assert policy.allows_entry_point("mypkg.pipelines:train")
    assert not policy.allows_entry_point("mypkg.pipelines:other")
    assert not policy.allows_entry_point("mypkg.pipelines.sub:train")


def test_by_default_nothing_runs_and_the_refusal_names_the_flag_variable_and_toml_key() -> None:
    with pytest.raises(MaterializeNotAllowed) as err:
        Policy().check("mypkg.pipelines:train", shipped=False)
    message = str(err.value)
    assert "'mypkg.pipelines:train' is not allowed on this daemon (none are allowed)" in message
    assert "cacheserver serve --materialize-allow mypkg.pipelines" in message
    assert "CACHESERVER_MATERIALIZE_ALLOW=mypkg.pipelines" in message
    assert 'materialize_allow = ["mypkg.pipelines"]' in message
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert MaterializeNotAllowedError.reason == err.value.reason == "MATERIALIZE_NOT_ALLOWED"


def test_shipped_pipelines_are_allowed_or_refused_by_their_own_switch() -> None:
    with pytest.raises(MaterializeNotAllowed, match=r"--allow-shipped-pipelines.*any file"):
        Policy.from_settings(["mypkg"]).check("", shipped=True)
    Policy(shipped_pipelines=True).check("", shipped=True)
    with pytest.raises(MaterializeNotAllowed, match="--materialize-allow"):
        Policy(shipped_pipelines=True).check("mypkg:fn", shipped=False)


def test_a_dunder_attribute_is_refused_even_in_an_allowed_module() -> None:
    with pytest.raises(MaterializeNotAllowed, match="dunder"):
        Policy.from_settings(["mypkg"]).check("mypkg:train.__globals__", shipped=False)


def _defined_here(shard: int, num_shards: int) -> None:
    """A function whose __module__ is this test module."""


def test_a_resolved_function_must_be_defined_in_an_allowed_module() -> None:
    here = _defined_here.__module__
    policy = Policy.from_settings([here])
    policy.check_resolved(f"{here}:_defined_here", _defined_here)
    with pytest.raises(
        MaterializeNotAllowed,
        match=rf"'{here}:os.kill' resolves to posix.kill, which is not "
        "defined in an allowed module",
    ):
        policy.check_resolved(f"{here}:os.kill", os.kill)
    with pytest.raises(MaterializeNotAllowed):
        Policy.from_settings([f"{here}:kill"]).check_resolved(f"{here}:kill", os.kill)


def test_patterns_are_repeatable_and_comma_separated_and_must_be_names() -> None:
    assert split_patterns(["a.b, c", "d:fn", "a.b"]) == ("a.b", "c", "d:fn")
    with pytest.raises(ValueError, match="not a module or package name"):
        split_patterns(["a/b"])


def test_the_allow_list_comes_from_flags_environment_or_toml_like_every_setting(
    tmp_path: Path,
) -> None:
    toml = tmp_path / "serve.toml"
    toml.write_text(
        'data_dir = "/d"\nmaterialize_allow = ["a.b", "c"]\nallow_shipped_pipelines = true\n'
    )
    values, _ = config.resolve({}, toml, environ={})
    assert Policy.from_settings(
        values["materialize_allow"], values["allow_shipped_pipelines"]
    ) == Policy(("a.b", "c"), True)
    values, sources = config.resolve(
        {},
        toml,
        environ={
            "CACHESERVER_MATERIALIZE_ALLOW": "x.y,z",
            "CACHESERVER_ALLOW_SHIPPED_PIPELINES": "0",
        },
    )
    assert Policy.from_settings(
        values["materialize_allow"], values["allow_shipped_pipelines"]
    ) == Policy(("x.y", "z"))
    assert sources["materialize_allow"] == "environment CACHESERVER_MATERIALIZE_ALLOW"
    values, _ = config.resolve({"data_dir": Path("/d")}, None, environ={})
    assert (
        Policy.from_settings(values["materialize_allow"], values["allow_shipped_pipelines"])
        == Policy()
    )
    with pytest.raises(config.ConfigError, match=r"materialize_allow from environment.*'a/b'"):
        config.resolve(
            {"data_dir": Path("/d")}, None, environ={"CACHESERVER_MATERIALIZE_ALLOW": "a/b"}
        )


def test_the_serve_flags_are_repeatable_comma_separated_and_a_switch() -> None:
    seen: dict[str, object] = {}

    @click.command()
    @config.click_options
    def serve(**flags: object) -> None:
        seen.update(flags)

    result = CliRunner().invoke(
        serve,
        ["--materialize-allow", "a.b,c", "--materialize-allow", "d", "--allow-shipped-pipelines"],
    )
    assert result.exit_code == 0, result.output
    assert Policy.from_settings(
        seen["materialize_allow"],  # type: ignore[arg-type]
        bool(seen["allow_shipped_pipelines"]),
    ) == Policy(("a.b", "c", "d"), True)
    CliRunner().invoke(serve, [])
    assert seen["allow_shipped_pipelines"] is None  # unset: the environment or file decides


def test_starting_an_entry_point_that_is_not_allowed_creates_nothing(tmp_path: Path) -> None:
    m = Materializer(Catalog(tmp_path))
    with pytest.raises(MaterializeNotAllowed, match="--materialize-allow os"):
        m.start("x", entry_point="os:kill", num_shards=1)
    with pytest.raises(MaterializeNotAllowed, match="--allow-shipped-pipelines"):
        m.start("x", graph_def=b"g", element_spec=b"s", num_shards=1)
    assert m.catalog.list() == []


def test_the_cli_help_says_how_to_allow_materialization() -> None:
    serve_help = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--materialize-allow" in serve_help and "--allow-shipped-pipelines" in serve_help
    assert "CACHESERVER_MATERIALIZE_ALLOW" in serve_help
    materialize_help = CliRunner().invoke(main, ["materialize", "--help"]).output
    assert "--materialize-allow" in materialize_help
