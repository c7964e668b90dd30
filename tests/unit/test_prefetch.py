"""The bounded byte queue between the stream thread and the consumer."""

from __future__ import annotations

import threading

import pytest

from client.read.prefetch import ByteBudgetQueue, Closed, Prefetcher


def test_items_arrive_in_order_and_the_end_stops_iteration() -> None:
    def produce(put):
        for i in range(100):
            put(i, 10)

    p = Prefetcher(produce, capacity=35)
    assert list(p) == list(range(100))
    p.close()


def test_producer_blocks_once_the_byte_budget_is_full() -> None:
    q: ByteBudgetQueue[int] = ByteBudgetQueue(100)
    q.put(1, 60)
    blocked = threading.Event()
    done = threading.Event()

    def second() -> None:
        blocked.set()
        q.put(2, 60)
        done.set()

    t = threading.Thread(target=second)
    t.start()
    blocked.wait()
    assert not done.wait(0.2)
    assert q.queued_bytes == 60
    assert q.get() == 1
    assert done.wait(5)
    t.join()


def test_an_item_larger_than_the_budget_still_flows() -> None:
    q: ByteBudgetQueue[str] = ByteBudgetQueue(10)
    q.put("huge", 10_000)
    assert q.get() == "huge"


def test_producer_errors_reach_the_consumer_after_earlier_items() -> None:
    def produce(put):
        put("a", 1)
        raise OSError("disk went away")

    p = Prefetcher(produce, capacity=100)
    it = iter(p)
    assert next(it) == "a"
    with pytest.raises(OSError, match="disk went away"):
        next(it)
    p.close()


def test_closing_early_unblocks_the_producer_and_joins_its_thread() -> None:
    stopped = threading.Event()

    def produce(put):
        try:
            for i in range(10**9):
                put(i, 50)
        finally:
            stopped.set()

    p = Prefetcher(produce, capacity=100, name="shardcache-test-prefetch")
    it = iter(p)
    assert next(it) == 0
    p.close(timeout=5)
    assert stopped.is_set()
    assert not [t for t in threading.enumerate() if t.name == "shardcache-test-prefetch"]


def test_put_after_close_raises_closed() -> None:
    q: ByteBudgetQueue[int] = ByteBudgetQueue(10)
    q.close()
    with pytest.raises(Closed):
        q.put(1, 1)


def test_a_zero_budget_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least 1 byte"):
        ByteBudgetQueue(0)
