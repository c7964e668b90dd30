"""cc.write()'s element spec without a daemon: inferred from the first elements, later elements
checked against it, errors naming the element and the component."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from client.errors import InvalidArgumentError
from client.format import spec
from client.format.layout import Leaf
from client.numpy.writer import Flattener, infer

Pair = collections.namedtuple("Pair", ["count", "name"])


def test_dtypes_come_from_the_first_element_and_varying_dimensions_become_unknown() -> None:
    head = [
        {
            "image": np.zeros((4, 5 + i % 2, 3), np.uint8),
            "label": i,
            "text": b"x" * i,
            "pair": Pair(np.float32(i), "name"),
            "seq": [np.arange(3), 2.5],
        }
        for i in range(3)
    ]
    assert infer(head) == {
        "image": Leaf("uint8", (4, None, 3)),
        "label": Leaf("int64", ()),
        "text": Leaf("string", ()),
        "pair": spec.Named("Pair", (("count", Leaf("float32", ())), ("name", Leaf("string", ())))),
        "seq": (Leaf("int64", (3,)), Leaf("float64", ())),  # a list is stored as a tuple
    }


@pytest.mark.parametrize(
    "second, says",
    [
        (
            {"a": np.zeros(3, np.float32)},
            "element 1 differs from element 0: element component "
            "['a'] is float32 of shape (3,), where element 0 has int64 of shape (3,)",
        ),
        ({"a": np.zeros((3, 1), np.int64)}, "component ['a'] is int64 of shape (3, 1)"),
        (
            {"b": np.zeros(3, np.int64)},
            "is a dict of keys ['b'], where element 0 has a dict of keys ['a']",
        ),
    ],
)
def test_first_elements_that_differ_are_refused_by_component(second, says) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        infer([{"a": np.zeros(3, np.int64)}, second])
    assert says in str(caught.value)


def test_a_dtype_a_cache_cannot_hold_is_refused_by_component() -> None:
    with pytest.raises(
        InvalidArgumentError,
        match=r"component \['t'\]\[1\] has dtype "
        r"datetime64\[s\]",
    ):
        infer([{"t": (1, np.datetime64("2024-01-01", "s"))}])


def test_a_later_element_that_does_not_fit_names_its_index_and_component() -> None:
    flatten = Flattener(infer([{"x": np.zeros((2, 3), np.float32), "s": b"a"}]))
    assert [a.shape for a in flatten(5, {"x": np.ones((2, 3), np.float16), "s": "b"})] == [
        (),
        (2, 3),
    ]  # safe casts and str are taken; leaves in sorted-key order
    with pytest.raises(
        InvalidArgumentError,
        match=r"element 7 does not fit the cache's spec: "
        r"component \['x'\] is float32 of shape \(2, 4\)",
    ):
        flatten(7, {"x": np.zeros((2, 4), np.float32), "s": b""})
    with pytest.raises(InvalidArgumentError, match=r"element 8 .*component \['x'\] is float64"):
        flatten(8, {"x": np.zeros((2, 3)), "s": b""})
    with pytest.raises(InvalidArgumentError, match=r"element 9 .*lacks key 'x'"):
        flatten(9, {"y": 1, "s": b""})


def test_a_batch_is_checked_once_per_component_and_a_misfit_still_names_its_element() -> None:
    flatten = Flattener(infer([(np.zeros(3, np.float32), 0)]))
    rows = [flatten.values(10 + i, (np.full(3, i, np.float16), i)) for i in range(4)]
    x, i = flatten.stacked(10, rows)
    assert x.dtype == np.float32 and x.shape == (4, 3) and i.tolist() == [0, 1, 2, 3]
    rows[2] = flatten.values(12, (np.zeros(4, np.float32), 2))
    with pytest.raises(
        InvalidArgumentError,
        match=r"element 12 .*component \[0\] is float32 "
        r"of shape \(4,\)",
    ):
        flatten.stacked(10, rows)
    rows[2] = flatten.values(12, (np.zeros(3, np.float32), 2.5))
    with pytest.raises(InvalidArgumentError, match=r"element 12 .*component \[1\] is float64"):
        flatten.stacked(10, rows)
