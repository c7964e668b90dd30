"""bench/residency.py's arguments and report (its measurements run with the lead's bench)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import residency


def test_budgets_are_fractions_of_the_cache() -> None:
    assert residency.parse_fractions("0.5, 0.1") == [0.5, 0.1]
    for bad in ("", "1", "0", "half", "0.5,2"):
        with pytest.raises(argparse.ArgumentTypeError, match="between 0 and 1"):
            residency.parse_fractions(bad)


def test_quick_takes_small_sizes_and_its_own_results_file() -> None:
    full, quick = residency.parse_args([]), residency.parse_args(["--quick"])
    assert (full.cache_size, full.shard_size, full.out.name) == (2 << 30, 8 << 20, "residency.json")
    assert quick.cache_size < full.cache_size and quick.out.name == "residency-quick.json"
    assert residency.parse_args(["--quick", "--cache-size", "64MiB"]).cache_size == 64 << 20


@pytest.mark.parametrize(
    "argv", [["--epochs", "1"], ["--cache-size", "1MiB"], ["--element-size", "16MiB"]]
)
def test_sizes_that_cannot_measure_a_stream_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        residency.parse_args(argv)


def epoch(n: int, store_bytes: int, rss: int, raw_mb_per_s: float | None = None) -> dict:
    row = {
        "epoch": n,
        "elements": 10,
        "exactly_once": True,
        "seconds": 2.0,
        "gets": 5,
        "logged_gets": 5,
        "refetched": 0,
        "store_bytes": store_bytes,
        "streamed_bytes": store_bytes,
        "resident_shards": 8,
        "hit_ratio": 0.5,
        "daemon_rss_anon_kib": rss,
        "client_rss_anon_kib": 2 * rss,
        "bytes_vs_room": store_bytes / 500,
        "streamed_mb_per_s": store_bytes / 1e6 / 2.0,
    }
    if raw_mb_per_s:
        row["raw_get"] = {"mb_per_s": raw_mb_per_s}
        row["rate_vs_raw_get"] = row["streamed_mb_per_s"] / raw_mb_per_s
    return row


def test_the_report_compares_each_epoch_with_the_room_lru_and_a_raw_get() -> None:
    epochs = [epoch(1, 1000, 100), epoch(2, 520, 100, 0.0004), epoch(3, 510, 101, 0.0005)]
    point = {"fraction": 0.5, "budget_bytes": 500, "epochs": epochs, "status": "ok"}
    point |= residency.summary(epochs, 1000, 500)
    assert point["bytes_vs_room"] == pytest.approx(1.03)  # epochs 2 and 3: the median
    assert point["bytes_vs_room_max"] == pytest.approx(1.04)
    assert point["lru_vs_room"] == 2.0  # LRU fetches the whole cache each epoch
    assert point["rate_vs_raw_get"] == pytest.approx((0.65 + 0.51) / 2)  # 260 / 400, 255 / 500
    assert point["daemon_rss_growth_kib"] == 1 and point["client_rss_growth_kib"] == 2
    results = {
        "config": {
            "cache_bytes": 1000,
            "element_bytes": 10,
            "shard_bytes": 100,
            "epochs": 3,
            "batch": 2,
        },
        "servers": [
            {"server": "moto", "cache": {"stored_bytes": 1000, "shards": 16}, "points": [point]}
        ],
    }
    text = residency.render(results)
    assert "| moto | 2x | 8 of 16 | 1.030x (max 1.040x) | 2.00x |" in text
    assert text.count("\n| moto | 2x |") == 4  # the summary's row and one per epoch
    failed = {"fraction": 0.1, "status": "error", "error": "TimeoutError: no\nanswer"}
    results["servers"] = [
        {"server": "moto", "status": "ok", "points": [failed]},
        {"server": "seaweedfs", "status": "unavailable", "error": "weed not found"},
    ]
    rows = residency.render(results).splitlines()
    assert "| moto | 10x | failed: TimeoutError: no answer |  |  |  |  |  |" in rows
    assert "| seaweedfs | - | unavailable: weed not found |  |  |  |  |  |" in rows
