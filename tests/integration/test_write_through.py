"""cc.cache(): write-through, interruption, concurrent writers, staleness, corruption."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from waits import gone, wait_until

tf = pytest.importorskip("tensorflow")

from client import (  # noqa: E402
    CacheClient,
    CacheNotReadyError,
    FingerprintMismatchError,
)

ROOT = Path(__file__).resolve().parents[2]


def counted_source(n: int, counter: list[int]) -> tf.data.Dataset:
    """A pipeline that counts how many elements its Python generator produced."""

    def gen():
        for i in range(n):
            counter[0] += 1
            yield np.full((4,), i, np.float32), i

    sig = (tf.TensorSpec((4,), tf.float32), tf.TensorSpec((), tf.int64))
    return tf.data.Dataset.from_generator(gen, output_signature=sig)


def labels(ds: tf.data.Dataset) -> list[int]:
    return [int(y) for _, y in ds.as_numpy_iterator()]


def test_second_epoch_streams_from_the_daemon_without_running_the_source(cc, name) -> None:
    counter = [0]
    ds = cc.cache(counted_source(300, counter), name=name)
    assert labels(ds) == list(range(300))
    assert counter[0] == 300
    assert cc.info(name).state == "READY"
    assert labels(ds) == list(range(300))
    assert counter[0] == 300, "epoch 2 ran the source pipeline again"


def test_a_new_cache_call_on_a_ready_name_reports_its_cardinality(cc, name) -> None:
    src = tf.data.Dataset.range(50).filter(lambda x: x % 2 == 0)
    first = cc.cache(src, name=name)
    assert int(first.cardinality()) == int(src.cache().cardinality())  # unknown, like ds.cache()
    assert len(labels_of_range(first)) == 25
    again = cc.cache(src, name=name)
    assert int(again.cardinality()) == 25


def labels_of_range(ds: tf.data.Dataset) -> list[int]:
    return [int(x) for x in ds.as_numpy_iterator()]


def test_keras_fit_through_the_cache_sees_the_same_steps_as_ds_cache(cc, name) -> None:
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    y = (x.sum(axis=1) > 0).astype(np.float32)
    src = tf.data.Dataset.from_tensor_slices((x, y))
    ds = cc.cache(src, name=name).batch(16)
    assert int(ds.cardinality()) == int(src.cache().batch(16).cardinality()) == 4
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    history = model.fit(ds, epochs=3, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 3
    assert cc.info(name).num_elements == 64


def test_breaking_out_of_the_first_epoch_leaves_no_cache(cc, name, no_thread_leak) -> None:
    ds = cc.cache(tf.data.Dataset.range(10_000), name=name)
    for i, _ in enumerate(ds):
        if i == 5:
            break
    wait_until(lambda: gone(cc, name))
    assert labels_of_range(ds.take(3)) == [0, 1, 2]
    wait_until(lambda: gone(cc, name))
    assert labels_of_range(ds) == list(range(10_000))
    assert cc.info(name).num_elements == 10_000


def test_early_stop_on_a_ready_cache_leaves_no_thread_behind(cc, name, no_thread_leak) -> None:
    ds = cc.cache(tf.data.Dataset.range(20_000), name=name)
    assert len(labels_of_range(ds)) == 20_000
    assert labels_of_range(ds.take(7)) == list(range(7))
    for i, _ in enumerate(cc.dataset(name, prefetch_bytes=4096)):
        if i == 100:
            break


SLOW_WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np, tensorflow as tf
    from client import CacheClient
    target, name, n, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    def gen():
        for i in range(n):
            time.sleep(delay)
            yield i
    src = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec((), tf.int64))
    with CacheClient(target) as cc:
        ds = cc.cache(src, name=name, version="slow-v1")
        seen = []
        for x in ds:
            seen.append(int(x))
            if len(seen) == 20:
                print("STARTED", flush=True)
        print("RESULT", seen == list(range(n)), len(seen), flush=True)
""")


