"""deploy/ as the tests read it: its files, their YAML objects, and a pod's cacheserver
container turned into a local process (argv, env, its absolute paths mapped into a temp dir)."""

from __future__ import annotations

import re
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from daemon import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.wire.v1 import cache_service_pb2 as pb
from client.wire.v1 import cache_service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
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


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def grpc_probe_port(c: dict[str, Any]) -> int:
    return int(c["startupProbe"]["grpc"]["port"])


def data_listen_port(args: list[str]) -> int:
    """The port of --data-listen HOST:PORT in args."""
    return int(flag(args, "--data-listen").rpartition(":")[2])


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


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
        alternatives = "|".join(re.escape(p) for p in sorted(self.prefixes, key=len, reverse=True))
        return re.sub(rf"({alternatives})(?=/|$)", lambda m: str(self.prefixes[m.group(1)]), text)


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
    data_port: int


def _config_maps() -> dict[str, dict[str, str]]:
    """The ConfigMaps deploy/k8s ships, by name: their data."""
    return {
        d["metadata"]["name"]: d.get("data", {})
        for p in k8s_yaml_files()
        for d in load_all(p)
        if d["kind"] == "ConfigMap"
    }


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


#: Secrets a test creates, by name: their data (the cluster's, never shipped).
Secrets = dict[str, dict[str, str]]


def _env_value(
    entry: dict[str, Any], defined: dict[str, str], secrets: Secrets | None = None
) -> str | None:
    """An env entry's value as the kubelet gives it: the pod IP of the one downward API
    field the manifests use, $(VAR) expanded from the variables defined before it; from a
    Secret, its key if the test created it, else None (never shipped, so it must be
    optional: the pod starts without it)."""
    if "secretKeyRef" in entry.get("valueFrom", {}):
        ref = entry["valueFrom"]["secretKeyRef"]
        assert ref.get("optional") is True, f"{ref['name']} is not shipped: make it optional"
        return (secrets or {}).get(ref["name"], {}).get(ref["key"])
    if "valueFrom" in entry:
        assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}, entry
        return POD_IP
    return re.sub(r"\$\((\w+)\)", lambda m: defined.get(m.group(1), m.group(0)), entry["value"])


def _local_port(address: str) -> str:
    """HOST:PORT with the port swapped for a free one if something here holds it."""
    host, _, port = address.rpartition(":")
    return address if port_is_free(int(port)) else f"{host}:{free_port()}"


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


def _deployment(
    server_spec: dict[str, Any],
    client_spec: dict[str, Any],
    client_name: str,
    root: Path,
    secrets: Secrets | None = None,
) -> Deployment:
    server = container(server_spec, "cacheserver")
    paths = PathMap(root)
    for spec, c in ((server_spec, server), (client_spec, container(client_spec, client_name))):
        volumes = {v["name"]: v for v in spec["volumes"]}
        for mount in c["volumeMounts"]:
            # one directory per emptyDir of the pod, or per hostPath of the node
            volume = volumes[mount["name"]]
            paths.add(mount["mountPath"], _volume_key(volume))
            # a Secret's volume holds a file per key of the Secret, when the test made it
            name = volume.get("secret", {}).get("secretName")
            for key, value in (secrets or {}).get(name, {}).items():
                (paths.prefixes[mount["mountPath"].rstrip("/")] / key).write_text(value)
    command = [*server["command"], *server["args"]]
    argv = [paths(a) for a in command]
    # the image's `cacheserver` is the console script this venv installed; not mapped,
    # since the checkout itself may live under a path the pod mounts (/tmp, say)
    argv[0] = str(Path(sys.executable).parent / command[0])
    pod_port = probe_port = grpc_probe_port(server)
    if not port_is_free(probe_port):  # only if it would clash with something on this machine
        new = free_port()
        argv = [re.sub(rf":{probe_port}$", f":{new}", a) for a in argv]
        probe_port = new
    data_port = data_listen_port(command)
    if not port_is_free(data_port):
        new = free_port()
        argv = [re.sub(rf":{data_port}$", f":{new}", a) for a in argv]
        data_port = new
    env = {k: paths(v) for k, v in _env_from(server).items()}
    for entry in server.get("env", []):
        if (value := _env_value(entry, env, secrets)) is not None:
            env[entry["name"]] = paths(value)
    metrics_url = None
    if "CACHESERVER_METRICS_LISTEN" in env:
        env["CACHESERVER_METRICS_LISTEN"] = _local_port(env["CACHESERVER_METRICS_LISTEN"])
        metrics_url = f"http://{env['CACHESERVER_METRICS_LISTEN']}/metrics"
    client_env = {
        e["name"]: paths(value)
        for e in container(client_spec, client_name)["env"]
        if (value := _env_value(e, {}, secrets)) is not None
    }
    if "SHARDCACHE_TARGETS" in client_env:
        client_env["SHARDCACHE_TARGETS"] = _fleet_here(
            client_env["SHARDCACHE_TARGETS"], pod_port, probe_port
        )
    return Deployment(
        argv=argv,
        env=env,
        probe_port=probe_port,
        probes={k: server[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")},
        grace_period_s=float(server_spec["terminationGracePeriodSeconds"]),
        client_target=client_env["SHARDCACHE_TARGET"],
        root=root,
        client_env=client_env,
        metrics_url=metrics_url,
        data_port=data_port,
    )


def sidecar_deployment(root: Path) -> Deployment:
    spec = load_one(SIDECAR_JOB, "Job")["spec"]["template"]["spec"]
    return _deployment(spec, spec, "train", root)


def daemonset_deployment(root: Path, secrets: Secrets | None = None) -> Deployment:
    spec = load_one(DAEMONSET, "DaemonSet")["spec"]["template"]["spec"]
    return _deployment(spec, load_one(CLIENT_POD, "Pod")["spec"], "train", root, secrets)


def kubelet_probe(port: int, probe: dict[str, Any], deadline_s: float) -> None:
    """What the kubelet's gRPC probe does: Check(service) on the pod IP and port."""
    request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
    timeout = float(probe.get("timeoutSeconds", 1))
    deadline = time.monotonic() + deadline_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if (
                    stub.Check(request, timeout=timeout).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"probe {probe} did not pass in {deadline_s}s"
            time.sleep(0.1)


def write_zero_cache(target: str, name: str, chunks: int) -> int:
    """A cache of `chunks` x 64 KiB elements over the raw gRPC API (no TensorFlow)."""
    chunk = pb.WriteChunk(lengths=(b"\x00\x00\x01\x00" * 8), data=b"\x00" * (8 << 16))

    def requests() -> Iterator[pb.WriteCacheRequest]:
        yield pb.WriteCacheRequest(
            begin=pb.WriteBegin(
                name=name, fingerprint="f", layout_json='{"format": 1, "leaves": []}'
            )
        )
        for _ in range(chunks):
            yield pb.WriteCacheRequest(chunk=chunk)
        yield pb.WriteCacheRequest(finish=pb.WriteFinish(num_elements=8 * chunks))

    with grpc.insecure_channel(target) as ch:
        list(pb_grpc.CacheServiceStub(ch).WriteCache(requests()))
    return 8 * chunks * 65536
