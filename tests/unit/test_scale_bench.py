"""bench/scale.py's arguments and /proc probes (its measurements run with the lead's bench)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import scale


def test_points_are_caches_by_shards_per_cache() -> None:
    assert scale.parse_points("10x100, 1x100000") == [(10, 100), (1, 100000)]
    for bad in ("10", "0x5", "10x", "ax3", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="100x1000"):
            scale.parse_points(bad)


def test_sizes_take_binary_and_decimal_units() -> None:
    assert scale.parse_sizes("2GiB,500MB,4096,0.5KiB") == [2 << 30, 500_000_000, 4096, 512]
    with pytest.raises(argparse.ArgumentTypeError, match="GiB"):
        scale.parse_size("2 parsecs")


def test_element_kinds_are_checked() -> None:
    assert scale.parse_elements("image,1k") == ["image", "1k"]
    with pytest.raises(argparse.ArgumentTypeError, match="choose from 1k, image"):
        scale.parse_elements("1k,video")


def test_process_facts_count_this_process_files_and_maps() -> None:
    before = scale.process_facts(os.getpid())
    with open(__file__) as _:
        after = scale.process_facts("self")
    assert after["fds"] == before["fds"] + 1
    assert before["maps"] > 0 and before["vm_rss_kib"] >= before["rss_anon_kib"] > 0
    assert before["fd_limit"] == scale.system_limits()["ulimit_n"]


def test_the_defaults_span_the_documented_points() -> None:
    args = scale.parse_args([])
    totals = {c * s for c, s in args.points}
    assert {c for c, _ in args.points} == {1, 10, 100, 1000}
    assert min(totals) == 100 and max(totals) == 100_000
    quick = scale.parse_args(["--quick"])
    assert max(c * s for c, s in quick.points) <= 1000 and quick.out.name == "scale-quick.json"
