"""deploy/: the manifests, the unit and the image run the daemon the way the tests do.

Kubernetes, systemd and a container runtime are not needed: the manifests are
validated against the Kubernetes API schemas, and the cacheserver container's
own command, args and env run as a real process with the container's absolute
paths mapped into a temp dir, probed over gRPC health the way the kubelet does,
used by a real client through the socket the training container is told about,
then stopped with SIGTERM as the kubelet (or systemd) stops it.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.wire.v1 import cache_service_pb2 as pb
from client.wire.v1 import cache_service_pb2_grpc as pb_grpc

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SIDECAR_JOB = K8S / "sidecar" / "job.yaml"
DAEMONSET = K8S / "daemonset" / "daemonset.yaml"
CLIENT_POD = K8S / "daemonset" / "client-pod.yaml"
UNIT = DEPLOY / "systemd" / "cacheserver.service"
UNIT_ENV = DEPLOY / "systemd" / "cacheserver.env"
STORE_CONFIG = K8S / "daemonset" / "store.yaml"
MATERIALIZE_JOB = K8S / "materialize" / "job.yaml"
STORE_SETTINGS = {"CACHESERVER_STORE", "CACHESERVER_STORE_ENDPOINT"}
CONTAINERFILE = DEPLOY / "container" / "Containerfile"
#: the oldest Kubernetes the manifests must validate against (native sidecars: 1.29+)
K8S_VERSION = "1.31.0"
SOCKET_TARGET = "unix:///run/cacheserver/cacheserver.sock"


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def load_one(path: Path, kind: str) -> dict[str, Any]:
    [doc] = [d for d in load_all(path) if d["kind"] == kind]
    return doc


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    every = pod_spec.get("initContainers", []) + pod_spec["containers"]
    [found] = [c for c in every if c["name"] == name]
    return found


def k8s_yaml_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.y*ml") if p.name != "kustomization.yaml")


# --- (a) the manifests are valid Kubernetes objects ----------------------------------


@pytest.mark.parametrize("path", k8s_yaml_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_kubernetes_manifest_validates_strictly_against_the_api_schema(path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = load_all(path)
    assert docs, f"{path} holds no objects"
    for doc in docs:
        # strict: unknown fields (a typo, a field newer than K8S_VERSION) are errors
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_strict_validation_does_reject_an_unknown_field() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    job = load_one(SIDECAR_JOB, "Job")
    container(job["spec"]["template"]["spec"], "cacheserver")["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest_of_the_daemonset_directory() -> None:
    kustomization = yaml.safe_load((K8S / "daemonset" / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in k8s_yaml_files() if p.parent.name == "daemonset"}
    assert listed == present
    assert kustomization["namespace"] == load_one(K8S / "daemonset" / "namespace.yaml",
                                                  "Namespace")["metadata"]["name"]


def test_the_sidecar_is_a_native_sidecar_with_its_socket_and_cache_where_the_trainer_looks(
        ) -> None:
    spec = load_one(SIDECAR_JOB, "Job")["spec"]["template"]["spec"]
    server = container(spec, "cacheserver")
    assert server in spec["initContainers"] and server["restartPolicy"] == "Always"
    volumes = {v["name"]: v for v in spec["volumes"]}
    socket_mount = next(m for m in server["volumeMounts"]
                        if m["mountPath"] == "/run/cacheserver")
    assert volumes[socket_mount["name"]]["emptyDir"]["medium"] == "Memory"
    train = container(spec, "train")
    assert any(m["name"] == socket_mount["name"] and m["mountPath"] == "/run/cacheserver"
               for m in train["volumeMounts"])
    assert {"name": "SHARDCACHE_TARGET", "value": SOCKET_TARGET} in train["env"]
    cache_mount = next(m for m in server["volumeMounts"]
                       if m["mountPath"] == _flag(server["args"], "--data-dir"))
    cache = volumes[cache_mount["name"]]["emptyDir"]
    assert "sizeLimit" in cache
    for kind in ("requests", "limits"):
        assert "ephemeral-storage" in server["resources"][kind]


@pytest.mark.parametrize("path,kind", [(SIDECAR_JOB, "Job"), (DAEMONSET, "DaemonSet")],
                         ids=["sidecar", "daemonset"])
def test_the_daemon_runs_locked_down_and_has_longer_to_stop_than_it_drains(
        path: Path, kind: str) -> None:
    spec = load_one(path, kind)["spec"]["template"]["spec"]
    server = container(spec, "cacheserver")
    sc = server["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert server["resources"]["requests"] and server["resources"]["limits"]
    grace = float(_flag(server["args"], "--grace"))
    assert spec["terminationGracePeriodSeconds"] > grace
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["grpc"]["port"] == _probe_port(server)


def test_the_daemonset_keeps_caches_and_socket_on_host_paths_the_client_pod_mounts() -> None:
    spec = load_one(DAEMONSET, "DaemonSet")["spec"]["template"]["spec"]
    server = container(spec, "cacheserver")
    volumes = {v["name"]: v for v in spec["volumes"]}
    host = {m["mountPath"]: volumes[m["name"]]["hostPath"] for m in server["volumeMounts"]}
    assert host[_flag(server["args"], "--data-dir")]["type"] == "DirectoryOrCreate"
    client_spec = load_one(CLIENT_POD, "Pod")["spec"]
    client_volumes = {v["name"]: v for v in client_spec["volumes"]}
    [train] = client_spec["containers"]
    client_host = {m["mountPath"]: client_volumes[m["name"]]["hostPath"]["path"]
                   for m in train["volumeMounts"] if "hostPath" in client_volumes[m["name"]]}
    assert client_host == {"/run/cacheserver": host["/run/cacheserver"]["path"]}
    service = load_one(K8S / "daemonset" / "service.yaml", "Service")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert service["spec"]["selector"] == spec.get("nodeSelector", {}) | \
        load_one(DAEMONSET, "DaemonSet")["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("path,kind", [(SIDECAR_JOB, "Job"), (DAEMONSET, "DaemonSet")],
                         ids=["sidecar", "daemonset"])
def test_the_daemon_takes_the_store_from_an_optional_config_map_and_credentials_from_an_optional_secret(  # noqa: E501
        path: Path, kind: str) -> None:
    server = container(load_one(path, kind)["spec"]["template"]["spec"], "cacheserver")
    refs = {kind: ref for source in server["envFrom"] for kind, ref in source.items()}
    assert refs["configMapRef"] == {"name": "shardcache-store", "optional": True}
    assert refs["secretRef"] == {"name": "shardcache-store-credentials", "optional": True}


def test_the_store_config_map_holds_only_settings_the_daemon_knows() -> None:
    from cacheserver import config

    data = load_one(STORE_CONFIG, "ConfigMap")["data"]
    assert set(data) >= STORE_SETTINGS
    known = {s.env for s in config.SETTINGS}
    for key in data:  # serve refuses an unknown CACHESERVER_* variable
        assert key in known or not key.startswith(config.ENV_PREFIX), key
    assert data["CACHESERVER_STORE"] == ""  # no store until the operator names one


def _materialize_job() -> tuple[dict[str, Any], dict[str, Any]]:
    job = load_one(MATERIALIZE_JOB, "Job")
    return job, container(job["spec"]["template"]["spec"], "materialize")


def test_the_materialize_job_is_indexed_one_index_per_completion_and_retried_per_index() -> None:
    job, c = _materialize_job()
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    args = c["args"]
    assert args[0] == "materialize" and c["command"] == ["cacheserver"]
    assert spec["completions"] == spec["parallelism"] == int(_flag(args, "--indexes"))
    assert int(_flag(args, "--shards")) >= spec["completions"]
    assert _flag(args, "--index") == "$(JOB_COMPLETION_INDEX)"
    assert spec["backoffLimitPerIndex"] >= 1 and spec["maxFailedIndexes"] == 0
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # usage errors (2) and what a retry cannot cure (3) fail the index at once
    [fail] = [r for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailIndex"]
    assert fail["onExitCodes"] == {"containerName": "materialize", "operator": "In",
                                   "values": [2, 3]}
    # the store's settings are the DaemonSet's: same ConfigMap, same namespace
    namespace = yaml.safe_load((K8S / "daemonset" / "kustomization.yaml").read_text())
    assert job["metadata"]["namespace"] == namespace["namespace"]
    env = {e["name"]: e for e in c["env"]}
    store = load_one(STORE_CONFIG, "ConfigMap")
    for name in STORE_SETTINGS:
        ref = env[name]["valueFrom"]["configMapKeyRef"]
        assert ref["name"] == store["metadata"]["name"] and ref["key"] in store["data"]
        assert "optional" not in ref  # a Job without a store is a mistake: the pod waits
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[name]["valueFrom"]["secretKeyRef"] == {
            "name": "shardcache-store-credentials", "key": name, "optional": True}
    # every $(VAR) in args is defined (Kubernetes leaves an undefined one as it is)
    for var in re.findall(r"\$\((\w+)\)", " ".join(args)):
        assert var in env, var
    scratch = next(m for m in c["volumeMounts"] if m["name"] == "scratch")
    assert env["TMPDIR"]["value"] == scratch["mountPath"]


def _job_argv(values: dict[str, str]) -> list[str]:
    """The Job container's command as the kubelet runs it: $(VAR) expanded from values."""
    _, c = _materialize_job()
    expand = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in c["args"]]
    return [str(Path(sys.executable).parent / c["command"][0]), *expand]


