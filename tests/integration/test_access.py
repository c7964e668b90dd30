"""Who may do what: principals of --auth-file with grants, against real daemons.

One daemon serves most tests (principals by token over its unix socket); the
reload, mutual-TLS and /metrics tests start their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from daemon import Daemon, free_port
from data_port import connect as data_connect
from data_port import error, hello, opened, shard_values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pki import Pki
from waits import wait_until
from wire import reason, records, split, stub, write_requests

from client import CacheClient, PermissionDeniedError, UnauthenticatedError
from client.wire.v1 import cache_service_pb2 as pb

TOKENS = {
    "reader-a": "reader-a-token",
    "writer-a": "writer-a-token",
    "admin": "admin-token",
    "ops-b": "ops-b-token",
}
AUTH = f"""
[[principal]]
name = "reader-a"
token = "{TOKENS["reader-a"]}"
grants = [{{ verbs = ["read"], caches = ["team-a-*"] }}]

[[principal]]
name = "writer-a"
token_sha256 = "{hashlib.sha256(TOKENS["writer-a"].encode()).hexdigest()}"
grants = [{{ verbs = ["read", "write"], caches = ["team-a-*"] }}]

[[principal]]
name = "admin"
token = "{TOKENS["admin"]}"
grants = [{{ verbs = ["read", "write", "admin"], caches = ["*"] }}]

