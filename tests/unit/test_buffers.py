"""Buffers: a pass's large arrays, reused once nothing refers to them, never while in use."""

from __future__ import annotations

import threading

import numpy as np

from client.format.fixed_decode import ALIGN
from client.read.assembly.buffers import MIN_BYTES, Buffers

IMAGES = ((8, 224, 224, 3), np.dtype(np.float32))  # 4.8 MB, as a chunk of 602 KB images


def test_arrays_are_aligned_writable_and_of_the_shape_asked() -> None:
    buffers = Buffers()
    for shape, dtype in (IMAGES, ((3,), np.dtype(np.int64)), ((MIN_BYTES,), np.dtype(np.uint8))):
        array = buffers.empty(shape, dtype)
        assert array.shape == shape and array.dtype == dtype and array.flags.c_contiguous
        assert array.flags.writeable and array.ctypes.data % ALIGN == 0
        array[...] = 7
        assert np.all(array == 7)


def test_a_pass_of_many_chunks_makes_as_many_buffers_as_it_had_in_use_at_once() -> None:
    buffers = Buffers()
    kept: list[np.ndarray] = []
    for i in range(500):
        chunk = buffers.empty(*IMAGES)
        chunk[0, 0, 0, 0] = i
        kept.append(chunk[2:5])  # a trimmed view, as Decoder makes, keeps it in use
        if len(kept) > 3:
            kept.pop(0)
    assert buffers.made == buffers.held() == 4


def test_a_buffer_in_use_is_never_handed_out_again() -> None:
    buffers = Buffers()
    live = [buffers.empty(*IMAGES) for _ in range(6)]
    for i, array in enumerate(live):
        array.fill(i)
    views = [array[1:] for array in live]
    del live
    again = buffers.empty(*IMAGES)
    again.fill(99)
    for i, view in enumerate(views):
        assert np.all(view == i)
    assert buffers.made == 7


def test_small_arrays_come_from_malloc_and_are_not_held() -> None:
    buffers = Buffers()
    for _ in range(100):
        buffers.empty((MIN_BYTES // 8 - 1,), np.dtype(np.int64))
    assert buffers.made == buffers.held() == 0


def test_a_free_buffer_too_small_is_replaced_and_a_larger_one_serves_smaller_arrays() -> None:
    buffers = Buffers()
    small = buffers.empty(*IMAGES)  # 8 images
    del small
    for _ in range(10):
        buffers.empty((64, 224, 224, 3), np.dtype(np.float32))  # a batch of 64: the 8 replaced
    assert buffers.held() == 1 and buffers.made == 2
    for _ in range(10):
        buffers.empty(*IMAGES)  # a short last batch: in the full one's map
    assert buffers.held() == 1 and buffers.made == 2


def test_closing_lets_free_buffers_go_and_leaves_those_in_use_intact() -> None:
    buffers = Buffers()
    in_use = buffers.empty(*IMAGES)
    in_use.fill(3)
    buffers.empty(*IMAGES)
    buffers.close()
    assert buffers.held() == 0
    assert np.all(in_use == 3)


def test_threads_taking_buffers_at_once_never_share_one() -> None:
    buffers = Buffers()
    barrier = threading.Barrier(8)
    failures: list[str] = []

    def work(k: int) -> None:
        barrier.wait()
        for i in range(50):
            array = buffers.empty(*IMAGES)
            array.fill(k * 1000 + i)
            if not np.all(array == k * 1000 + i):
                failures.append(f"thread {k} step {i}")
            del array

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert buffers.held() <= 8