def test_the_materialize_jobs_command_runs_as_one_index_and_says_when_the_store_is_unreachable(
        ) -> None:
    store = load_one(STORE_CONFIG, "ConfigMap")["data"]
    argv = _job_argv(store | {"JOB_COMPLETION_INDEX": "3",
                              "CACHESERVER_STORE": "s3://shardcache-test/caches",
                              "CACHESERVER_STORE_ENDPOINT": f"http://127.0.0.1:{_free_port()}"})
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_DEFAULT_REGION": store["AWS_DEFAULT_REGION"]}
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr  # retried by backoffLimitPerIndex
    assert "index 3: the object store cannot be reached" in result.stderr
    # with the shipped ConfigMap (no store named yet) it is a usage error: FailIndex
    result = subprocess.run(_job_argv(store | {"JOB_COMPLETION_INDEX": "3"}), env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "s3://BUCKET/PREFIX" in result.stderr, result.stderr


# --- (b) the cacheserver container, run for real -------------------------------------


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _probe_port(c: dict[str, Any]) -> int:
    return int(c["startupProbe"]["grpc"]["port"])


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PathMap:
    """The container's absolute paths, each mapped to a directory under one temp dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.prefixes: dict[str, Path] = {}

    def add(self, container_path: str, key: str) -> None:
        local = self.root / key
        local.mkdir(parents=True, exist_ok=True)
        self.prefixes[container_path.rstrip("/")] = local

    def __call__(self, text: str) -> str:
        """One pass, longest prefix first, so a mapped path is never mapped again."""
        if not self.prefixes:
            return text
        alternatives = "|".join(re.escape(p) for p in sorted(self.prefixes, key=len,
                                                               reverse=True))
        return re.sub(rf"({alternatives})(?=/|$)",
                      lambda m: str(self.prefixes[m.group(1)]), text)


@dataclass
class Deployment:
    """What a pod would run: the daemon's argv and env, the probes, the client's target."""

    argv: list[str]
    env: dict[str, str]
    probe_port: int
    probes: dict[str, dict[str, Any]]
    grace_period_s: float
    client_target: str
    root: Path
    client_env: dict[str, str]


def _config_maps() -> dict[str, dict[str, str]]:
    """The ConfigMaps deploy/k8s ships, by name: their data."""
    return {d["metadata"]["name"]: d.get("data", {}) for p in k8s_yaml_files()
            for d in load_all(p) if d["kind"] == "ConfigMap"}


def _env_from(c: dict[str, Any]) -> dict[str, str]:
    """What envFrom gives the container: a shipped ConfigMap's data; a Secret, never shipped,
    nothing (so both must be optional: the pod starts without them)."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        [(kind, ref)] = source.items()
        shipped = _config_maps().get(ref["name"]) if kind == "configMapRef" else None
        if shipped is None:
            assert ref.get("optional") is True, f"{ref['name']} is not shipped: make it optional"
        else:
            env |= shipped
    return env


def _volume_key(volume: dict[str, Any]) -> str:
    """Pods sharing a hostPath share a directory; an emptyDir is the pod's own."""
    if "hostPath" in volume:
        return "host" + volume["hostPath"]["path"].replace("/", "_")
    return "vol_" + volume["name"]


def _deployment(server_spec: dict[str, Any], client_spec: dict[str, Any],
                client_name: str, root: Path) -> Deployment:
    server = container(server_spec, "cacheserver")
    paths = PathMap(root)
    for spec, c in ((server_spec, server), (client_spec, container(client_spec, client_name))):
        volumes = {v["name"]: v for v in spec["volumes"]}
        for mount in c["volumeMounts"]:
            # one directory per emptyDir of the pod, or per hostPath of the node
            paths.add(mount["mountPath"], _volume_key(volumes[mount["name"]]))
    command = [*server["command"], *server["args"]]
    argv = [paths(a) for a in command]
    # the image's `cacheserver` is the console script this venv installed; not mapped,
    # since the checkout itself may live under a path the pod mounts (/tmp, say)
    argv[0] = str(Path(sys.executable).parent / command[0])
    probe_port = _probe_port(server)
    if not _port_is_free(probe_port):  # only if it would clash with something on this machine
        new = _free_port()
        argv = [re.sub(rf":{probe_port}$", f":{new}", a) for a in argv]
        probe_port = new
    env = {k: paths(v) for k, v in _env_from(server).items()}
    env |= {e["name"]: paths(e["value"]) for e in server.get("env", [])}
    client_env = {e["name"]: e["value"] for e in container(client_spec, client_name)["env"]}
    return Deployment(
        argv=argv, env=env, probe_port=probe_port,
        probes={k: server[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")},
        grace_period_s=float(server_spec["terminationGracePeriodSeconds"]),
        client_target=paths(client_env["SHARDCACHE_TARGET"]), root=root,
        client_env={k: paths(v) for k, v in client_env.items()})


@pytest.fixture
def scratch() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="dep-", dir="/tmp"))  # short: sun_path is 108 bytes
    yield root
    shutil.rmtree(root, ignore_errors=True)


def sidecar_deployment(root: Path) -> Deployment:
    spec = load_one(SIDECAR_JOB, "Job")["spec"]["template"]["spec"]
    return _deployment(spec, spec, "train", root)


def daemonset_deployment(root: Path) -> Deployment:
    spec = load_one(DAEMONSET, "DaemonSet")["spec"]["template"]["spec"]
    return _deployment(spec, load_one(CLIENT_POD, "Pod")["spec"], "train", root)


def _kubelet_probe(port: int, probe: dict[str, Any], deadline_s: float) -> None:
    """What the kubelet's gRPC probe does: Check(service) on the pod IP and port."""
    request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
    timeout = float(probe.get("timeoutSeconds", 1))
    deadline = time.monotonic() + deadline_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if stub.Check(request, timeout=timeout).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"probe {probe} did not pass in {deadline_s}s"
            time.sleep(0.1)


def _write_cache(target: str, name: str, chunks: int) -> int:
    """A cache of `chunks` x 64 KiB elements over the raw gRPC API (no TensorFlow)."""
    chunk = pb.WriteChunk(lengths=(b"\x00\x00\x01\x00" * 8), data=b"\x00" * (8 << 16))

    def requests() -> Iterator[pb.WriteCacheRequest]:
        yield pb.WriteCacheRequest(begin=pb.WriteBegin(name=name, fingerprint="f",
                                                       layout_json='{"format": 1, "leaves": []}'))
        for _ in range(chunks):
            yield pb.WriteCacheRequest(chunk=chunk)
        yield pb.WriteCacheRequest(finish=pb.WriteFinish(num_elements=8 * chunks))

    with grpc.insecure_channel(target) as ch:
        list(pb_grpc.CacheServiceStub(ch).WriteCache(requests()))
    return 8 * chunks * 65536


@pytest.mark.parametrize("make", [sidecar_deployment, daemonset_deployment],
                         ids=["sidecar-job", "daemonset"])
def test_the_manifest_daemon_serves_probes_and_the_client_then_drains_on_sigterm(
        make, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from client import CacheClient

    dep = make(scratch)
    log_path = scratch / "daemon.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(dep.argv, env={**os.environ, **dep.env},
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        startup = dep.probes["startupProbe"]
        _kubelet_probe(dep.probe_port, startup,
                       float(startup["periodSeconds"]) * float(startup["failureThreshold"]))
        _kubelet_probe(dep.probe_port, dep.probes["readinessProbe"], 5)
        _kubelet_probe(dep.probe_port, dep.probes["livenessProbe"], 5)

        assert dep.client_target.startswith(f"unix://{scratch}/")
        size = _write_cache(dep.client_target, "epoch-1", chunks=16)
        monkeypatch.setenv("SHARDCACHE_TARGET", dep.client_target)
        with CacheClient() as cc:  # the target from the training container's env
            [info] = cc.list()
            assert (info.name, info.state, info.num_elements) == ("epoch-1", "READY", 128)

        with grpc.insecure_channel(dep.client_target) as ch:
            stream = pb_grpc.CacheServiceStub(ch).ReadShard(
                pb.ReadShardRequest(name="epoch-1", shard=0, chunk_bytes=65536))
            received = len(next(stream).data)  # in flight when SIGTERM arrives
            stopped_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc: dict[str, int] = {}
            waiter = threading.Thread(
                target=lambda: rc.setdefault("rc", proc.wait(dep.grace_period_s)))
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


# --- (c) the systemd unit ------------------------------------------------------------


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
    result = subprocess.run(["systemd-analyze", "verify", str(unit_path)],
                            capture_output=True, text=True, timeout=60, cwd=unit_path.parent)
    output = result.stdout + result.stderr
    return [line for line in output.splitlines() if unit_path.name in line
            or str(unit_path) in line] + ([f"exit status {result.returncode}: {output}"]
                                          if result.returncode else [])


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
    assert float(unit["TimeoutStopSec"][0]) > float(_flag(argv, "--grace"))
    assert _flag(argv, "--data-dir") == f"/var/lib/{unit['StateDirectory'][0]}"
    assert SOCKET_TARGET.replace("unix://", "").startswith(
        f"/run/{unit['RuntimeDirectory'][0]}/")
    assert SOCKET_TARGET in argv and "127.0.0.1:50051" in argv
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
    if not _port_is_free(50051):
        argv = [a.replace(":50051", f":{_free_port()}") for a in argv]
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(scratch / "notify"))
    notify.settimeout(30)
    env = {**os.environ, **_env_file(UNIT_ENV), "NOTIFY_SOCKET": str(scratch / "notify")}
    proc = subprocess.Popen(argv, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert notify.recv(4096) == b"READY=1"
        with grpc.insecure_channel(paths(SOCKET_TARGET)) as ch:  # READY=1 means serving
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                         timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert notify.recv(4096) == b"STOPPING=1"
        assert proc.wait(30) == 0
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


# --- (d) the container image ---------------------------------------------------------


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
        assert CONTAINERFILE.read_text().count(f"\n{instruction} [") == 1, \
            f"{instruction} must be one exec-form JSON array (no shell)"
    command = [*image["ENTRYPOINT"], *image["CMD"]]
    assert command[:2] == ["cacheserver", "serve"]
    for path, kind in ((SIDECAR_JOB, "Job"), (DAEMONSET, "DaemonSet")):
        server = container(load_one(path, kind)["spec"]["template"]["spec"], "cacheserver")
        assert [*server["command"], *server["args"]] == command, path
        assert str(_probe_port(server)) in image["EXPOSE"]
    assert image["FROM"] == ["python:3.11-slim"]
    assert _flag(command, "--data-dir") in image["VOLUME"]
    user = image["USER"][0].split(":")[0]
    assert user not in ("root", "0")


def test_the_sidecar_trainer_reads_the_daemons_files_through_its_read_only_mount(
        scratch: Path) -> None:
    from client import CacheClient
    from client.read.direct import LOCAL_DATA_DIR_ENV, DirectReads, resolve_local_data_dir

    spec = load_one(SIDECAR_JOB, "Job")["spec"]["template"]["spec"]
    server, train = container(spec, "cacheserver"), container(spec, "train")
    local = {e["name"]: e["value"] for e in train["env"]}[LOCAL_DATA_DIR_ENV]
    [mount] = [m for m in train["volumeMounts"] if m["mountPath"] == local]
    [served] = [m for m in server["volumeMounts"]
                if m["mountPath"] == _flag(server["args"], "--data-dir")]
    assert mount["name"] == served["name"] and mount["readOnly"] is True

    dep = sidecar_deployment(scratch)  # both mounts map to one directory, as in the pod
    # the console script would import the installed package; serve this checkout's code
    env = {**os.environ, **dep.env,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(scratch / "daemon.log", "wb") as log:
        proc = subprocess.Popen(dep.argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _kubelet_probe(dep.probe_port, dep.probes["startupProbe"], 60)
        _write_cache(dep.client_target, "direct", chunks=2)
        local_dir = resolve_local_data_dir(dep.client_env[LOCAL_DATA_DIR_ENV])
        with CacheClient(dep.client_target, local_data_dir=local_dir) as cc:
            reads = DirectReads(cc._transport, True, local_dir)
            lease, counted = reads.lease(cc._get("direct"))
            assert lease is not None and counted
            assert all(str(p).startswith(str(local_dir)) for p in lease.paths)
            lease.close()
    finally:
        proc.kill()
        proc.wait(30)
