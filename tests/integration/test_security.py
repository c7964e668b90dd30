"""TLS, mutual TLS and bearer tokens with real certificates and sockets; request limits."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
import trustme
from daemon import Daemon
from pki import Pki
from wire import read_all, reason, records, split, stub, write_cache

from client import (
    CacheClient,
    CacheNotFoundError,
    InvalidArgumentError,
    ServerUnavailableError,
    UnauthenticatedError,
)
from client.wire.v1 import cache_service_pb2 as pb


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


def started(*args: str) -> Iterator[Daemon]:
    d = Daemon(extra_args=args).start()
    yield d
    d.close()


@pytest.fixture
def tls_daemon(pki: Pki) -> Iterator[Daemon]:
    yield from started("--tls-cert", str(pki.cert), "--tls-key", str(pki.key))


@pytest.fixture
def mtls_daemon(pki: Pki) -> Iterator[Daemon]:
    yield from started(
        "--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tls-client-ca", str(pki.ca_pem)
    )


def test_tls_serves_a_client_that_trusts_the_ca_and_refuses_plaintext(
    tls_daemon: Daemon, pki: Pki
) -> None:
    with CacheClient(tls_daemon.tcp_target, tls_ca=pki.ca_pem) as cc:
        assert cc.list() == []
    with (
        CacheClient(tls_daemon.tcp_target, connect_timeout=2) as plain,
        pytest.raises(ServerUnavailableError),
    ):
        plain.list()
    with (
        CacheClient(tls_daemon.tcp_target, tls_ca=pki.ca.cert_pem.bytes(), connect_timeout=2) as cc,
        pytest.raises(CacheNotFoundError),
    ):
        cc.info("nothing")


def test_mutual_tls_refuses_the_handshake_without_a_client_certificate(
    mtls_daemon: Daemon, pki: Pki
) -> None:
    with (
        CacheClient(mtls_daemon.tcp_target, tls_ca=pki.ca_pem, connect_timeout=2) as cc,
        pytest.raises(ServerUnavailableError, match="tls_cert/tls_key"),
    ):
        cc.list()
    with CacheClient(
        mtls_daemon.tcp_target, tls_ca=pki.ca_pem, tls_cert=pki.client_cert, tls_key=pki.client_key
    ) as cc:
        assert cc.list() == []
    stranger = trustme.CA().issue_cert("intruder.example")
    with (
        CacheClient(
            mtls_daemon.tcp_target,
            tls_ca=pki.ca_pem,
            connect_timeout=2,
            tls_cert=stranger.cert_chain_pems[0].bytes(),
            tls_key=stranger.private_key_pem.bytes(),
        ) as cc,
        pytest.raises(ServerUnavailableError),
    ):
        cc.list()


def test_the_command_line_speaks_mutual_tls_from_the_environment(
    mtls_daemon: Daemon, pki: Pki
) -> None:
    env = {
        "SHARDCACHE_TLS_CA": str(pki.ca_pem),
        "SHARDCACHE_TLS_CERT": str(pki.client_cert),
        "SHARDCACHE_TLS_KEY": str(pki.client_key),
    }

    def ls(target: str, **more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cacheserver", "ls", "--target", target],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env, **more},
        )

    over_tls = ls(mtls_daemon.tcp_target)
    assert over_tls.returncode == 0, over_tls.stderr
    assert over_tls.stdout.startswith("NAME")
    # its unix socket speaks no TLS: the same environment reads it as is
    local = ls(mtls_daemon.unix_target)
    assert local.returncode == 0, local.stderr
    missing = ls(mtls_daemon.tcp_target, SHARDCACHE_TLS_KEY="")
    assert missing.returncode != 0
    assert "SHARDCACHE_TLS_KEY" in missing.stderr and "Traceback" not in missing.stderr


@pytest.fixture
def token_daemon(tmp_path: Path) -> Iterator[Daemon]:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    yield from started("--auth-token-file", str(token_file))


def test_a_token_daemon_refuses_missing_and_wrong_tokens_but_answers_health(
    token_daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CACHESERVER_TOKEN", raising=False)
    for target in (token_daemon.unix_target, token_daemon.tcp_target):
        with (
            CacheClient(target) as cc,
            pytest.raises(UnauthenticatedError, match="requires a bearer token"),
        ):
            cc.list()
        with CacheClient(target, token="s3cret-tokem") as cc, pytest.raises(UnauthenticatedError):
            cc.list()
        with CacheClient(target, token="s3cret-token") as cc:
            assert cc.list() == []
    monkeypatch.setenv("CACHESERVER_TOKEN", "s3cret-token")
    with CacheClient(token_daemon.unix_target) as cc:
        assert cc.list() == []
    with grpc.insecure_channel(token_daemon.unix_target) as ch:
        with pytest.raises(grpc.RpcError) as err:  # streams are checked too
            list(stub(ch).ReadShard(pb.ReadShardRequest(name="x"), timeout=5))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert reason(err.value) == "UNAUTHENTICATED"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"),
            "cannot read --tls-cert /nonexistent/cert.pem: No such file or directory",
        ),
        (("--tls-cert", "{garbage}", "--tls-key", "{garbage}"), "holds no PEM certificate"),
        (
            ("--tls-cert", "{cert}", "--tls-key", "{garbage}"),
            "holds no unencrypted PEM private key",
        ),
        (
            (
                "--tls-cert",
                "{cert}",
            ),
            "--tls-key is missing",
        ),
        (("--auth-token-file", "{empty}"), "is empty"),
    ],
)
def test_unreadable_or_malformed_security_files_stop_the_daemon_at_start(
    tmp_path: Path, pki: Pki, flags: tuple[str, ...], message: str
) -> None:
    (tmp_path / "garbage").write_text("not a pem\n")
    (tmp_path / "empty").write_text("\n")
    paths = {"garbage": tmp_path / "garbage", "empty": tmp_path / "empty", "cert": pki.cert}
    args = [f.format(**paths) for f in flags]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cacheserver",
            "serve",
            "--data-dir",
            str(tmp_path / "data"),
            "--listen",
            "127.0.0.1:0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert not (tmp_path / "data").exists(), "the daemon touched its data dir"


def test_binding_a_non_loopback_address_without_tls_warns() -> None:
    d = Daemon(extra_args=("--listen", "0.0.0.0:0")).start()
    try:
        assert "listening on 0.0.0.0:0 without TLS" in d.log()
        assert d.log().count("without TLS") == 1, "the loopback and unix listeners are fine"
    finally:
        d.close()


def test_a_client_host_gets_at_most_its_share_of_streams() -> None:
    d = Daemon(extra_args=("--max-streams-per-client", "1")).start()
    try:
        with grpc.insecure_channel(d.unix_target) as ch:
            data = records(64, 4096)
            write_cache(ch, "shared", data)
            held = stub(ch).ReadShard(
                pb.ReadShardRequest(name="shared", chunk_bytes=4096), timeout=60
            )
            first = next(held)
            with pytest.raises(grpc.RpcError) as err:
                list(stub(ch).ReadShard(pb.ReadShardRequest(name="shared"), timeout=10))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert reason(err.value) == "TOO_MANY_STREAMS"
            assert "--max-streams-per-client" in err.value.details()
            rest = [r for chunk in held for r in split(chunk)]
            assert split(first) + rest == data
            # the stream ended, so its slot is free again
            assert (
                len(list(stub(ch).ReadShard(pb.ReadShardRequest(name="shared"), timeout=10))) >= 1
            )
    finally:
        d.close()


def test_oversized_messages_and_names_that_escape_the_data_dir_are_refused(tmp_path: Path) -> None:
    d = Daemon(extra_args=("--max-message-bytes", "1MiB")).start()
    try:
        with grpc.insecure_channel(d.unix_target) as ch:
            with pytest.raises(grpc.RpcError) as err:
                write_cache(ch, "big", records(1, 2 << 20))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with CacheClient(d.unix_target) as cc:
            for bad in ("../outside", "/etc/passwd", "a/../../b", "x" * 201):
                with pytest.raises(InvalidArgumentError):
                    cc.info(bad)
            assert cc.list() == []
        assert sorted(p.name for p in d.data_dir.iterdir()) == [
            "caches",
            "cacheserver.lock",
            "instance.token",
            "trash",
        ]
    finally:
        d.close()


def _rss(d: Daemon) -> int:
    assert d.proc is not None
    return int(psutil.Process(d.proc.pid).memory_info().rss)


_RAW = {"request_serializer": None, "response_deserializer": None}
_BIG = {"options": [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]}


def test_requests_without_a_token_are_refused_before_their_bodies_are_received(
    token_daemon: Daemon,
) -> None:
    """Four concurrent 100 MB bodies without a token used to raise the RSS by ~760 MB."""
    body = pb.GetCacheRequest(name="x" * (100 << 20)).SerializeToString()
    with grpc.insecure_channel(token_daemon.tcp_target, **_BIG) as ch:  # type: ignore[arg-type]
        assert (
            stub(ch)
            .ListCaches(
                pb.ListCachesRequest(),
                timeout=10,
                metadata=(("authorization", "Bearer s3cret-token"),),
            )
            .caches
            == []
        )
        before = _rss(token_daemon)
        get = ch.unary_unary("/cacheserver.v1.CacheService/GetCache", **_RAW)
        write = ch.stream_stream("/cacheserver.v1.CacheService/WriteCache", **_RAW)
        calls = [get.future(body, timeout=60) for _ in range(4)]
        writes = [write(iter([body]), timeout=60) for _ in range(4)]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call.result()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for w in writes:
            with pytest.raises(grpc.RpcError) as err:
                list(w)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        grown = _rss(token_daemon) - before
    assert grown < 64 << 20, f"RSS grew by {grown / 2**20:.0f} MiB for 8 refused calls"
    assert "Traceback" not in token_daemon.log()


def test_each_rpc_takes_messages_only_as_large_as_its_valid_requests_need() -> None:
    """Control RPCs take kilobytes; WriteCache takes a record up to --max-message-bytes."""
    d = Daemon(extra_args=("--max-message-bytes", "4MiB")).start()
    try:
        with grpc.insecure_channel(d.unix_target, **_BIG) as ch:  # type: ignore[arg-type]
            with pytest.raises(grpc.RpcError) as err:
                stub(ch).GetCache(pb.GetCacheRequest(name="x" * (1 << 20)), timeout=10)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "GetCache" in err.value.details() and "64 KiB" in err.value.details()
            # one record as large as the limit travels alone in its chunk, with its framing
            big = records(1, 4 << 20)
            write_cache(ch, "one-big-record", big)
            assert read_all(ch, "one-big-record") == big
            with pytest.raises(grpc.RpcError) as err:
                write_cache(ch, "too-big", records(1, (4 << 20) + (1 << 20)))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "Traceback" not in d.log()
    finally:
        d.close()


def test_unparseable_requests_are_invalid_argument_without_a_traceback() -> None:
    d = Daemon().start()
    try:
        garbage = b"\xff\xff\xff\xff"  # a truncated field key: not a protobuf message
        with grpc.insecure_channel(d.unix_target) as ch:
            for method in (
                "GetCache",
                "ListCaches",
                "ReadShard",
                "WriteCache",
                "StartMaterialize",
                "ReadElements",
            ):
                call = ch.stream_stream(f"/cacheserver.v1.CacheService/{method}", **_RAW)
                with pytest.raises(grpc.RpcError) as err:
                    list(call(iter([garbage]), timeout=10))
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (
                    method,
                    err.value.details(),
                )
        assert "Traceback" not in d.log() and "deserializing" not in d.log()
    finally:
        d.close()
