"""cc.torch()'s conversion of the reader's elements and batches to tensors
(client/numpy/torch.py ``tensors``): the same as PyTorch's default_convert gives, with
numeric arrays sharing their memory, for every structure a cache's element may have."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import default_convert  # noqa: E402

from client.numpy.torch import tensors  # noqa: E402


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and (a == b).all()
    return type(a) is type(b) and a == b


@pytest.mark.parametrize(
    "item",
    [
        {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "i": np.arange(3)},
        {"ok": np.array([True, False]), "z": np.array([1 + 2j]), "u": np.arange(4, dtype=np.uint8)},
        {"outer": {"inner": np.arange(3, dtype=np.int16)}, "s": np.int64(7)},
        {"text": np.array([b"a", b"bc"], dtype=object), "name": b"raw"},
        (np.arange(2), {"y": np.ones(2, np.float64)}),
        np.arange(5, dtype=np.int32),
        np.float32(1.5),
    ],
    ids=["arrays", "kinds", "nested", "strings", "tuple", "array", "scalar"],
)
def test_tensors_converts_as_default_convert_does(item: Any) -> None:
    assert same(default_convert(item), tensors(item))


def test_a_numeric_array_becomes_a_tensor_over_its_own_memory() -> None:
    batch = {"x": np.zeros((4, 8), np.float32)}
    got = tensors(batch)["x"]
    assert got.data_ptr() == batch["x"].ctypes.data
    batch["x"][1, 2] = 5.0
    assert got[1, 2].item() == 5.0
