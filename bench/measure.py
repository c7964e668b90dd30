"""One measurement: a single (workload, size, strategy) run in its own process.

``run.py`` starts this script once per measurement so that memory is measured in isolation::

    python bench/measure.py --workload image --n 1000 --strategy memory --tmp-dir DIR

It prints exactly one line starting with ``RESULT `` followed by a JSON object on stdout;
everything else (TensorFlow's log output included) is noise the parent ignores.

Memory is the peak of ``RssAnon`` from ``/proc/<pid>/status``, sampled by a background thread
every 20 ms. Anonymous RSS excludes file-backed pages, so memory-mapped files (LMDB, the page
cache behind file reads) do not count; ``RssFile`` is recorded alongside for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from strategies import EpochResult

RESULT_PREFIX = "RESULT "
MB = 1_000_000
WARMUP_BATCHES = 2


def read_rss_kib(pid: int | str = "self") -> tuple[int, int]:
    """Return ``(RssAnon, RssFile)`` in KiB for ``pid`` from ``/proc/<pid>/status``."""
    anon = file = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1])
            elif line.startswith("RssFile:"):
                file = int(line.split()[1])
    return anon, file


class RssSampler:
    """Background sampler of a process's ``RssAnon``/``RssFile`` that tracks peaks.

    Besides the peak over its whole lifetime it keeps a *window* peak that
    :meth:`reset_window` restarts, used for per-epoch peaks.
    """

    def __init__(self, pid: int | str = "self", interval_s: float = 0.02) -> None:
        """Sample ``/proc/<pid>/status`` every ``interval_s`` once started."""
        self._pid = pid
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak_anon_kib = 0
        self.peak_file_kib = 0
        self.window_anon_kib = 0

    def start(self) -> RssSampler:
        """Take a first sample and start the background thread."""
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take a last sample and stop the background thread."""
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> int:
        """Take one sample now, update the peaks and return the current ``RssAnon`` (KiB)."""
        try:
            anon, file = read_rss_kib(self._pid)
        except (FileNotFoundError, ProcessLookupError):  # the sampled process is gone
            return 0
        with self._lock:
            self.peak_anon_kib = max(self.peak_anon_kib, anon)
            self.peak_file_kib = max(self.peak_file_kib, file)
            self.window_anon_kib = max(self.window_anon_kib, anon)
        return anon

    def reset_window(self) -> None:
        """Restart the window peak at the current value."""
        with self._lock:
            self.window_anon_kib = 0
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()


def kib_to_mb(kib: int) -> float:
    """Convert KiB (as ``/proc`` reports) to decimal MB."""
    return kib * 1024 / MB


def directory_bytes(path: Path) -> int:
    """Disk space allocated to the regular files below ``path`` (sparse files count as used)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def drop_page_cache() -> None:
    """Evict clean file pages from memory, so that the next reads come from the disk."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as knob:
            knob.write("3\n")
    except OSError as exc:
        raise RuntimeError(f"--cold needs to write /proc/sys/vm/drop_caches (root): {exc}") from exc


def _run_epoch(
    epoch: Callable[[], EpochResult], sampler: RssSampler, expected_label_sum: int, n: int,
    cold: bool = False,
) -> dict[str, Any]:
    """Run one epoch and describe it: time, checks, peak RssAnon, CPU time, page faults."""
    os.sync()  # flush the previous epoch's writes so that this epoch does not pay for them
    if cold:
        drop_page_cache()
    sampler.reset_window()
    before = resource.getrusage(resource.RUSAGE_SELF)
    epoch_result = epoch()
    after = resource.getrusage(resource.RUSAGE_SELF)
    sampler.sample()
    record = asdict(epoch_result)
    record["label_sum_ok"] = (
        None if epoch_result.label_sum is None else epoch_result.label_sum == expected_label_sum
    )
    record["elements_ok"] = epoch_result.elements == n
    record["peak_rss_anon_mb"] = kib_to_mb(sampler.window_anon_kib)
    record["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    record["minor_faults"] = after.ru_minflt - before.ru_minflt
    return record


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, run both epochs of one strategy and return the result record."""
    sampler = RssSampler().start()
    result: dict[str, Any] = {
        "workload": args.workload,
        "n": args.n,
        "strategy": args.strategy,
        "batch_size": args.batch_size,
        "status": "ok",
        "error": None,
        "epochs": [],
    }
    try:
        import tensorflow as tf
        from strategies import PLANNERS, StrategyContext, StrategyUnavailableError, timed_iteration
        from workloads import WORKLOADS, expected_label_sum, make_source, make_warmup

        result["tf_version"] = tf.__version__
        result["baseline_rss_anon_mb"] = kib_to_mb(sampler.sample())
        workload = WORKLOADS[args.workload]
        warmup_elements = min(args.warmup_batches * args.batch_size, args.n)
        if warmup_elements > 0:
            warmup = make_warmup(workload, warmup_elements).batch(args.batch_size)
            result["warmup_seconds"] = timed_iteration(warmup).seconds
        result["warm_rss_anon_mb"] = kib_to_mb(sampler.sample())
        ctx = StrategyContext(
            workload=workload,
            n=args.n,
            batch_size=args.batch_size,
            tmp_dir=Path(args.tmp_dir),
            socket_path=args.socket,
            cache_name=args.cache_name or f"{args.workload}-{args.n}",
            client_options=dict(args.client_option),
        )
        expected = expected_label_sum(workload, args.n)
        try:
            plan = PLANNERS[args.strategy](make_source(workload, args.n), ctx)
            for index, epoch in enumerate(plan.epochs):
                result["epochs"].append(_run_epoch(epoch, sampler, expected, args.n,
                                                   cold=args.cold and index > 0))
            for obj in plan.keep_alive:
                close = getattr(obj, "close", None)
                if callable(close):
                    close()
        except StrategyUnavailableError as exc:
            result["status"] = "unavailable"
            result["error"] = str(exc)
        result["disk_bytes"] = directory_bytes(ctx.tmp_dir)
    except Exception as exc:
        result["status"] = "error"
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    finally:
        sampler.stop()
    result["peak_rss_anon_mb"] = kib_to_mb(sampler.peak_anon_kib)
    result["peak_rss_file_mb"] = kib_to_mb(sampler.peak_file_kib)
    return result


def parse_client_option(item: str) -> tuple[str, Any]:
    """Parse ``KEY=VALUE`` into a keyword argument: true/false, an int, a float, else a string."""
    key, sep, text = item.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(
            f"bad client option {item!r}: expected KEY=VALUE, e.g. parallel_shards=4")
    value: Any = text
    if text.lower() in ("true", "false"):
        value = text.lower() == "true"
    else:
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                continue
    return key, value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line of one measurement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--n", type=int, required=True, help="number of elements")
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--tmp-dir", required=True, help="scratch directory for cache files")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--socket", default=None, help="cacheserver unix socket path")
    parser.add_argument("--cache-name", default=None, help="shardcache cache name")
    parser.add_argument("--client-option", action="append", default=[], metavar="KEY=VALUE",
                        type=parse_client_option,
                        help="keyword argument for cc.cache()/cc.dataset() (shardcache "
                        "strategies), e.g. parallel_shards=4; VALUE true/false/int/float/str")
    parser.add_argument("--cold", action="store_true",
                        help="drop the page cache before epoch 2 (needs root)")
    parser.add_argument(
        "--warmup-batches",
        type=int,
        default=WARMUP_BATCHES,
        help="batches of zero elements (at most --n elements) iterated untimed before epoch 1",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point: measure, then print the ``RESULT`` line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = measure(parse_args(argv))
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
