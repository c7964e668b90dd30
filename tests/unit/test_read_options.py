"""Every reader's keywords become one plan.ReadOptions, with one default per keyword."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from client import CacheClient
from client.errors import InvalidArgumentError
from client.read.planning.plan import ReadOptions, ReadState

#: The public methods that read, and the keywords of theirs that are not read options.
READERS = {
    "dataset": {"name", "resume_from"},
    "mix": {"weights", "size"},
    "cache": {"dataset", "name", "version", "block_bytes"},
    "numpy": {"name"},
    "torch": {"name", "rank", "world_size"},
    "source": {"name"},
    "read_state": {"name", "elements_seen"},
    "mix_read_state": {"weights", "elements_seen", "size"},
}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(ReadOptions)}


@pytest.mark.parametrize("method", sorted(READERS))
def test_a_readers_keywords_are_read_options_with_their_defaults(method: str) -> None:
    params = inspect.signature(getattr(CacheClient, method)).parameters
    for name, param in params.items():
        if name == "self" or name in READERS[method]:
            continue
        assert name in DEFAULTS, f"{method}({name}=) is not a ReadOptions field"
        if param.default is not inspect.Parameter.empty:
            assert param.default == DEFAULTS[name], (
                f"{method}({name}={param.default!r}) differs from ReadOptions' {DEFAULTS[name]!r}"
            )


def test_options_are_built_from_a_methods_keywords_and_nothing_else() -> None:
    state = ReadState("c", "f", "none", 0, 0, 1, 2, 3)
    options = ReadOptions.of(
        {
            "self": object(),
            "name": "c",
            "shuffle": "shards",
            "seed": 7,
            "resume": state,
            "batch_size": 64,
            "direct": False,
        }
    )
    assert (options.shuffle, options.seed, options.resume, options.batch_size, options.direct) == (
        "shards",
        7,
        state,
        64,
        False,
    )
    assert options.prefetch_bytes == DEFAULTS["prefetch_bytes"]


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"prefetch_bytes": 0}, "prefetch_bytes must be >= 1"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"batch_size": True}, "batch_size must be an int"),
        ({"drop_remainder": 1}, "drop_remainder must be True or False"),
        ({"direct": "yes"}, "direct must be 'auto', True or False"),
        ({"num_workers": 2, "shuffle": True}, "needs seed="),
    ],
)
def test_bad_read_options_are_refused_with_what_they_take(
    keywords: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        ReadOptions(**keywords)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["dataset", "mix", "cache"])
def test_the_removed_checkpoint_keyword_is_refused_naming_why(method: str) -> None:
    cc = CacheClient.__new__(CacheClient)  # no daemon needed: refused before any call
    with pytest.raises(
        InvalidArgumentError,
        match=r"no longer takes checkpoint=: every "
        r"dataset's iterators save in tf.train.Checkpoint",
    ):
        getattr(cc, method)("x", checkpoint=True)
