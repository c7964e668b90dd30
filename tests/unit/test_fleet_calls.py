"""A fleet read's per-member call queue (client/read/fetching/fleet_calls.py): calls go out lowest
epoch position first, a call gives its stream slot back once drained (before it is
read), and a call cancelled while queued is never sent."""

from __future__ import annotations

import threading

import pytest

from client.read.fetching.fetch import Closed
from client.read.fetching.fleet_calls import DRAIN_CHUNKS, MemberQueue
from tests.waits import wait_until


class Member:
    """Calls as a member would answer them: each a list of chunks, sent in call order."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.gate = threading.Event()  # chunks flow once set

    def send(self, position: int, chunks: int = 1):
        def call():
            self.sent.append(position)
            return self._answer(position, chunks)

        return call

    def _answer(self, position: int, chunks: int):
        self.gate.wait(10)
        for k in range(chunks):
            yield (position, k)


def test_calls_go_out_lowest_position_first_whoever_asked() -> None:
    member, permits = Member(), threading.BoundedSemaphore(1)
    queue = MemberQueue(permits)
    first = queue.submit(50, member.send(50))  # takes the one slot at once
    later = [queue.submit(p, member.send(p)) for p in (90, 70, 60, 80)]
    member.gate.set()
    assert list(first) == [(50, 0)]
    for call in later:
        list(call)
    assert member.sent == [50, 60, 70, 80, 90]


def test_a_drained_call_frees_its_slot_before_it_is_read() -> None:
    member, permits = Member(), threading.BoundedSemaphore(1)
    member.gate.set()
    queue = MemberQueue(permits)
    unread = queue.submit(1, member.send(1, chunks=DRAIN_CHUNKS - 1))
    wait_until(lambda: unread.finished, 10)
    after = queue.submit(2, member.send(2))  # the slot is free though 1 is not read yet
    wait_until(lambda: after.finished, 10)
    assert member.sent == [1, 2]
    assert list(unread) == [(1, k) for k in range(DRAIN_CHUNKS - 1)]


def test_a_call_past_its_buffer_keeps_its_slot_until_read() -> None:
    member, permits = Member(), threading.BoundedSemaphore(1)
    member.gate.set()
    queue = MemberQueue(permits)
    long = queue.submit(1, member.send(1, chunks=DRAIN_CHUNKS + 3))
    queued = queue.submit(2, member.send(2))
    wait_until(lambda: len(member.sent) == 1, 10)
    assert not long.finished and member.sent == [1]  # waits for its reader, slot held
    assert len(list(long)) == DRAIN_CHUNKS + 3
    assert list(queued) == [(2, 0)] and member.sent == [1, 2]


def test_a_call_cancelled_while_queued_is_never_sent() -> None:
    member, permits = Member(), threading.BoundedSemaphore(1)
    queue = MemberQueue(permits)
    holding = queue.submit(1, member.send(1))
    dropped = queue.submit(2, member.send(2))
    kept = queue.submit(3, member.send(3))
    dropped.cancel()
    with pytest.raises(Closed):
        list(dropped)
    member.gate.set()
    list(holding)
    assert list(kept) == [(3, 0)]
    assert member.sent == [1, 3]
    wait_until(lambda: permits.acquire(blocking=False), 10)  # every slot given back


def test_a_failed_call_raises_its_error_to_the_reader() -> None:
    permits = threading.BoundedSemaphore(1)

    def failing():
        raise ConnectionError("member gone")
        yield  # a generator

    call = MemberQueue(permits).submit(1, failing)
    with pytest.raises(ConnectionError, match="member gone"):
        list(call)
    wait_until(lambda: permits.acquire(blocking=False), 10)


def test_a_call_that_cannot_be_sent_gives_its_error_and_its_slot_back() -> None:
    permits = threading.BoundedSemaphore(1)

    def closed_channel():
        raise ValueError("Cannot invoke RPC on closed channel!")

    call = MemberQueue(permits).submit(1, closed_channel)
    with pytest.raises(ValueError, match="closed channel"):
        list(call)
    assert permits.acquire(blocking=False)
