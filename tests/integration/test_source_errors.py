"""A source that raises, through cc.cache() and through ds.cache(), element by element.

Both write paths: fixed-shape elements (the tap, client/tf/tap.py) and
variable-shape ones (the generator path). A hang is caught by the timeout
marker, never by timing.
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
#: Known gaps (README, "Differences from ds.cache()"): the write epoch batches the source
#: before its elements reach the caller, and a batch holding an error is dropped whole.
LOSES_BATCH = pytest.mark.xfail(strict=True, reason="elements batched with the failing one "
                                "are lost; the generator path reports UnknownError")
#: After a short write epoch, assert_cardinality raises on every later call: under
#: ignore_errors() that never ends, and the timeout would end the whole run.
HANGS = pytest.mark.xfail(run=False, reason="assert_cardinality raises on every call after "
                          "a short epoch; ignore_errors() spins")


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


@LOSES_BATCH
@SHAPES
def test_elements_before_a_source_error_arrive_before_it_with_its_class_and_message(
        cc, name, shape) -> None:
    expected, expected_error = until_error(source(shape).cache())
    seen, error = until_error(cc.cache(source(shape), name=name))
    assert seen == expected
    assert type(error) is type(expected_error)
    assert MESSAGE in error.message


@SHAPES
def test_a_source_error_commits_nothing_and_the_next_epoch_runs_the_source(
        cc, name, shape, no_thread_leak) -> None:
    counter = [0]
    ds = cc.cache(source(shape, counter), name=name)
    until_error(ds)
    gc.collect()  # the error's traceback holds the iterator, whose end cancels the write
    wait_until(lambda: gone(cc, name), 20, f"cache {name!r} discarded")
    before = counter[0]
    _, error = until_error(ds)
    assert counter[0] > before, "the second epoch did not run the source"
    assert MESSAGE in error.message


@HANGS
@SHAPES
@pytest.mark.timeout(120)
def test_ignore_errors_after_the_cache_yields_what_ds_cache_yields_on_every_epoch_and_ends(
        cc, name, shape) -> None:
    expected = source(shape).cache().ignore_errors()
    ds = cc.cache(source(shape), name=name).ignore_errors()
    for _ in range(2):
        assert [value(x) for x in ds] == [value(x) for x in expected]


@HANGS
@SHAPES
@pytest.mark.timeout(120)
def test_a_loop_that_catches_the_error_and_goes_on_ends_with_ds_caches_elements(
        cc, name, shape) -> None:
    expected, _ = catching(source(shape).cache())
    seen, errors = catching(cc.cache(source(shape), name=name))
    assert seen == expected
    assert errors[0] == "InvalidArgumentError"
