"""`cacheserver top --once` against a real daemon: its readers, caches and store figures."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
from daemon import Daemon, free_port
from wire import records, stub, write_cache

from client.wire.v1 import cache_service_pb2 as pb


def test_top_once_shows_the_reported_readers_and_the_caches(tmp_path) -> None:
    port = free_port()
    token = tmp_path / "metrics.token"
    token.write_text("scrape-me\n")
    d = Daemon(
        extra_args=("--metrics-listen", f"127.0.0.1:{port}", "--metrics-token-file", str(token))
    ).start()
    try:
        with grpc.insecure_channel(d.unix_target) as ch:
            write_cache(ch, "imgs", records(4, 1000))
            stub(ch).ReportReads(
                pb.ReportReadsRequest(
                    reporter="p0",
                    readers=[
                        pb.ReaderFigures(
                            training_job="resnet",
                            rank=7,
                            cache="imgs",
                            path="direct",
                            elements=4,
                            bytes=4000,
                            chunks=1,
                            chunk_seconds=0.01,
                        )
                    ],
                ),
                timeout=10,
            )
        command = [
            sys.executable,
            "-m",
            "cacheserver",
            "top",
            "--once",
            "--interval",
            "0.1",
            "--metrics",
            f"http://127.0.0.1:{port}/metrics",
            "--target",
            d.unix_target,
        ]
        refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
        out = subprocess.run(
            [*command, "--metrics-token-file", str(token)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "160"},
        )
    finally:
        d.close()
    assert refused.returncode == 1 and "401" in refused.stderr, refused.stderr
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    reader = next(line for line in lines if "resnet" in line)
    assert " 7 " in reader and "imgs" in reader and "direct" in reader and "0%" in reader
    assert any("imgs" in line and "READY" in line for line in lines)
    assert "readers" in out.stdout and "caches" in out.stdout


def test_top_says_how_to_reach_the_metrics_when_it_cannot() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheserver",
            "top",
            "--once",
            "--interval",
            "0.1",
            "--metrics",
            f"http://127.0.0.1:{free_port()}/metrics",
            "--target",
            "127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "--metrics-listen" in out.stderr
