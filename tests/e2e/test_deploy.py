"""deploy/: the manifests', the unit's and the image's command run the daemon for real.

Kubernetes, systemd and a container runtime are not needed: the cacheserver container's
own command, args and env run as a real process with the container's absolute paths
mapped into a temp dir, probed over gRPC health the way the kubelet does, used by a real
client through the socket the training container is told about, then stopped with SIGTERM
as the kubelet (or systemd) stops it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import data_port
import grpc
import pytest
from daemon import free_port
from deploy_tree import (
    CONTAINERFILE,
    DAEMONSET,
    POD_IP,
    ROOT,
    SIDECAR_JOB,
    SOCKET_TARGET,
    STORE_SETTINGS,
    UNIT,
    UNIT_ENV,
    PathMap,
    container,
    daemonset_deployment,
    data_listen_port,
    flag,
    grpc_probe_port,
    kubelet_probe,
    load_one,
    port_is_free,
    sidecar_deployment,
    write_zero_cache,
)
from exposition import scrape
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.wire.v1 import cache_service_pb2 as pb
from client.wire.v1 import cache_service_pb2_grpc as pb_grpc


@pytest.fixture
def scratch() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="dep-", dir="/tmp"))  # short: sun_path is 108 bytes
    yield root
    shutil.rmtree(root, ignore_errors=True)


# --- the manifests' daemon ------------------------------------------------------------


@pytest.mark.parametrize(
    "make", [sidecar_deployment, daemonset_deployment], ids=["sidecar-job", "daemonset"]
)
def test_the_manifest_daemon_serves_probes_and_the_client_then_drains_on_sigterm(
    make, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from client import CacheClient

    dep = make(scratch)
    log_path = scratch / "daemon.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            dep.argv, env={**os.environ, **dep.env}, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        startup = dep.probes["startupProbe"]
        kubelet_probe(
            dep.probe_port,
            startup,
            float(startup["periodSeconds"]) * float(startup["failureThreshold"]),
        )
        kubelet_probe(dep.probe_port, dep.probes["readinessProbe"], 5)
        kubelet_probe(dep.probe_port, dep.probes["livenessProbe"], 5)

        assert dep.client_target.startswith(f"unix://{scratch}/")
        size = write_zero_cache(dep.client_target, "epoch-1", chunks=16)
        monkeypatch.delenv("SHARDCACHE_TARGETS", raising=False)
        for name, value in dep.client_env.items():
            monkeypatch.setenv(name, value)
        # the targets from the training container's env: the sidecar's socket, or the
        # fleet's headless Service (the daemon's TCP port, what other nodes' pods reach)
        with CacheClient() as cc:
            assert cc.target == dep.client_env.get("SHARDCACHE_TARGETS", dep.client_target)
            [info] = cc.list()
            assert (info.name, info.state, info.num_elements) == ("epoch-1", "READY", 128)
        if dep.metrics_url is not None:
            assert scrape(dep.metrics_url)[("shardcache_written_bytes_total", ())] == size
        # a TCP reader (another node's pod): the lease's ticket names the manifest's data
        # port, and the daemon serves the read's bytes there, at the pod IP gRPC is on
        with grpc.insecure_channel(f"{POD_IP}:{dep.probe_port}") as ch:
            granted = data_port.lease(ch, "epoch-1")
            assert granted.ticket and granted.data_port == dep.data_port
            with data_port.opened(granted.data_port, granted.ticket) as sock:
                values = data_port.shard_values(sock, 0, 0, 8)
            data_port.release(ch, granted)
        assert values == [bytes(65536)] * 8
        if dep.metrics_url is not None:
            samples = scrape(dep.metrics_url)
            assert samples[("shardcache_read_bytes_total", (("plane", "data"),))] == 8 * 65536

        with grpc.insecure_channel(dep.client_target) as ch:
            stream = pb_grpc.CacheServiceStub(ch).ReadShard(
                pb.ReadShardRequest(name="epoch-1", shard=0, chunk_bytes=65536)
            )
            received = len(next(stream).data)  # in flight when SIGTERM arrives
            stopped_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc: dict[str, int] = {}
            waiter = threading.Thread(
                target=lambda: rc.setdefault("rc", proc.wait(dep.grace_period_s))
            )
            waiter.start()
            received += sum(len(r.data) for r in stream)
            waiter.join(dep.grace_period_s + 5)
        assert received == size
        assert rc.get("rc") == 0, log_path.read_text(errors="replace")
        assert time.monotonic() - stopped_at < dep.grace_period_s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_the_daemonset_with_its_credentials_secret_serves_only_the_tokens_it_names(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two Secrets of daemonset.yaml and client-pod.yaml created as the comments say:
    the daemon reads auth.toml from the mounted Secret, the trainer's token gets its team's
    caches, a call without a token is refused, the kubelet's probes still pass."""
    from client import CacheClient, PermissionDeniedError, UnauthenticatedError

    manifest = DAEMONSET.read_text()
    auth_path = re.search(r"--from-literal=auth-file=(\S+)", manifest)
    assert auth_path, "daemonset.yaml no longer says how to create shardcache-auth"
    secrets = {
        "shardcache-auth": {
            "auth.toml": '[[principal]]\nname = "team-a"\ntoken = "team-a-token"\n'
            'grants = [{ verbs = ["read", "write"], caches = ["team-a-*"] }]\n',
            "auth-file": auth_path.group(1),
        },
        "shardcache-token": {"token": "team-a-token"},
    }
    dep = daemonset_deployment(scratch, secrets)
    assert dep.env["CACHESERVER_AUTH_FILE"].startswith(str(scratch))
    with open(scratch / "daemon.log", "wb") as log:
        proc = subprocess.Popen(
            dep.argv, env={**os.environ, **dep.env}, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        startup = dep.probes["startupProbe"]
        kubelet_probe(
            dep.probe_port,
            startup,
            float(startup["periodSeconds"]) * float(startup["failureThreshold"]),
        )
        kubelet_probe(dep.probe_port, dep.probes["readinessProbe"], 5)
        monkeypatch.delenv("CACHESERVER_TOKEN", raising=False)
        with CacheClient(dep.client_target) as cc, pytest.raises(UnauthenticatedError):
            cc.list()
        assert dep.client_env["CACHESERVER_TOKEN"] == "team-a-token"
        monkeypatch.setenv("CACHESERVER_TOKEN", dep.client_env["CACHESERVER_TOKEN"])
        with CacheClient(dep.client_target) as cc:
            assert cc.list() == []
            with pytest.raises(PermissionDeniedError, match="team-a may not admin"):
                cc.pin("team-a-x")
    finally:
        proc.kill()
        proc.wait(30)


# --- the systemd unit ------------------------------------------------------------------


def _unit(text: str) -> dict[str, list[str]]:
    """Key -> values of a unit file, continuation lines joined."""
    values: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def _verify(unit_path: Path) -> list[str]:
    """The lines of `systemd-analyze verify` about this unit (it exits 0 on some errors)."""
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=unit_path.parent,
    )
    output = result.stdout + result.stderr
    return [
        line for line in output.splitlines() if unit_path.name in line or str(unit_path) in line
    ] + ([f"exit status {result.returncode}: {output}"] if result.returncode else [])


