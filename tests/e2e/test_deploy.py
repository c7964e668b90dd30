"""deploy/: the manifests, the unit and the image run the daemon the way the tests do.

Kubernetes, systemd and a container runtime are not needed: the manifests are
validated against the Kubernetes API schemas, and the cacheserver container's
own command, args and env run as a real process with the container's absolute
paths mapped into a temp dir, probed over gRPC health the way the kubelet does,
used by a real client through the socket the training container is told about,
then stopped with SIGTERM as the kubelet (or systemd) stops it. The Grafana
dashboard's queries are parsed and checked against what a real daemon exports.
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
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from daemon import Daemon
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from client.wire.v1 import cache_service_pb2 as pb
from client.wire.v1 import cache_service_pb2_grpc as pb_grpc

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SIDECAR_JOB = K8S / "sidecar" / "job.yaml"
DAEMONSET = K8S / "daemonset" / "daemonset.yaml"
CLIENT_POD = K8S / "daemonset" / "client-pod.yaml"
FLEET_SERVICE = K8S / "daemonset" / "fleet-service.yaml"
DASHBOARD = DEPLOY / "grafana" / "shardcache.json"
UNIT = DEPLOY / "systemd" / "cacheserver.service"
UNIT_ENV = DEPLOY / "systemd" / "cacheserver.env"
STORE_CONFIG = K8S / "daemonset" / "store.yaml"
MATERIALIZE_JOB = K8S / "materialize" / "job.yaml"
STORE_SETTINGS = {"CACHESERVER_STORE", "CACHESERVER_STORE_ENDPOINT"}
CONTAINERFILE = DEPLOY / "container" / "Containerfile"
#: the oldest Kubernetes the manifests must validate against (native sidecars: 1.29+)
K8S_VERSION = "1.31.0"
SOCKET_TARGET = "unix:///run/cacheserver/cacheserver.sock"
#: where a pod's own IP is, when the tests run its container as a local process
POD_IP = "127.0.0.1"


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


def _named_port(c: dict[str, Any], port: int | str) -> int:
    """A Service's targetPort as a number: itself, or the container port of that name."""
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return int(number)


def test_the_fleet_service_is_headless_over_every_ready_daemon_and_the_client_pod_reads_it(
        ) -> None:
    from client._fleet import parse_targets

    daemonset = load_one(DAEMONSET, "DaemonSet")
    server = container(daemonset["spec"]["template"]["spec"], "cacheserver")
    service = load_one(FLEET_SERVICE, "Service")
    spec = service["spec"]
    # headless: the name resolves to the pods' own IPs, one per node, not a proxy's
    assert spec["clusterIP"] == "None"
    assert spec.get("publishNotReadyAddresses", False) is False  # draining pods drop out
    assert "readinessProbe" in server
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"] == daemonset["spec"]["selector"]["matchLabels"]
    assert spec["selector"].items() <= labels.items()
    [port] = spec["ports"]
    # no proxy translates ports: clients connect to the pods' port itself
    assert port["port"] == _named_port(server, port["targetPort"]) == _probe_port(server)
    assert port["protocol"] == "TCP" and port["appProtocol"] == "grpc"
    # and the daemon listens there on every address of the pod, its pod IP included
    listens = [a for i, a in enumerate(server["args"]) if i and server["args"][i - 1] == "--listen"]
    assert f"0.0.0.0:{port['port']}" in listens
    namespace = yaml.safe_load((K8S / "daemonset" / "kustomization.yaml").read_text())["namespace"]
    [train] = load_one(CLIENT_POD, "Pod")["spec"]["containers"]
    env = {e["name"]: e["value"] for e in train["env"]}
    fleet = f"dns:///{service['metadata']['name']}.{namespace}.svc.cluster.local:{port['port']}"
    assert parse_targets(env["SHARDCACHE_TARGETS"]) == [fleet]
    # the node's own daemon stays at hand: the CLI's target, and CacheClient()'s without a store
    assert env["SHARDCACHE_TARGET"] == SOCKET_TARGET


def test_the_sidecar_trainer_names_its_own_daemon_not_a_fleet() -> None:
    train = container(load_one(SIDECAR_JOB, "Job")["spec"]["template"]["spec"], "train")
    names = {e["name"] for e in train["env"]}
    assert "SHARDCACHE_TARGET" in names and "SHARDCACHE_TARGETS" not in names


