"""What the operations layer costs a reader: plain vs bearer token vs TLS + token.

Starts one real daemon per mode (all with --metrics-listen, so metrics are on in
every row), writes the same cache into each over the raw wire protocol, then
streams it back with ReadShard, alternating modes round by round so machine
noise hits every mode alike. Prints a markdown table of throughput and ratios
to the plain daemon. Short by design (the machine is shared):

    .venv/bin/python bench/ops_overhead.py --mib 64 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import trustme

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from daemon import Daemon, free_port
from wire import records, stub, write_cache

from client.wire.v1 import cache_service_pb2 as pb


def _modes(tmp: Path) -> dict[str, tuple[tuple[str, ...], dict[str, object]]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    (tmp / "cert.pem").write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
    (tmp / "key.pem").write_bytes(cert.private_key_pem.bytes())
    (tmp / "token").write_text("bench-token")
    token = ("--auth-token-file", str(tmp / "token"))
    tls = ("--tls-cert", str(tmp / "cert.pem"), "--tls-key", str(tmp / "key.pem"))
    return {"plain": ((), {}), "token": (token, {"token": True}),
            "tls+token": (token + tls, {"token": True, "tls": ca.cert_pem.bytes()})}


def _channel(d: Daemon, opts: dict[str, object]) -> grpc.Channel:
    options = [("grpc.max_receive_message_length", 256 << 20)]
    if "tls" in opts:
        creds = grpc.ssl_channel_credentials(root_certificates=opts["tls"])  # type: ignore[arg-type]
        return grpc.secure_channel(d.tcp_target, creds, options=options)
    return grpc.insecure_channel(d.tcp_target, options=options)


def _read(ch: grpc.Channel, metadata: tuple[tuple[str, str], ...], shards: int) -> int:
    total = 0
    for shard in range(shards):
        for chunk in stub(ch).ReadShard(pb.ReadShardRequest(name="bench", shard=shard),
                                        metadata=metadata, timeout=600):
            total += len(chunk.data)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="cache size in MiB")
    ap.add_argument("--rounds", type=int, default=5, help="reads per mode (median reported)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sc-bench-ops-"))
    data = records(args.mib * 8, 128 << 10)  # 128 KiB incompressible records
    daemons, channels, times = {}, {}, {}
    try:
        for mode, (flags, opts) in _modes(tmp).items():
            d = Daemon(extra_args=(*flags, "--metrics-listen", f"127.0.0.1:{free_port()}"))
            daemons[mode] = d.start()
            meta = (("authorization", "Bearer bench-token"),) if opts.get("token") else ()
            ch = _channel(d, opts)
            cache = write_cache(ch, "bench", data, metadata=meta)
            channels[mode] = (ch, meta, len(cache.shards))
            times[mode] = []
        for _ in range(args.rounds):
            for mode, (ch, meta, shards) in channels.items():
                t0 = time.perf_counter()
                assert _read(ch, meta, shards) == args.mib << 20
                times[mode].append(time.perf_counter() - t0)
    finally:
        for d in daemons.values():
            d.close()
    base = statistics.median(times["plain"])
    print(f"| mode | MiB/s (median of {args.rounds}) | time vs plain |")
    print("|---|---|---|")
    for mode, ts in times.items():
        med = statistics.median(ts)
        print(f"| {mode} | {args.mib / med:,.0f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
