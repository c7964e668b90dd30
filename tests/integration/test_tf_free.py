"""NumPy reads and writes in a process where ``import tensorflow`` fails, against TF's own.

One process without TensorFlow (tests/pipelines/tf_free.py) reads two caches
TensorFlow wrote (one also through Grain's DataLoader, with worker processes) and
writes one; the tests compare what it got with what
cc.dataset() yields here, element for element, and read its cache back in TF.
"""

from __future__ import annotations

import collections
import gc
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

tf = pytest.importorskip("tensorflow")

from daemon import Daemon, env_without_tf_noise  # noqa: E402
from fidelity import canon  # noqa: E402
from sharded import ids, write_sharded  # noqa: E402

from client import CacheClient, InvalidArgumentError, ReadState  # noqa: E402
from client.format import spec  # noqa: E402
from client.format.layout import Leaf  # noqa: E402

N, MIXED = 600, 60
PROGRAM = Path(__file__).parents[1] / "pipelines" / "tf_free.py"


def dense_source() -> tf.data.Dataset:
    return tf.data.Dataset.range(N).map(
        lambda i: {"x": tf.fill([8], tf.cast(i, tf.float32)), "i": i}
    )


def mixed_source() -> tf.data.Dataset:
    return tf.data.Dataset.range(MIXED).map(
        lambda i: (
            i,
            {
                "s": tf.strings.as_string(i),
                "v": tf.range(i % 5),
                "m": tf.fill(tf.stack([2, i % 3]), tf.cast(i, tf.float16)),
                "t": tf.fill([3], tf.strings.as_string(i * 7)),
            },
        )
    )