def test_the_daemonset_serves_metrics_on_its_pod_ip_where_prometheus_is_told_to_scrape(
        ) -> None:
    template = load_one(DAEMONSET, "DaemonSet")["spec"]["template"]
    server = container(template["spec"], "cacheserver")
    env = {e["name"]: e for e in server["env"]}
    pod_ip = re.fullmatch(r"\$\((\w+)\):(\d+)", env["CACHESERVER_METRICS_LISTEN"]["value"])
    assert pod_ip, env["CACHESERVER_METRICS_LISTEN"]
    variable, port = pod_ip.groups()
    assert env[variable]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # declared before use, or Kubernetes leaves $(POD_IP) as it is
    assert list(env).index(variable) < list(env).index("CACHESERVER_METRICS_LISTEN")
    assert _named_port(server, "metrics") == int(port)
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == port


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


def test_the_store_config_map_has_each_fleet_member_pull_only_the_shards_read_from_it() -> None:
    from cacheserver import config

    data = load_one(STORE_CONFIG, "ConfigMap")["data"]
    values, sources = config.resolve({"data_dir": Path("/var/lib/shardcache")}, None,
                                     environ=data)
    assert values["store_pull"] == "on-read"
    assert sources["store_pull"] == "environment CACHESERVER_STORE_PULL"


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
    metrics_url: str | None


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


def _env_value(entry: dict[str, Any], defined: dict[str, str]) -> str:
    """An env entry's value as the kubelet gives it: the pod IP of the one downward API
    field the manifests use, $(VAR) expanded from the variables defined before it."""
    if "valueFrom" in entry:
        assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}, entry
        return POD_IP
    return re.sub(r"\$\((\w+)\)", lambda m: defined.get(m.group(1), m.group(0)),
                  entry["value"])


def _local_port(address: str) -> str:
    """HOST:PORT with the port swapped for a free one if something here holds it."""
    host, _, port = address.rpartition(":")
    return address if _port_is_free(int(port)) else f"{host}:{_free_port()}"


def _fleet_here(targets: str, pod_port: int, local_port: int) -> str:
    """The client's fleet targets with each dns:/// name (the headless Service) resolving
    to the one pod here: its IP, at the port the daemon listens on."""
    here = []
    for target in targets.split(","):
        if target.startswith("dns:///"):
            assert target.endswith(f":{pod_port}"), f"{target} is not the daemon's port"
            target = f"dns:///{POD_IP}:{local_port}"
        here.append(target)
    return ",".join(here)


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
    pod_port = probe_port = _probe_port(server)
    if not _port_is_free(probe_port):  # only if it would clash with something on this machine
        new = _free_port()
        argv = [re.sub(rf":{probe_port}$", f":{new}", a) for a in argv]
        probe_port = new
    env = {k: paths(v) for k, v in _env_from(server).items()}
    for entry in server.get("env", []):
        env[entry["name"]] = paths(_env_value(entry, env))
    metrics_url = None
    if "CACHESERVER_METRICS_LISTEN" in env:
        env["CACHESERVER_METRICS_LISTEN"] = _local_port(env["CACHESERVER_METRICS_LISTEN"])
        metrics_url = f"http://{env['CACHESERVER_METRICS_LISTEN']}/metrics"
    client_env = {e["name"]: paths(e["value"])
                  for e in container(client_spec, client_name)["env"]}
    if "SHARDCACHE_TARGETS" in client_env:
        client_env["SHARDCACHE_TARGETS"] = _fleet_here(client_env["SHARDCACHE_TARGETS"],
                                                       pod_port, probe_port)
    return Deployment(
        argv=argv, env=env, probe_port=probe_port,
        probes={k: server[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")},
        grace_period_s=float(server_spec["terminationGracePeriodSeconds"]),
        client_target=client_env["SHARDCACHE_TARGET"], root=root,
        client_env=client_env, metrics_url=metrics_url)


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


def _exposition(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(_exposition(url))
            for sample in family.samples}


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


# --- (e) the Grafana dashboard -------------------------------------------------------

#: labels Prometheus adds to every series it scrapes
TARGET_LABELS = frozenset({"instance", "job"})
#: PromQL words that are neither metrics nor functions
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset"})
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_MATCH_OPS = frozenset({"=", "!=", "=~", "!~"})
_CLOSING = {"(": ")", "{": "}", "[": "]"}
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<variable>\$\{\w+(?::\w+)?\}|\$\w+)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?)
  | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,])
  | (?P<open>[({[])
  | (?P<close>[)}\]])
