"""The reads and the write of tests/integration/test_tf_free.py, in a process without TensorFlow.

    python tf_free.py TARGET DENSE MIXED WRITTEN OUT

``import tensorflow`` fails here (sys.modules holds None for it before client is
imported). Reads cache DENSE (elements {"x": [i]*8, "i": i}, many shards) and
MIXED (strings, variable shapes, tuples) with cc.numpy(), writes cache WRITTEN
with cc.write(), and pickles what it read and wrote to OUT for the test to
compare with TensorFlow's reads.
"""

from __future__ import annotations

import collections
import pickle
import sys
from pathlib import Path
from typing import Any

sys.modules["tensorflow"] = None  # type: ignore[assignment]  # import tensorflow fails
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from client import CacheClient, ReadState  # noqa: E402

Pair = collections.namedtuple("Pair", "count name")


def ids(elements: Any) -> list[int]:
    out = []
    for element in elements:
        assert (element["x"] == element["i"]).all()  # each record is the element asked for
        out.append(int(element["i"]))
    return out


def plain(value: Any) -> Any:
    """value with named tuples as ("name", {field: value}): the reader's named tuple types
    are made at run time, so pickle cannot find them by name."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value).__name__, {k: plain(v) for k, v in zip(value._fields, value)}
    if isinstance(value, (tuple, list)):
        return type(value)(plain(v) for v in value)
    return value


def written(n: int) -> list[Any]:
    """What cc.write() stores: every kind of dense component, strings and varying shapes."""
    return [
        {
            "image": np.full((4, 5, 3), i % 256, np.uint8),
            "label": np.int64(i),
            "text": b"\x00ab" * (i % 4),
            "values": np.arange(i % 5, dtype=np.float32),
            "pair": Pair(np.int32(-i), np.array([b"a", b"bc", str(i).encode()])),
            "tuple": (np.float64(i) / 3, np.ones((2, i % 3), np.bool_)),
        }
        for i in range(n)
    ]


def grain_reads(cc: CacheClient, name: str) -> dict[str, Any]:
    """cc.source() through Grain's DataLoader: 2 worker processes, shuffled, batched,
    and an iterator restored from a checkpoint taken mid-epoch."""
    import grain.python as gp

    source = cc.source(name)
    some = source.__getitems__([5, 2, 2, -1])
    sampler = gp.IndexSampler(
        num_records=len(source), shard_options=gp.NoSharding(), shuffle=True, num_epochs=1, seed=3
    )
    loader = gp.DataLoader(
        data_source=source, sampler=sampler, operations=[gp.Batch(32)], worker_count=2
    )
    it = iter(loader)
    first = [i for _ in range(5) for i in ids(unbatched(next(it)))]
    state = it.get_state()
    rest = [i for batch in it for i in ids(unbatched(batch))]
    restored = iter(loader)
    restored.set_state(state)
    again = [i for batch in restored for i in ids(unbatched(batch))]
    source.close()
    return {
        "len": len(source),
        "some": ids(some),
        "item": int(source[7]["i"]),
        "first": first,
        "rest": rest,
        "restored": again,
    }


def unbatched(batch: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    return [{"x": x, "i": i} for x, i in zip(batch["x"], batch["i"])]


def main(target: str, dense: str, mixed: str, write_name: str, out: str) -> None:
    results: dict[Any, Any] = {}
    with CacheClient(target) as cc:
        for direct in (False, True):
            readers = [
                cc.numpy(
                    dense,
                    shuffle=True,
                    seed=5,
                    worker_index=w,
                    num_workers=3,
                    parallel_shards=2,
                    direct=direct,
                )
                for w in range(3)
            ]
            results["shares", direct] = [[ids(r) for r in readers] for _epoch in range(2)]
        results["batches"] = [
            batch["i"].tolist()
            for batch in cc.numpy(
                dense,
                shuffle="shards",
                seed=2,
                batch_size=32,
                drop_remainder=True,
                prefetch_bytes=64 << 10,
            )
        ]

        reader = cc.numpy(dense, shuffle=True, seed=7, worker_index=0, num_workers=2)
        it = iter(reader)
        first = ids(next(it) for _ in range(100))
        state = reader.state()
        rest = ids(
            cc.numpy(
                dense,
                shuffle=True,
                seed=7,
                worker_index=0,
                num_workers=2,
                resume=ReadState.from_json(state.to_json()),
            )
        )
        results["resume"] = first, state.to_json(), rest

        old = [
            cc.numpy(dense, shuffle=True, seed=9, worker_index=w, num_workers=3, batch_size=10)
            for w in range(3)
        ]
        firsts = []
        for r, batches in zip(old, (5, 0, 12)):  # worker 1 read nothing
            it = iter(r)
            firsts.append([i for _ in range(batches) for i in next(it)["i"].tolist()])
        states = [r.state() for r in old]
        rests = [
            ids(cc.numpy(dense, shuffle=True, seed=9, worker_index=w, num_workers=2, resume=states))
            for w in range(2)
        ]
        results["elastic"] = firsts, rests

        results["mixed_read"] = list(cc.numpy(mixed))
        results["mixed_batches"] = list(cc.numpy(mixed, batch_size=7))

        elements = written(150)
        info = cc.write(write_name, elements, version="1", block_bytes=4096)
        results["write"] = (plain(elements), info.num_elements, plain(list(cc.numpy(write_name))))
        few = written(20)
        cc.write(write_name + "-grpc", few, direct=False)  # the WriteCache stream
        results["write_grpc"] = plain(few), plain(list(cc.numpy(write_name + "-grpc")))
        results["grain"] = grain_reads(cc, dense)
    results["tensorflow"] = sys.modules.get("tensorflow", "missing")
    with open(out, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
