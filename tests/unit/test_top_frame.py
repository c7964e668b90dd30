"""The rates `cacheserver top` shows, from two scrapes of a daemon's /metrics."""

from __future__ import annotations

from cacheserver.cli.top import frame

LABELS = (("cache", "imgs"), ("path", "grpc"), ("rank", "0"), ("training_job", "train"))


def scraped(
    elements: float, nbytes: float, stall: float, chunk_s: float, chunks: float, gets: float
) -> dict:
    return {
        ("shardcache_reader_elements_total", LABELS): elements,
        ("shardcache_reader_bytes_total", LABELS): nbytes,
        ("shardcache_reader_stall_seconds_total", LABELS): stall,
        ("shardcache_reader_chunk_seconds_total", LABELS): chunk_s,
        ("shardcache_reader_chunks_total", LABELS): chunks,
        ("shardcache_store_requests_total", (("op", "GET"),)): gets,
        ("shardcache_disk_bytes", ()): 1024.0,
    }


def test_a_reader_that_waited_half_the_interval_shows_a_fifty_percent_stall() -> None:
    f = frame(scraped(0, 0, 1.0, 0, 0, 3), scraped(1000, 8000, 3.0, 0.4, 4, 5), 4.0, [])
    (r,) = f.readers
    assert r.labels == {"training_job": "train", "rank": "0", "cache": "imgs", "path": "grpc"}
    assert (r.elements_per_s, r.bytes_per_s, r.stall, r.chunk_ms) == (250, 2000, 0.5, 100)
    assert f.store_requests == {"GET": (5, 0.5)} and f.disk_bytes == 1024


def test_a_counter_reset_shows_no_negative_rate() -> None:
    (r,) = frame(scraped(1000, 8000, 3.0, 0.4, 4, 5), scraped(10, 80, 0, 0, 1, 5), 1.0, []).readers
    assert (r.elements_per_s, r.stall) == (0, 0)


def test_a_partially_resident_cache_shows_its_resident_shards_and_hit_ratio() -> None:
    from rich.console import Console

    from cacheserver.cli.top import render
    from client import CacheInfo

    def cache(name: str, **fields: object) -> CacheInfo:
        base = dict.fromkeys(("num_elements", "disk_bytes", "raw_bytes", "stored_bytes"), 0)
        return CacheInfo(
            name,
            "READY",
            **base,
            num_shards=16,
            fingerprint="",
            create_time=0,
            commit_time=0,
            **fields,
        )  # type: ignore[arg-type]

    larger = cache(
        "larger", store_state="PULLING", resident_shards=4, resident_reads=1, streamed_reads=3
    )
    whole = cache("whole", store_state="STORED")
    console = Console(width=200, record=True)
    console.print(render(frame({}, {}, 1.0, [larger, whole]), "here"))
    shown = console.export_text()
    assert "PULLING 4/16 resident, hit 0.25" in shown
    assert "STORED" in shown and "16 resident" not in shown.split("whole", 1)[1]