""", re.VERBOSE)


@dataclass
class Selector:
    """One instant or range vector selector of a PromQL expression."""

    metric: str
    matchers: dict[str, tuple[str, str]]  # label: (operator, value)


def _tokens(expr: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise ValueError(f"cannot read {expr[pos:]!r} in {expr!r}")
        if match.lastgroup != "space":
            tokens.append((str(match.lastgroup), match.group()))
        pos = match.end()
    return tokens


def parse_promql(expr: str) -> tuple[list[Selector], set[str]]:
    """The selectors of expr and the labels its by/without/on/ignoring clauses name.

    Enough of PromQL for a dashboard's queries: brackets must balance, every
    selector names its metric, and a matcher is LABEL OP "STRING"; Grafana's
    $variables stand where PromQL takes a duration or a string."""
    tokens = _tokens(expr)
    selectors: list[Selector] = []
    grouping: set[str] = set()
    opened: list[str] = []
    i = 0
    try:
        while i < len(tokens):
            kind, text = tokens[i]
            following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
            if kind == "open":
                if text == "{":
                    raise ValueError(f"a selector without a metric name in {expr!r}")
                opened.append(text)
            elif kind == "close":
                if not opened or _CLOSING[opened.pop()] != text:
                    raise ValueError(f"unbalanced {text!r} in {expr!r}")
            elif kind == "name" and text in _GROUPING and following == "(":
                i += 2
                while tokens[i][1] != ")":
                    label, sep = tokens[i], tokens[i + 1][1]
                    if label[0] != "name" or sep not in (",", ")"):
                        raise ValueError(f"bad label list at {label[1]!r} in {expr!r}")
                    grouping.add(label[1])
                    i += 2 if sep == "," else 1
            elif (kind == "name" and text not in _KEYWORDS | _GROUPING
                  and following not in ("(", "by", "without")):  # not sum(...), sum by (...)
                matchers: dict[str, tuple[str, str]] = {}
                if following == "{":
                    i += 2
                    while tokens[i][1] != "}":
                        (lkind, label), (_, op), (vkind, value) = tokens[i:i + 3]
                        if lkind != "name" or op not in _MATCH_OPS or vkind != "string":
                            raise ValueError(f"bad matcher {label}{op}{value} in {expr!r}")
                        matchers[label] = (op, value[1:-1])
                        i += 3
                        if tokens[i][1] == ",":
                            i += 1
                selectors.append(Selector(text, matchers))
            i += 1
    except IndexError as exc:
        raise ValueError(f"{expr!r} ends in the middle of a selector") from exc
    if opened:
        raise ValueError(f"{opened[-1]!r} never closed in {expr!r}")
    return selectors, grouping


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows (collapsed rows hold theirs) included."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, PromQL, the panel's or variable's JSON) of every query the dashboard runs."""
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"], panel
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            # Grafana's label_values(METRIC, LABEL) is the series METRIC{LABEL!=""}
            metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)",
                                         variable["definition"]).groups()
            yield f"variable {variable['name']!r}", f'{metric}{{{label}!=""}}', variable


def dashboard_problems(dashboard: dict[str, Any], exported: dict[str, set[str]]) -> list[str]:
    """What in the dashboard's queries the daemon does not export (exported: sample name
    to its label names), or does not parse, or ignores the $instance variable."""
    problems = []
    for where, expr, _ in _queries(dashboard):
        try:
            selectors, grouping = parse_promql(expr)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not selectors:
            problems.append(f"{where}: selects no metric")
        labels = set(TARGET_LABELS)
        for s in selectors:
            if not s.metric.startswith("shardcache_") or s.metric not in exported:
                problems.append(f"{where}: {s.metric} is not a metric the daemon exports")
                continue
            labels |= exported[s.metric]
            unknown = set(s.matchers) - exported[s.metric] - TARGET_LABELS
            if unknown:
                problems.append(f"{where}: {s.metric} has no label {sorted(unknown)}")
            if where.startswith("panel") and s.matchers.get("instance") != ("=~", "$instance"):
                problems.append(f"{where}: {s.metric} ignores $instance")
        for label in sorted(grouping - labels):
            problems.append(f"{where}: no series of it has the label {label!r}")
    return problems