def _installable_unit(scratch: Path, text: str | None = None) -> Path:
    """The unit with ExecStart's install path pointed at this venv's cacheserver."""
    text = UNIT.read_text() if text is None else text
    exec_start = shlex.split(_unit(text)["ExecStart"][0])[0]
    path = scratch / UNIT.name
    path.write_text(text.replace(exec_start, str(Path(sys.executable).parent / "cacheserver")))
    return path


def test_systemd_analyze_verify_finds_nothing_wrong_with_the_unit(scratch: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    assert _verify(_installable_unit(scratch)) == []
    # and the check would notice a mistake
    broken = UNIT.read_text().replace("ProtectHome=yes", "ProtectHome=yes\nProtectHomee=yes")
    assert _verify(_installable_unit(scratch, broken)) != []


def test_the_unit_notifies_stops_after_the_drain_and_uses_its_state_and_runtime_dirs() -> None:
    unit = _unit(UNIT.read_text())
    assert unit["Type"] == ["notify"] and unit["Restart"] == ["on-failure"]
    argv = shlex.split(unit["ExecStart"][0])
    assert float(unit["TimeoutStopSec"][0]) > float(flag(argv, "--grace"))
    assert flag(argv, "--data-dir") == f"/var/lib/{unit['StateDirectory'][0]}"
    assert SOCKET_TARGET.replace("unix://", "").startswith(f"/run/{unit['RuntimeDirectory'][0]}/")
    assert SOCKET_TARGET in argv and "127.0.0.1:50051" in argv
    # the data port: fixed (a firewall rule names it), on the host gRPC listens on
    assert flag(argv, "--data-listen") == "127.0.0.1:50052"
    for option in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "DynamicUser"):
        assert unit[option] == ["yes"]
    assert unit["ProtectSystem"] == ["strict"]


