"""A source that raises, through cc.cache() and through ds.cache(), element by element.

Fixed-shape elements (batched with batch()) and variable-shape ones (flattened
and ragged_batch'ed), both tapped in tf.data (client/tf/tap.py). A hang is
caught by the timeout marker, never by timing.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from waits import gone, wait_until

tf = pytest.importorskip("tensorflow")

BAD = 7
N = 20
MESSAGE = f"element {BAD} is corrupt"


def fixed(x: tf.Tensor) -> tf.Tensor:
    return x


def variable(x: tf.Tensor) -> tf.Tensor:
    return tf.range(x)  # shape (None,): the generator path


SHAPES = pytest.mark.parametrize("shape", [fixed, variable], ids=["fixed", "variable"])
BATCH = 4


def source(shape, counter: list[int] | None = None) -> tf.data.Dataset:
    """range(N) with element BAD failing an assertion; counter counts elements computed."""

    def count(x):
        if counter is not None:
            counter[0] += 1
        return x

    def check(x: tf.Tensor) -> tf.Tensor:
        x = tf.numpy_function(count, [x], tf.int64, stateful=True)
        x.set_shape(())
        bad = tf.debugging.assert_none_equal(x, np.int64(BAD), message=MESSAGE)
        with tf.control_dependencies([bad]):
            return shape(tf.identity(x))

    return tf.data.Dataset.range(N).map(check)


def value(x) -> object:
    x = x.numpy()
    return x.tolist() if isinstance(x, np.ndarray) else int(x)


def until_error(ds: tf.data.Dataset) -> tuple[list[object], tf.errors.OpError]:
    seen = []
    with pytest.raises(tf.errors.OpError) as raised:
        for x in ds:
            seen.append(value(x))
    return seen, raised.value


def catching(ds: tf.data.Dataset, limit: int = 5) -> tuple[list[object], list[str]]:
    """Every element of one epoch, catching errors and calling next() again."""
    it = iter(ds)
    seen: list[object] = []
    errors: list[str] = []
    while True:
        try:
            seen.append(value(next(it)))
        except StopIteration:
            return seen, errors
        except tf.errors.OpError as exc:
            errors.append(type(exc).__name__)
            assert len(errors) <= limit, f"still raising after {seen}: {errors}"


@SHAPES
def test_without_batch_a_source_error_loses_the_elements_batched_with_it(cc, name, shape) -> None:
    """The known difference (docs/reading.md, "Differences from ds.cache()"): the write epoch reads
    its source in batches of ~4 MiB, here all 20 elements; ds.cache() yields the 7 before
    the error. tf.data's batch drops a batch whose input raised (docs/writing.md)."""
    expected, _ = until_error(source(shape).cache())
    assert len(expected) == BAD
    seen, _ = until_error(cc.cache(source(shape), name=name))
    assert seen == []
    expected, _ = catching(source(shape).cache())
    seen, _ = catching(cc.cache(source(shape), name=name))
    assert len(expected) == N - 1 and seen == []


@SHAPES
def test_a_source_error_reaches_the_caller_with_its_class_and_message(cc, name, shape) -> None:
    _, expected = until_error(source(shape).cache())
    seen, error = until_error(cc.cache(source(shape), name=name))
    assert type(error) is type(expected) is tf.errors.InvalidArgumentError
    assert MESSAGE in error.message
    assert seen == [value(x) for x in source(shape).take(len(seen))]


def test_batches_before_and_after_a_source_error_are_ds_caches(cc, name) -> None:
    """batch(B) after the cache batches the source itself: the batch that holds the error
    is lost from both, and a loop that goes on gets the same batches after it."""
    expected, expected_error = until_error(source(fixed).cache().batch(BATCH))
    seen, error = until_error(cc.cache(source(fixed), name=name).batch(BATCH))
    assert seen == expected == [list(range(BATCH))]
    assert type(error) is type(expected_error)
    assert catching(cc.cache(source(fixed), name=name).batch(BATCH)) == catching(
        source(fixed).cache().batch(BATCH)
    )


@SHAPES
def test_a_source_error_commits_nothing_and_the_next_epoch_runs_the_source(
    cc, name, shape, no_thread_leak
) -> None:
    counter = [0]
    ds = cc.cache(source(shape, counter), name=name)
    until_error(ds)
    gc.collect()  # the error's traceback holds the iterator, whose end cancels the write
    wait_until(lambda: gone(cc, name), 20, f"cache {name!r} discarded")
    before = counter[0]
    _, error = until_error(ds)
    assert counter[0] > before, "the second epoch did not run the source"
    assert MESSAGE in error.message


@SHAPES
@pytest.mark.timeout(120)
def test_ignore_errors_after_the_cache_yields_what_ds_cache_yields_on_every_epoch_and_ends(
    cc, name, shape
) -> None:
    expected = [value(x) for x in source(shape).cache().ignore_errors()]
    ds = cc.cache(source(shape), name=name).ignore_errors()
    for _ in range(2):
        assert [value(x) for x in ds] == expected
    assert gone(cc, name), "a source that raised was committed"


@pytest.mark.timeout(120)
def test_ignore_errors_then_batch_yields_ds_caches_batches(cc, name) -> None:
    expected = [value(x) for x in source(fixed).cache().ignore_errors().batch(BATCH)]
    ds = cc.cache(source(fixed), name=name).ignore_errors().batch(BATCH)
    assert [value(x) for x in ds] == expected


@SHAPES
@pytest.mark.timeout(120)
def test_a_loop_that_catches_the_error_and_goes_on_sees_it_once_and_ends(cc, name, shape) -> None:
    expected, _ = catching(source(shape).cache())
    seen, errors = catching(cc.cache(source(shape), name=name))
    assert errors == ["InvalidArgumentError"]
    assert all(x in expected for x in seen)