@pytest.fixture(scope="module")
def run(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The caches, and what the TF-free process read and wrote."""
    with CacheClient(daemon.unix_target) as cc:
        written = write_sharded(
            cc, dense_source(), "tf-free-dense", shard_bytes=1000, chunk_bytes=1000
        )
        assert len(written.shards) > 5
        dense = written.name
        mixed = "tf-free-mixed"
        for _ in cc.cache(mixed_source(), mixed, version="1"):
            pass
    out = tmp_path_factory.mktemp("tf-free") / "results.pickle"
    done = subprocess.run(
        [
            sys.executable,
            str(PROGRAM),
            daemon.unix_target,
            dense,
            mixed,
            "tf-free-written",
            str(out),
        ],
        env=env_without_tf_noise(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    with open(out, "rb") as f:
        results = pickle.load(f)
    return {"dense": dense, "mixed": mixed, "written": "tf-free-written", **results}


def test_the_reading_process_never_imported_tensorflow(run) -> None:
    assert run["tensorflow"] is None


def test_worker_shares_of_shuffled_epochs_match_tf_data_remote_and_direct(cc, run) -> None:
    expected = [
        [
            ids(cc.dataset(run["dense"], shuffle=True, seed=5, worker_index=w, num_workers=3))
            for w in range(3)
        ]
    ]
    expected.append(
        [
            ids(
                cc.dataset(
                    run["dense"], shuffle=True, seed=5, worker_index=w, num_workers=3, epoch=1
                )
            )
            for w in range(3)
        ]
    )
    assert run["shares", False] == expected
    assert run["shares", True] == expected
    for epoch in expected:
        assert sorted(i for share in epoch for i in share) == list(range(N))
    assert expected[0] != expected[1]


def test_batches_cut_across_chunks_match_tf_data_batches(cc, run) -> None:
    ds = cc.dataset(run["dense"], shuffle="shards", seed=2).batch(32, drop_remainder=True)
    assert run["batches"] == [b["i"].tolist() for b in ds.as_numpy_iterator()]
    assert len(run["batches"]) == N // 32


def test_a_numpy_read_state_resumes_in_numpy_and_in_tf_data(cc, run) -> None:
    first, state_json, rest = run["resume"]
    share = ids(cc.dataset(run["dense"], shuffle=True, seed=7, worker_index=0, num_workers=2))
    assert first + rest == share
    state = ReadState.from_json(state_json)
    assert (state.epoch, state.start) == (0, 100)
    assert (
        ids(
            cc.dataset(
                run["dense"], shuffle=True, seed=7, worker_index=0, num_workers=2, resume=state
            )
        )
        == rest
    )


def test_an_elastic_resume_reads_what_three_workers_left_with_two_exactly_once(run) -> None:
    firsts, rests = run["elastic"]
    assert [len(f) for f in firsts] == [50, 0, 120]
    read = [i for part in firsts + rests for i in part]
    assert sorted(read) == list(range(N))


def test_grain_reads_a_source_with_worker_processes_and_restores_mid_epoch(run) -> None:
    grain = run["grain"]
    assert grain["len"] == N and grain["item"] == 7
    assert grain["some"] == [5, 2, 2, N - 1]
    assert len(grain["first"]) == 160
    assert sorted(grain["first"] + grain["rest"]) == list(range(N))
    assert grain["restored"] == grain["rest"]


def plain(value: Any) -> Any:
    """As tests/pipelines/tf_free.py's plain(): named tuples as (name, {field: value})."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value).__name__, {k: plain(v) for k, v in zip(value._fields, value)}
    if isinstance(value, (tuple, list)):
        return type(value)(plain(v) for v in value)
    return value


def test_strings_and_variable_shapes_read_as_tf_data_yields_them(cc, run) -> None:
    expected = list(cc.dataset(run["mixed"]).as_numpy_iterator())
    assert [canon(e) for e in run["mixed_read"]] == [canon(e) for e in expected]
    got = run["mixed_read"][9][1]
    assert got["s"] == b"9" and isinstance(got["s"], bytes)
    assert got["t"].dtype == object and got["t"].tolist() == [b"63"] * 3
    batches = run["mixed_batches"]
    assert [len(b[0]) for b in batches] == [7] * (MIXED // 7) + [MIXED % 7]
    flat = [(i, {k: b[1][k][j] for k in b[1]}) for b in batches for j, i in enumerate(b[0])]
    assert [canon(e) for e in flat] == [canon(e) for e in expected]
    assert isinstance(batches[0][1]["v"], list)  # variable shapes: an array per element


def test_a_cache_written_by_numpy_reads_back_in_tf_element_for_element(cc, run) -> None:
    elements, count, read_back = run["write"]
    assert count == len(elements) == 150
    assert [canon(e) for e in read_back] == [canon(e) for e in elements]
    ds = cc.dataset(run["written"])
    want = {
        "image": tf.TensorSpec((4, 5, 3), tf.uint8),
        "label": tf.TensorSpec((), tf.int64),
        "text": tf.TensorSpec((), tf.string),
        "values": tf.TensorSpec((None,), tf.float32),
        "pair": (
            "Pair",
            {"count": tf.TensorSpec((), tf.int32), "name": tf.TensorSpec((3,), tf.string)},
        ),
        "tuple": (tf.TensorSpec((), tf.float64), tf.TensorSpec((2, None), tf.bool)),
    }
    assert plain(ds.element_spec) == want
    assert [canon(plain(e)) for e in ds.as_numpy_iterator()] == [canon(e) for e in elements]
    assert cc.info(run["written"]).num_elements == 150
    sent, got = run["write_grpc"]  # written over the WriteCache stream, not directly
    assert [canon(e) for e in got] == [canon(e) for e in sent]


Point = collections.namedtuple("Point", ["x", "label"])


@pytest.mark.parametrize(
    "element_spec",
    [
        tf.TensorSpec((2, None), tf.uint8),
        {"b": tf.TensorSpec((), tf.string), "a": (tf.TensorSpec(None, tf.float32),)},
        Point(tf.TensorSpec((), tf.int64), [tf.TensorSpec((3,), tf.bfloat16)]),
        (
            tf.TensorSpec((), tf.bool),
            {
                "z": tf.TensorSpec((1, 0, 3), tf.complex128),
                "y": tf.TensorSpec((None, None), tf.uint64),
            },
        ),
        {},
    ],
    ids=["tensor", "dict", "namedtuple", "nested", "empty"],
)
def test_the_numpy_spec_coder_makes_tensorflows_bytes(element_spec) -> None:
    from client.tf import convert

    data = convert.encode_spec(element_spec)
    assert spec.encode(spec.decode(data)) == data


DTYPES = sorted(spec.DTYPES)
Named = collections.namedtuple("Named", ["first", "second"])


def both(node: Any) -> tuple[Any, Any]:
    """A description drawn by specs() as (TensorFlow's spec, client.format.spec's structure)."""
    kind, value = node
    if kind == "leaf":
        dtype, shape = value
        return tf.TensorSpec(shape, dtype), Leaf(dtype, None if shape is None else tuple(shape))
    pairs = [both(v) for v in (value.values() if kind == "dict" else value)]
    tfs, ours = [p[0] for p in pairs], [p[1] for p in pairs]
    if kind == "dict":
        return dict(zip(value, tfs)), dict(zip(value, ours))
    if kind == "named":
        return Named(*tfs), spec.Named("Named", tuple(zip(Named._fields, ours)))
    return tuple(tfs), tuple(ours)


def specs() -> st.SearchStrategy[Any]:
    dims = st.lists(st.none() | st.integers(0, 5), max_size=3)
    leaves = st.tuples(st.just("leaf"), st.tuples(st.sampled_from(DTYPES), st.none() | dims))
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.tuples(
                st.just("dict"),
                st.dictionaries(st.text("abc_", min_size=1, max_size=3), inner, max_size=3),
            ),
            st.tuples(st.just("tuple"), st.lists(inner, max_size=3)),
            st.tuples(st.just("named"), st.lists(inner, min_size=2, max_size=2)),
        ),
        max_leaves=6,
    )


@settings(max_examples=60, deadline=None)
@given(node=specs())
def test_any_dense_spec_encodes_to_tensorflows_bytes_and_back(node) -> None:
    tf_spec, structure = both(node)
    from client.tf import convert

    data = convert.encode_spec(tf_spec)
    assert spec.encode(structure) == data  # what cc.write() stores is what TF would
    assert spec.decode(data) == structure
    leaves = [leaf for _, leaf in spec.flatten(structure)]
    assert leaves == list(convert.layout_of(tf_spec).leaves)  # tf.nest's order


def test_a_stopped_numpy_read_ends_its_threads_and_lease(cc, run, no_thread_leak) -> None:
    gc.collect()  # the TF iterators of the tests before, which hold leases of their own
    leases = cc.info(run["dense"]).direct_leases
    reader = cc.numpy(run["dense"], shuffle=True, seed=1, direct=True, prefetch_bytes=64 << 10)
    for n, element in enumerate(reader):
        assert (element["x"] == element["i"]).all()
        if n == 20:
            break
    assert cc.info(run["dense"]).direct_leases == leases
    assert reader.state().start == 21


def test_ragged_caches_are_refused_by_name(cc, name) -> None:
    ds = tf.data.Dataset.range(4).map(
        lambda i: {"r": tf.RaggedTensor.from_row_lengths(tf.range(i), [i])}
    )
    for _ in cc.cache(ds, name, version="1"):
        pass
    with pytest.raises(InvalidArgumentError, match=r"\['r'\] is a RaggedTensorSpec"):
        cc.numpy(name)