def run_writer(target: str, name: str, n: int, delay: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, target, name, str(n), str(delay)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_killing_the_writer_mid_epoch_leaves_nothing_and_the_next_run_rebuilds(
    daemon, cc, name
) -> None:
    proc = run_writer(daemon.unix_target, name, 100_000, 0.001)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "STARTED"
    assert cc.info(name).state == "WRITING"
    with pytest.raises(CacheNotReadyError, match="WRITING"):
        cc.dataset(name)
    proc.kill()
    proc.communicate()
    wait_until(lambda: gone(cc, name))
    rerun = run_writer(daemon.unix_target, name, 300, 0.0)
    out, err = rerun.communicate(timeout=120)
    assert "RESULT True 300" in out, err
    assert cc.info(name).num_elements == 300


def test_two_processes_caching_one_name_at_once_both_succeed_and_one_writes(
    daemon, cc, name
) -> None:
    procs = [run_writer(daemon.tcp_target, name, 400, 0.002) for _ in range(2)]
    outputs = [p.communicate(timeout=180) for p in procs]
    for out, err in outputs:
        assert "RESULT True 400" in out, err
    info = cc.info(name)
    assert info.state == "READY" and info.num_elements == 400
    assert labels_of_range(cc.dataset(name)) == list(range(400))
    assert daemon.log().count(f"writing cache {name!r}") == 1


def test_two_processes_read_the_same_cache_at_once(daemon, cc, name) -> None:
    assert len(labels_of_range(cc.cache(tf.data.Dataset.range(5000), name=name))) == 5000
    script = textwrap.dedent("""
        import sys
        from client import CacheClient
        with CacheClient(sys.argv[1]) as cc:
            xs = [int(x) for x in cc.dataset(sys.argv[2]).as_numpy_iterator()]
        print("RESULT", xs == list(range(5000)))
    """)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, t, name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for t in (daemon.unix_target, daemon.tcp_target)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert "RESULT True" in out, err


def test_a_changed_pipeline_is_refused_instead_of_served_stale(cc, name) -> None:
    old = tf.data.Dataset.range(10).map(lambda x: x * 2)
    assert labels_of_range(cc.cache(old, name=name)) == [x * 2 for x in range(10)]
    new = tf.data.Dataset.range(10).map(lambda x: x * 3)
    with pytest.raises(FingerprintMismatchError, match=f"cacheserver rm {name}"):
        cc.cache(new, name=name)
    cc.delete(name)
    assert labels_of_range(cc.cache(new, name=name)) == [x * 3 for x in range(10)]


def test_the_same_pipeline_built_in_another_process_reuses_the_cache(daemon, cc, name) -> None:
    src = tf.data.Dataset.range(100).map(lambda x: x + 1, num_parallel_calls=2)
    assert len(labels_of_range(cc.cache(src, name=name))) == 100
    script = textwrap.dedent("""
        import sys, tensorflow as tf
        from client import CacheClient
        src = tf.data.Dataset.range(100).map(lambda x: x + 1, num_parallel_calls=2)
        with CacheClient(sys.argv[1]) as cc:
            ds = cc.cache(src, name=sys.argv[2])
            print("CARD", int(ds.cardinality()), sum(1 for _ in ds))
    """)
    out = subprocess.run(
        [sys.executable, "-c", script, daemon.unix_target, name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "CARD 100 100" in out.stdout, out.stderr


def test_version_pins_the_key_explicitly(cc, name) -> None:
    a = tf.data.Dataset.range(5)
    b = tf.data.Dataset.range(5).map(lambda x: x + 100)
    assert labels_of_range(cc.cache(a, name=name, version="v1")) == list(range(5))
    # same version: the user says it is the same data, so the cache is served
    assert labels_of_range(cc.cache(b, name=name, version="v1")) == list(range(5))
    with pytest.raises(FingerprintMismatchError):
        cc.cache(b, name=name, version="v2")


def _flip_byte_in_record(data_dir: Path, name: str, needle: bytes) -> None:
    path = data_dir / "caches" / name / "shard-00000" / "data.mdb"
    blob = bytearray(path.read_bytes())
    at = blob.find(needle)
    assert at >= 0, "record bytes not found in data.mdb"
    blob[at + len(needle) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("kind", ["raw", "zstd"])
def test_a_flipped_byte_in_a_stored_record_is_reported_as_data_loss(daemon, cc, name, kind) -> None:
    rng = np.random.default_rng(1)
    if kind == "raw":  # incompressible: stored raw with a CRC-32
        data = rng.integers(0, 256, size=(20, 4096), dtype=np.uint8)
    else:  # compressible: stored as a zstd frame with its checksum
        data = np.repeat(rng.integers(0, 4, size=(20, 1), dtype=np.uint8), 4096, axis=1)
    src = tf.data.Dataset.from_tensor_slices(data)
    assert len(list(cc.cache(src, name=name))) == 20
    info = cc.info(name)
    assert (info.compression_ratio > 1.2) == (kind == "zstd")
    if kind == "raw":
        needle = data[7].tobytes()[100:164]
    else:
        with open(daemon.data_dir / "caches" / name / "shard-00000" / "data.mdb", "rb") as f:
            raw = f.read()
        needle = raw[raw.find(b"\x28\xb5\x2f\xfd", len(raw) // 3) :][:24]  # a zstd frame
    _flip_byte_in_record(daemon.data_dir, name, needle)
    with pytest.raises(tf.errors.OpError, match=rf"DataLossError: cache '{name}' shard 0"):
        list(cc.dataset(name))


def test_an_epoch_that_starts_while_the_daemon_is_down_runs_the_source(
    fresh_daemon, caplog
) -> None:
    import logging

    with CacheClient(fresh_daemon.unix_target, connect_timeout=2) as cc:
        ds = cc.cache(tf.data.Dataset.range(50), name="down")
        assert labels_of_range(ds) == list(range(50))
        assert fresh_daemon.terminate() == 0
        with caplog.at_level(logging.WARNING, logger="client"):
            assert labels_of_range(ds) == list(range(50))
        assert "runs the source pipeline" in caplog.text
