"""cc.cache() over a tf.data service pipeline: real in-process dispatchers and workers.

The service's per-run parameters (dispatcher address, protocol, job name, the
dataset id the dispatcher assigns) are not part of the cache's key, so the same
pipeline served by a new dispatcher reuses its cache (docs/writing.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

tf = pytest.importorskip("tensorflow")

from client import FingerprintMismatchError  # noqa: E402

service = tf.data.experimental.service


class Service:
    """One in-process dispatcher and one worker."""

    def __init__(self) -> None:
        self.dispatcher = service.DispatchServer()
        address = self.dispatcher.target.split("://", 1)[1]
        self.worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=address))

    def distribute(self, ds: tf.data.Dataset, job_name: str | None = None) -> tf.data.Dataset:
        return ds.apply(
            service.distribute("parallel_epochs", self.dispatcher.target, job_name=job_name)
        )

    def stop(self) -> None:
        self.worker.stop()
        self.dispatcher.stop()


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for s in started:
        s.stop()


def source() -> tf.data.Dataset:
    return tf.data.Dataset.range(40).map(lambda x: x * 3)


def elements(ds: tf.data.Dataset) -> list[int]:
    return sorted(int(x) for x in ds)  # a service's workers may interleave their output


def test_the_same_service_pipeline_with_a_new_dispatcher_reuses_its_cache(
    cc, name, services
) -> None:
    first = Service()
    services.append(first)
    expected = elements(first.distribute(source()).cache())
    ds = cc.cache(first.distribute(source(), job_name="train-a"), name=name)
    assert elements(ds) == expected
    committed = cc.info(name)
    assert committed.state == "READY" and committed.num_elements == 40

    second = Service()
    services.append(second)
    assert second.dispatcher.target != first.dispatcher.target
    again = cc.cache(second.distribute(source(), job_name="train-b"), name=name)
    assert elements(again) == expected
    assert cc.info(name).commit_time == committed.commit_time, "the cache was written again"


def test_a_changed_pipeline_behind_the_service_side_ops_is_still_refused(
    cc, name, services
) -> None:
    """What runs after the service's dataset stays in the key."""
    s = Service()
    services.append(s)
    elements(cc.cache(s.distribute(source()).map(lambda x: x + 1), name=name))
    with pytest.raises(FingerprintMismatchError):
        cc.cache(s.distribute(source()).map(lambda x: x + 2), name=name)