[[principal]]
name = "ops-b"
token = "{TOKENS["ops-b"]}"
grants = [{{ verbs = ["admin"], caches = ["team-b-*"] }}]
"""
#: The reference model of AUTH's grants: principal -> verb -> cache-name prefixes.
MODEL = {
    "reader-a": {"read": ("team-a-",)},
    "writer-a": {"read": ("team-a-",), "write": ("team-a-",)},
    "admin": {"read": ("",), "write": ("",), "admin": ("",)},
    "ops-b": {"admin": ("team-b-",)},
}


def as_(who: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {TOKENS[who]}"),)


def allowed(who: str, verb: str, name: str) -> bool:
    return any(name.startswith(p) for p in MODEL[who].get(verb, ()))


def write(ch: grpc.Channel, who: str, name: str, n: int = 8) -> list[pb.WriteCacheResponse]:
    return list(
        stub(ch).WriteCache(write_requests(name, records(n, 512)), metadata=as_(who), timeout=30)
    )


def denied(call: Any) -> grpc.RpcError:
    """The error of call(), which must be PERMISSION_DENIED."""
    with pytest.raises(grpc.RpcError) as err:
        result = call()
        if hasattr(result, "__next__"):
            list(result)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
    return err.value


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    auth = tmp_path_factory.mktemp("auth") / "auth.toml"
    auth.write_text(AUTH)
    d = Daemon(extra_args=("--auth-file", str(auth), "--log-format", "json")).start()
    with grpc.insecure_channel(d.unix_target) as ch:
        for name in ("team-a-x", "team-a-y", "team-b-x"):
            write(ch, "admin", name, 64)
    yield d
    d.close()


@pytest.fixture(scope="module")
def channel(daemon: Daemon) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(daemon.unix_target) as ch:
        yield ch


def state(ch: grpc.Channel) -> dict[str, tuple[Any, ...]]:
    """What an admin sees of every cache, less what reads change (hits, last read)."""
    caches = stub(ch).ListCaches(pb.ListCachesRequest(), metadata=as_("admin"), timeout=10)
    return {
        c.name: (c.state, c.fingerprint, c.num_elements, c.pinned, c.ttl_seconds)
        for c in caches.caches
    }


def test_a_reader_reads_its_caches_over_grpc_and_the_data_plane_and_nothing_else(
    daemon: Daemon, channel: grpc.Channel
) -> None:
    s = stub(channel)
    cache = s.GetCache(
        pb.GetCacheRequest(name="team-a-x"), metadata=as_("reader-a"), timeout=10
    ).cache
    got = [
        r
        for chunk in s.ReadShard(
            pb.ReadShardRequest(name="team-a-x"), metadata=as_("reader-a"), timeout=30
        )
        for r in split(chunk)
    ]
    assert len(got) == cache.num_elements == 64
    with grpc.insecure_channel(daemon.tcp_target) as tcp:
        granted = stub(tcp).AcquireReadLease(
            pb.AcquireReadLeaseRequest(name="team-a-x", data_plane=True),
            metadata=as_("reader-a"),
            timeout=10,
        )
        assert granted.ticket
        with opened(granted.data_port, granted.ticket) as sock:
            assert len(shard_values(sock, 0, 0, 64)) == 64
        err = denied(
            lambda: stub(tcp).AcquireReadLease(
                pb.AcquireReadLeaseRequest(name="team-b-x", data_plane=True),
                metadata=as_("reader-a"),
                timeout=10,
            )
        )
        assert reason(err) == "PERMISSION_DENIED"
        assert "reader-a may not read cache 'team-b-x'" in err.details()
    with data_connect(granted.data_port) as sock:  # a ticket it could not get: none works
        hello(sock, os.urandom(32))
        assert error(sock)[0] == "LEASE_NOT_FOUND"
    before = state(channel)
    for call in (
        lambda: s.GetCache(pb.GetCacheRequest(name="team-b-x"), metadata=as_("reader-a")),
        lambda: s.ReadShard(pb.ReadShardRequest(name="team-b-x"), metadata=as_("reader-a")),
        lambda: s.ReadElements(
            pb.ReadElementsRequest(name="team-b-x", indices=b"\0" * 8), metadata=as_("reader-a")
        ),
        lambda: s.DeleteCache(pb.DeleteCacheRequest(name="team-a-x"), metadata=as_("reader-a")),
        lambda: s.SetCacheRetention(
            pb.SetCacheRetentionRequest(name="team-a-x", pinned=True), metadata=as_("reader-a")
        ),
        lambda: write(channel, "reader-a", "team-a-new"),
    ):
        assert reason(denied(call)) == "PERMISSION_DENIED"
    assert state(channel) == before
    names = [
        c.name
        for c in s.ListCaches(pb.ListCachesRequest(), metadata=as_("reader-a"), timeout=10).caches
    ]
    assert sorted(names) == ["team-a-x", "team-a-y"]


def test_the_client_raises_permission_denied_with_the_daemons_message(daemon: Daemon) -> None:
    with CacheClient(daemon.unix_target, token=TOKENS["reader-a"]) as cc:
        assert sorted(c.name for c in cc.list()) == ["team-a-x", "team-a-y"]
        with pytest.raises(PermissionDeniedError, match="may not admin cache 'team-a-y'"):
            cc.pin("team-a-y")
        with pytest.raises(PermissionDeniedError, match="may not read cache 'team-b-x'"):
            cc.info("team-b-x")
    with CacheClient(daemon.unix_target, token="nobody") as cc, pytest.raises(UnauthenticatedError):
        cc.list()


def test_a_writer_writes_but_does_not_delete_and_an_admin_does_everything(
    channel: grpc.Channel,
) -> None:
    s = stub(channel)
    assert write(channel, "writer-a", "team-a-w")[-1].committed.num_elements == 8
    denied(lambda: write(channel, "writer-a", "team-b-w"))
    denied(lambda: s.DeleteCache(pb.DeleteCacheRequest(name="team-a-w"), metadata=as_("writer-a")))
    assert "team-a-w" in state(channel) and "team-b-w" not in state(channel)
    s.SetCacheRetention(
        pb.SetCacheRetentionRequest(name="team-a-w", pinned=True, ttl_seconds=3600),
        metadata=as_("admin"),
    )
    assert state(channel)["team-a-w"][3:] == (True, 3600)
    s.DeleteCache(pb.DeleteCacheRequest(name="team-a-w"), metadata=as_("admin"))
    assert "team-a-w" not in state(channel)


def test_the_cli_shows_a_refusal_in_one_line_and_exits_non_zero(daemon: Daemon) -> None:
    env = {**os.environ, "CACHESERVER_TOKEN": TOKENS["reader-a"]}
    for args in (["rm", "team-a-x"], ["pin", "team-b-x"], ["info", "team-b-x"]):
        result = subprocess.run(
            [sys.executable, "-m", "cacheserver", *args, "--target", daemon.unix_target],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert result.returncode != 0, result.stdout
        assert "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "reader-a may not" in lines[0], result.stderr


def audit_lines(d: Daemon) -> list[dict[str, Any]]:
    docs = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
    return [doc for doc in docs if doc.get("logger") == "cacheserver.audit"]


def test_every_state_changing_call_leaves_an_audit_line(
    daemon: Daemon, channel: grpc.Channel
) -> None:
    s = stub(channel)
    write(channel, "writer-a", "team-a-audited")
    denied(
        lambda: s.DeleteCache(
            pb.DeleteCacheRequest(name="team-a-audited"), metadata=as_("reader-a")
        )
    )
    s.SetCacheRetention(
        pb.SetCacheRetentionRequest(name="team-a-audited", pinned=True), metadata=as_("admin")
    )
    s.DeleteCache(pb.DeleteCacheRequest(name="team-a-audited"), metadata=as_("admin"))
    s.GetCache(pb.GetCacheRequest(name="team-a-x"), metadata=as_("admin"))  # no change
    seen = [
        (a["principal"], a["verb"], a["method"], a["result"])
        for a in audit_lines(daemon)
        if a["cache"] == "team-a-audited"
    ]
    assert seen == [
        ("writer-a", "write", "WriteCache", "OK"),
        ("reader-a", "admin", "DeleteCache", "PERMISSION_DENIED"),
        ("admin", "admin", "SetCacheRetention", "OK"),
        ("admin", "admin", "DeleteCache", "OK"),
    ]
    assert not [a for a in audit_lines(daemon) if a["method"] == "GetCache"]


def test_materializations_need_write_and_their_operations_their_starter_or_an_admin(
    channel: grpc.Channel,
) -> None:
    s = stub(channel)
    start = pb.StartMaterializeRequest(name="team-a-m", entry_point="mod:fn", num_shards=1)
    err = denied(lambda: s.StartMaterialize(start, metadata=as_("reader-a"), timeout=10))
    assert "reader-a may not write cache 'team-a-m'" in err.details()
    with pytest.raises(grpc.RpcError) as refused:  # write granted: the operator's policy next
        s.StartMaterialize(start, metadata=as_("writer-a"), timeout=10)
    assert reason(refused.value) == "MATERIALIZE_NOT_ALLOWED"
    op = "materialize/team-a-m"
    for who in ("reader-a", "writer-a"):  # nobody's own: only an admin of the cache follows it
        for call in (
            lambda: s.GetOperation(pb.GetOperationRequest(name=op), metadata=as_(who)),  # noqa: B023
            lambda: s.WatchOperation(pb.WatchOperationRequest(name=op), metadata=as_(who)),  # noqa: B023
            lambda: s.CancelOperation(pb.CancelOperationRequest(name=op), metadata=as_(who)),  # noqa: B023
        ):
            assert "only the principal that started it" in denied(call).details()
    with pytest.raises(grpc.RpcError) as missing:
        s.GetOperation(
            pb.GetOperationRequest(name="materialize/team-a-m"), metadata=as_("admin"), timeout=10
        )
    assert reason(missing.value) == "OPERATION_NOT_FOUND"


NAMES = ("team-a-h", "team-b-h", "other-h")
OPS = {
    "get": "read",
    "read": "read",
    "lease": "read",
    "write": "write",
    "delete": "admin",
    "pin": "admin",
    "ttl": "admin",
}


def _call(ch: grpc.Channel, who: str, op: str, name: str) -> None:
    s, md = stub(ch), as_(who)
    if op == "get":
        s.GetCache(pb.GetCacheRequest(name=name), metadata=md, timeout=10)
    elif op == "read":
        list(s.ReadShard(pb.ReadShardRequest(name=name), metadata=md, timeout=10))
    elif op == "lease":
        lease = s.AcquireReadLease(pb.AcquireReadLeaseRequest(name=name), metadata=md, timeout=10)
        s.ReleaseReadLease(
            pb.ReleaseReadLeaseRequest(lease_id=lease.lease_id), metadata=md, timeout=10
        )
    elif op == "write":
        list(s.WriteCache(write_requests(name, records(2, 64)), metadata=md, timeout=10))
    elif op == "delete":
        s.DeleteCache(pb.DeleteCacheRequest(name=name), metadata=md, timeout=10)
    elif op == "pin":
        s.SetCacheRetention(
            pb.SetCacheRetentionRequest(name=name, pinned=True), metadata=md, timeout=10
        )
    else:
        s.SetCacheRetention(
            pb.SetCacheRetentionRequest(name=name, ttl_seconds=600), metadata=md, timeout=10
        )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(MODEL)), st.sampled_from(sorted(OPS)), st.sampled_from(NAMES)
        ),
        min_size=1,
        max_size=6,
    )
)
def test_any_principal_verb_and_name_is_decided_as_the_grants_say(
    channel: grpc.Channel, calls: list[tuple[str, str, str]]
) -> None:
    for who, op, name in calls:
        before = state(channel)
        try:
            _call(channel, who, op, name)
            refused = False
        except grpc.RpcError as exc:
            refused = exc.code() == grpc.StatusCode.PERMISSION_DENIED
            assert refused or exc.code() in (
                grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.FAILED_PRECONDITION,
            ), exc
        assert refused != allowed(who, OPS[op], name), (who, op, name)
        if refused:
            assert state(channel) == before, f"a refused {op} of {name} by {who} changed it"


def _auth_file(path: Path, *principals: tuple[str, str, str]) -> None:
    path.write_text(
        "".join(
            f'[[principal]]\nname = "{name}"\ntoken = "{token}"\n'
            f'grants = [{{ verbs = ["read", "write", "admin"], caches = ["{pattern}"] }}]\n'
            for name, token, pattern in principals
        )
    )


def test_a_token_removed_from_the_file_is_refused_and_its_streams_and_tickets_end(
    tmp_path: Path,
) -> None:
    auth = tmp_path / "auth.toml"
    keep, gone = ("keeper", "keep-token", "*"), ("leaver", "leave-token", "team-a-*")
    _auth_file(auth, keep, gone)
    d = Daemon(extra_args=("--auth-file", str(auth))).start()
    leaver = (("authorization", "Bearer leave-token"),)
    try:
        with grpc.insecure_channel(d.tcp_target) as ch:
            list(
                stub(ch).WriteCache(
                    write_requests("team-a-r", records(256, 4096)), metadata=leaver, timeout=30
                )
            )
            held = stub(ch).ReadShard(
                pb.ReadShardRequest(name="team-a-r", chunk_bytes=4096), metadata=leaver, timeout=60
            )
            next(held)
            granted = stub(ch).AcquireReadLease(
                pb.AcquireReadLeaseRequest(name="team-a-r", data_plane=True),
                metadata=leaver,
                timeout=10,
            )
            sock = opened(granted.data_port, granted.ticket)
            _auth_file(auth, keep)
            assert d.proc is not None
            d.proc.send_signal(signal.SIGHUP)
            with pytest.raises(grpc.RpcError) as err:
                list(held)  # the open stream is ended
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "no longer" in err.value.details()
            with pytest.raises(grpc.RpcError) as err:
                stub(ch).GetCache(pb.GetCacheRequest(name="team-a-r"), metadata=leaver, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(AssertionError, match="LEASE_NOT_FOUND"):
                shard_values(sock, 0, 0, 1)  # the lease's ticket ended with its grant
            sock.close()
            # a change to the file is seen without a signal
            _auth_file(auth, keep, ("leaver", "new-token", "team-a-*"))
            wait_until(lambda: _answers(ch, "new-token"), what="the new token accepted")
        assert "Traceback" not in d.log()
    finally:
        d.close()


def _answers(ch: grpc.Channel, token: str) -> bool:
    try:
        stub(ch).ListCaches(
            pb.ListCachesRequest(), timeout=10, metadata=(("authorization", f"Bearer {token}"),)
        )
        return True
    except grpc.RpcError:
        return False


def test_a_client_certificate_names_its_principal_and_metrics_want_token_and_tls_and_name_no_job(
    tmp_path: Path,
) -> None:
    pki = Pki(tmp_path)
    auth, token = tmp_path / "auth.toml", tmp_path / "metrics.token"
    auth.write_text(
        '[[principal]]\nname = "trainer"\ncert = "trainer.example"\n'
        'grants = [{ verbs = ["read"], caches = ["team-a-*"] }]\n'
        '[[principal]]\nname = "admin"\ntoken = "admin-token"\n'
        'grants = [{ verbs = ["read", "write", "admin"], caches = ["*"] }]\n'
    )
    token.write_text("scrape-token\n")
    port = free_port()
    d = Daemon(
        extra_args=(
            "--auth-file",
            str(auth),
            "--tls-cert",
            str(pki.cert),
            "--tls-key",
            str(pki.key),
            "--tls-client-ca",
            str(pki.ca_pem),
            "--metrics-listen",
            f"127.0.0.1:{port}",
            "--metrics-tls",
            "--metrics-token-file",
            str(token),
            "--no-metrics-readers",
        )
    ).start()
    try:
        with grpc.insecure_channel(d.unix_target) as ch:
            for name in ("team-a-c", "team-b-c"):
                write(ch, "admin", name)
            stub(ch).ReportReads(
                pb.ReportReadsRequest(
                    reporter="r",
                    readers=[
                        pb.ReaderFigures(
                            training_job="secret-project", cache="team-a-c", path="grpc", elements=1
                        )
                    ],
                ),
                metadata=as_("admin"),
                timeout=10,
            )
        mtls = {"tls_ca": pki.ca_pem, "tls_cert": pki.client_cert, "tls_key": pki.client_key}
        with CacheClient(d.tcp_target, **mtls) as cc:
            assert [c.name for c in cc.list()] == ["team-a-c"]
            with pytest.raises(PermissionDeniedError, match="trainer may not read"):
                cc.info("team-b-c")
        stranger = pki.ca.issue_cert("stranger.example")
        (tmp_path / "s.pem").write_bytes(stranger.cert_chain_pems[0].bytes())
        (tmp_path / "s.key").write_bytes(stranger.private_key_pem.bytes())
        with (
            CacheClient(
                d.tcp_target,
                tls_ca=pki.ca_pem,
                tls_cert=tmp_path / "s.pem",
                tls_key=tmp_path / "s.key",
            ) as cc,
            pytest.raises(UnauthenticatedError),
        ):
            cc.list()
        _scrapes(f"127.0.0.1:{port}", pki)
    finally:
        d.close()


def _scrapes(address: str, pki: Pki) -> None:
    context = ssl.create_default_context(cafile=str(pki.ca_pem))
    context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP: refused
        urllib.request.urlopen(f"http://{address}/metrics", timeout=10)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"https://{address}/metrics", timeout=10, context=context)
    err.value.close()
    assert err.value.code == 401
    request = urllib.request.Request(
        f"https://{address}/metrics", headers={"Authorization": "Bearer scrape-token"}
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        body = response.read().decode()
    assert 'shardcache_access_denied_total{verb="read"} 1.0' in body
    assert "secret-project" not in body and "team-a-c" not in body  # --no-metrics-readers


def test_holding_a_streamed_shard_needs_read_on_the_leases_cache(channel: grpc.Channel) -> None:
    """HoldStreamedShard lets its caller read a shard's files: the grant a lease takes, checked
    against the lease's cache whoever presents its id."""
    s = stub(channel)
    lease = s.AcquireReadLease(
        pb.AcquireReadLeaseRequest(name="team-b-x"), metadata=as_("admin"), timeout=10
    )
    try:
        hold = pb.HoldStreamedShardRequest(lease_id=lease.lease_id, shard=0)
        err = denied(lambda: s.HoldStreamedShard(hold, metadata=as_("reader-a"), timeout=10))
        assert "reader-a may not read cache 'team-b-x'" in err.details()
        held = s.HoldStreamedShard(hold, metadata=as_("admin"), timeout=10)
        assert held.resident and held.shard_dir  # a cache on the daemon's disk: its own dir
    finally:
        s.ReleaseReadLease(
            pb.ReleaseReadLeaseRequest(lease_id=lease.lease_id), metadata=as_("admin"), timeout=10
        )
