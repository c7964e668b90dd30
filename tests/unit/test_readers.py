"""The daemon's table of readers (expiry, cap, sums) and the client's input-stall arithmetic."""

from __future__ import annotations

from cacheserver.reader_reports import Figures, Labels, Readers
from client.observe.report import Pace, Reports


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_reader_that_stops_reporting_disappears_after_the_expiry() -> None:
    clock = Clock()
    readers = Readers(expiry=30, clock=clock)
    a, b = Labels("train", "0", "imgs", "direct"), Labels("train", "1", "imgs", "direct")
    readers.report("p0", [(a, Figures(elements=10))])
    readers.report("p1", [(b, Figures(elements=20))])
    clock.now = 29
    readers.report("p1", [(b, Figures(elements=40))])
    assert set(readers.live()) == {a, b}
    clock.now = 30
    assert readers.live() == {b: Figures(elements=40)}
    names = {
        s.labels["rank"]
        for f in readers.collect()
        for s in f.samples
        if s.name == "shardcache_reader_elements_total"
    }
    assert names == {"1"}


def test_two_processes_reporting_the_same_labels_add_up() -> None:
    readers = Readers(clock=Clock())
    labels = Labels("train", "0", "imgs", "grpc")
    readers.report("p0", [(labels, Figures(1, 10, 1, 0.5, 0.25))])
    readers.report("p1", [(labels, Figures(2, 20, 1, 0.5, 0.25))])
    assert readers.live() == {labels: Figures(3, 30, 2, 1.0, 0.5)}


def test_past_the_cap_the_reader_reported_longest_ago_is_dropped() -> None:
    clock = Clock()
    readers = Readers(max_readers=3, clock=clock)
    for i in range(5):
        clock.now = i
        readers.report("p", [(Labels(f"j{i}", "0", "c", "grpc"), Figures())])
    assert sorted(labels.training_job for labels in readers.live()) == ["j2", "j3", "j4"]


def test_the_loops_stall_goes_to_the_caches_whose_reads_are_alive() -> None:
    reports = Reports("train", 2, home=lambda cache: None)  # type: ignore[arg-type,return-value]
    reports.send = lambda: None  # type: ignore[method-assign]  # no daemon here
    imgs, labels = reports.reader("imgs"), reports.reader("labels")
    pace = Pace(imgs)  # an iteration of imgs is alive
    reports.stalled(0.5)
    pace.close()  # and gone
    Pace(labels)
    reports.stalled(0.25)
    reports.close()
    assert (imgs.stall_seconds, labels.stall_seconds) == (0.5, 0.25)
    imgs.chunk("direct", 100, 800, 0.25)
    sent = imgs.proto("train", 2)
    assert (sent.elements, sent.bytes, sent.chunks, sent.path, sent.stall_seconds, sent.rank) == (
        100,
        800,
        1,
        "direct",
        0.5,
        2,
    )