def _env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an EnvironmentFile= file (comments and blank lines skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_the_unit_reads_its_store_settings_from_an_optional_environment_file() -> None:
    from cacheserver import config

    [env_file] = _unit(UNIT.read_text())["EnvironmentFile"]
    assert env_file.startswith("-/etc/")  # '-': the daemon starts without the file
    assert f"/etc/{env_file.split('/etc/', 1)[1]}" in UNIT_ENV.read_text()  # install path
    values = _env_file(UNIT_ENV)
    assert set(values) >= STORE_SETTINGS and values["CACHESERVER_STORE"] == ""
    known = {s.env for s in config.SETTINGS}
    assert all(k in known for k in values if k.startswith(config.ENV_PREFIX)), values


def test_the_units_command_tells_systemd_ready_then_stopping(scratch: Path) -> None:
    """What systemd sees of Type=notify: READY=1 once it serves, STOPPING=1 on SIGTERM."""
    argv = shlex.split(_unit(UNIT.read_text())["ExecStart"][0])
    paths = PathMap(scratch)
    paths.add("/var/lib/shardcache", "state")
    paths.add("/run/cacheserver", "runtime")
    argv = [str(Path(sys.executable).parent / "cacheserver"), *(paths(a) for a in argv[1:])]
    for port in (50051, data_listen_port(argv)):
        if not port_is_free(port):
            argv = [a.replace(f":{port}", f":{free_port()}") for a in argv]
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(scratch / "notify"))
    notify.settimeout(30)
    env = {**os.environ, **_env_file(UNIT_ENV), "NOTIFY_SOCKET": str(scratch / "notify")}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert notify.recv(4096) == b"READY=1"
        with grpc.insecure_channel(paths(SOCKET_TARGET)) as ch:  # READY=1 means serving
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert notify.recv(4096) == b"STOPPING=1"
        assert proc.wait(30) == 0
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


# --- the container image ---------------------------------------------------------------


def _containerfile() -> dict[str, list[str]]:
    """Instruction -> arguments (the last of each; exec-form JSON arrays only)."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        rest = rest.strip()
        out[instruction.upper()] = json.loads(rest) if rest.startswith("[") else rest.split()
    return out


def test_the_image_runs_exactly_the_command_the_manifests_run() -> None:
    image = _containerfile()
    for instruction in ("ENTRYPOINT", "CMD"):
        assert CONTAINERFILE.read_text().count(f"\n{instruction} [") == 1, (
            f"{instruction} must be one exec-form JSON array (no shell)"
        )
    command = [*image["ENTRYPOINT"], *image["CMD"]]
    assert command[:2] == ["cacheserver", "serve"]
    for path, kind in ((SIDECAR_JOB, "Job"), (DAEMONSET, "DaemonSet")):
        server = container(load_one(path, kind)["spec"]["template"]["spec"], "cacheserver")
        assert [*server["command"], *server["args"]] == command, path
        assert str(grpc_probe_port(server)) in image["EXPOSE"]
    assert str(data_listen_port(command)) in image["EXPOSE"]
    # the base is a build argument (make image passes a Debian base made from packages);
    # a plain build takes the public slim Python image
    assert image["FROM"] == ["${BASE}"]
    assert "ARG BASE=python:3.11-slim" in CONTAINERFILE.read_text().splitlines()
    assert flag(command, "--data-dir") in image["VOLUME"]
    user = image["USER"][0].split(":")[0]
    assert user not in ("root", "0")


def test_the_sidecar_trainer_reads_the_daemons_files_through_its_read_only_mount(
    scratch: Path,
) -> None:
    from client import CacheClient
    from client.read.fetching.direct import DirectReads, resolve_local_data_dir
    from client.settings import LOCAL_DATA_DIR

    spec = load_one(SIDECAR_JOB, "Job")["spec"]["template"]["spec"]
    server, train = container(spec, "cacheserver"), container(spec, "train")
    local = {e["name"]: e["value"] for e in train["env"]}[LOCAL_DATA_DIR.name]
    [mount] = [m for m in train["volumeMounts"] if m["mountPath"] == local]
    [served] = [
        m for m in server["volumeMounts"] if m["mountPath"] == flag(server["args"], "--data-dir")
    ]
    assert mount["name"] == served["name"] and mount["readOnly"] is True

    dep = sidecar_deployment(scratch)  # both mounts map to one directory, as in the pod
    # the console script would import the installed package; serve this checkout's code
    env = {
        **os.environ,
        **dep.env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    with open(scratch / "daemon.log", "wb") as log:
        proc = subprocess.Popen(dep.argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        kubelet_probe(dep.probe_port, dep.probes["startupProbe"], 60)
        write_zero_cache(dep.client_target, "direct", chunks=2)
        local_dir = resolve_local_data_dir(dep.client_env[LOCAL_DATA_DIR.name])
        with CacheClient(dep.client_target, local_data_dir=local_dir) as cc:
            reads = DirectReads(cc._transport, True, local_dir)
            fetcher, counted = reads.fetcher(cc._get("direct"))
            assert fetcher is not None and counted
            assert all(str(p).startswith(str(local_dir)) for p in fetcher.paths)
            fetcher.close()
    finally:
        proc.kill()
        proc.wait(30)
