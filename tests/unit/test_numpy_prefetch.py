"""The NumPy reader's parts without a daemon: Prefetch's bounded queue of chunk calls, and
Columns cutting chunks into elements and batches."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from client.format.codec import VarLeaf
from client.format.layout import Leaf
from client.numpy.batches import Columns
from client.numpy.prefetch import SMALL_ELEMENT_BYTES, THREADS, Prefetch, threads


class Chunks:
    """count chunks of ids; chunk fail raises; close() records and unblocks the calls."""

    def __init__(self, sizes: list[int], fail: int = -1, block: bool = False) -> None:
        self.sizes, self.count, self.fail = sizes, len(sizes), fail
        self.closed = threading.Event()
        self.block = block
        self.started: list[int] = []
        self._lock = threading.Lock()

    def chunk(self, i: int) -> tuple[int, list[np.ndarray]]:
        with self._lock:
            self.started.append(i)
        if i == self.fail:
            raise OSError(f"chunk {i} failed")
        if self.block and i > 0:
            self.closed.wait(10)  # a call in flight until close() cancels it
        lo = sum(self.sizes[:i])
        return self.sizes[i], [np.arange(lo, lo + self.sizes[i])]

    def close(self) -> None:
        self.closed.set()


def test_chunks_arrive_in_order_with_a_bounded_number_ahead() -> None:
    chunks = Chunks([3] * 20)
    prefetch = Prefetch(chunks, ahead=4, threads=2)
    got = []
    for _, batch in prefetch:
        got.extend(batch[0].tolist())
        assert len(chunks.started) <= len(got) // 3 + 4 + 1
    assert got == list(range(60))
    assert chunks.closed.is_set()


def test_a_chunk_error_reaches_the_consumer_and_ends_the_read(no_thread_leak) -> None:
    chunks = Chunks([2] * 10, fail=3)
    got = []
    with pytest.raises(OSError, match="chunk 3 failed"):
        for _, batch in Prefetch(chunks, ahead=3):
            got.extend(batch[0].tolist())
    assert got == list(range(6))
    assert chunks.closed.is_set()


def test_an_early_stop_cancels_the_calls_in_flight_and_joins_the_threads(no_thread_leak) -> None:
    chunks = Chunks([1] * 50, block=True)
    prefetch = Prefetch(chunks, ahead=8, threads=4)
    it = iter(prefetch)
    assert next(it)[0] == 1
    it.close()  # what dropping the iterator after a break does
    assert chunks.closed.is_set()
    assert max(chunks.started) < 10


def leaves(n: int, lo: int) -> list:
    ids = np.arange(lo, lo + n)
    var = VarLeaf(
        np.concatenate([np.arange(i % 3) for i in ids]).astype(np.int64),
        ids % 3,
        ids % 3,
        np.ones(n, np.int64),
    )
    return [ids, var]


STRUCTURE = {"i": Leaf("int64", ()), "v": Leaf("int64", (None,))}


def test_batches_span_chunks_and_keep_variable_shapes_per_element() -> None:
    chunks = [(n, leaves(n, lo)) for n, lo in [(5, 0), (2, 5), (9, 7), (1, 16)]]
    batches = list(Columns(STRUCTURE).batches(iter(chunks), 4, drop_remainder=False))
    assert [n for n, _ in batches] == [4, 4, 4, 4, 1]
    assert np.concatenate([b["i"] for _, b in batches]).tolist() == list(range(17))
    for _, b in batches:
        assert [v.tolist() for v in b["v"]] == [list(range(i % 3)) for i in b["i"]]
    dropped = list(Columns(STRUCTURE).batches(iter(chunks), 4, drop_remainder=True))
    assert [n for n, _ in dropped] == [4, 4, 4, 4]


def test_elements_come_one_by_one_in_the_stored_structure() -> None:
    chunks = [(3, leaves(3, 0)), (2, leaves(2, 3))]
    elements = list(Columns(STRUCTURE).elements(iter(chunks)))
    assert [int(e["i"]) for e in elements] == list(range(5))
    assert [e["v"].tolist() for e in elements] == [list(range(i % 3)) for i in range(5)]


def test_a_direct_read_of_small_elements_runs_on_one_thread() -> None:
    small = SMALL_ELEMENT_BYTES - 1
    assert threads("direct", small * 1000, 1000) == 1  # Python per element: the GIL's
    assert threads("direct", SMALL_ELEMENT_BYTES * 1000, 1000) == THREADS
    assert threads("plane", small * 1000, 1000) == THREADS  # waits on the network
    assert threads("direct", 0, 0) == 1