def _exported(url: str) -> dict[str, set[str]]:
    """The exposition's sample names (histograms' _bucket/_count/_sum, counters' _total)
    and the label names each carries."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(_exposition(url)):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


@pytest.fixture(scope="module")
def exported() -> Iterator[dict[str, set[str]]]:
    """What a real daemon exports once it has written, read and refused something."""
    tf = pytest.importorskip("tensorflow")
    from client import CacheClient, CacheNotFoundError

    url = f"http://127.0.0.1:{_free_port()}/metrics"
    d = Daemon(extra_args=("--metrics-listen", url.split("/")[2])).start()
    try:
        with CacheClient(d.unix_target) as cc:
            ds = cc.cache(tf.data.Dataset.range(100), name="dashboard", direct=False)
            for _ in range(2):  # the write epoch, then a read epoch
                assert [int(x) for x in ds] == list(range(100))
            with pytest.raises(CacheNotFoundError):
                cc.info("absent")  # an RPC error: shardcache_rpc_errors_total gets a series
        # this daemon's metrics, after that: the read epoch went over gRPC
        assert scrape(url)[("shardcache_read_elements_total", ())] == 100
        yield _exported(url)
    finally:
        d.close()


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def test_every_dashboard_query_parses_and_selects_metrics_and_labels_the_daemon_exports(
        exported: dict[str, set[str]]) -> None:
    dashboard = _dashboard()
    assert dashboard_problems(dashboard, exported) == []
    selected = {s.metric for _, expr, _ in _queries(dashboard) for s in parse_promql(expr)[0]}
    # the panels the dashboard promises, each on the series it needs
    for metric in ("shardcache_read_bytes_total", "shardcache_read_elements_total",
                   "shardcache_cache_hits_total", "shardcache_cache_misses_total",
                   "shardcache_rpc_duration_seconds_bucket", "shardcache_rpc_errors_total",
                   "shardcache_disk_bytes", "shardcache_capacity_bytes",
                   "shardcache_store_published_bytes_total",
                   "shardcache_store_pulled_bytes_total", "shardcache_store_errors_total",
                   "shardcache_store_unpublished_caches"):
        assert metric in selected, metric


def test_the_dashboard_check_catches_a_misspelled_metric_a_wrong_label_and_a_broken_query(
        exported: dict[str, set[str]]) -> None:
    text = DASHBOARD.read_text()
    misspelled = json.loads(text.replace("shardcache_read_bytes_total",
                                         "shardcache_read_byte_total", 1))
    [problem] = dashboard_problems(misspelled, exported)
    assert "shardcache_read_byte_total is not a metric the daemon exports" in problem
    # a counter without its _total: the family's name, but no sample of that name
    bare = json.loads(text.replace("shardcache_store_errors_total", "shardcache_store_errors"))
    assert any("shardcache_store_errors is not" in p for p in dashboard_problems(bare, exported))
    wrong_label = json.loads(text.replace("sum by (reason)", "sum by (cause)"))
    [problem] = dashboard_problems(wrong_label, exported)
    assert "no series of it has the label 'cause'" in problem
    broken = json.loads(text.replace('"expr": "shardcache_store_unpublished_caches',
                                     '"expr": "(shardcache_store_unpublished_caches'))
    [problem] = dashboard_problems(broken, exported)
    assert problem.startswith("panel 'Unpublished caches' A:") and "never closed" in problem
    unfiltered = json.loads(text.replace('shardcache_disk_free_bytes{instance=~\\"$instance\\"}',
                                         "shardcache_disk_free_bytes"))
    [problem] = dashboard_problems(unfiltered, exported)
    assert "shardcache_disk_free_bytes ignores $instance" in problem


def test_parse_promql_finds_selectors_matchers_and_grouping_labels() -> None:
    selectors, grouping = parse_promql(
        'histogram_quantile(0.99, sum by (method, le) (rate(a_b_bucket{x=~"$v", y!="z"}'
        '[$__rate_interval]))) / on (instance) group_left c > 0 and bool d offset 5m')
    assert [(s.metric, s.matchers) for s in selectors] == [
        ("a_b_bucket", {"x": ("=~", "$v"), "y": ("!=", "z")}), ("c", {}), ("d", {})]
    assert grouping == {"method", "le", "instance"}
    for bad in ('sum(rate(x[5m])', 'x{a="b"', '{a="b"}', 'x{a}', "sum by (a b) (x)"):
        with pytest.raises(ValueError):
            parse_promql(bad)


def test_every_dashboard_panel_has_a_title_a_query_and_a_place_of_its_own() -> None:
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["multi"] and variables["instance"]["includeAll"]
    panels = list(_panels(dashboard["panels"]))
    assert len({p["id"] for p in panels}) == len(panels)
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel.get("title"), panel
        grid = panel["gridPos"]
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert grid["x"] + grid["w"] <= 24 and not cells & taken, panel["title"]
        taken |= cells
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in [panel, *panel["targets"]]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["expr"].strip() for t in panel["targets"])
