"""deploy/k8s: every manifest is a valid Kubernetes object, and the sidecar Job, the DaemonSet,
its Services and the materialize Job fit together (no cluster needed: the API schemas)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from daemon import free_port
from deploy_tree import (
    CLIENT_POD,
    DAEMONSET,
    FLEET_SERVICE,
    K8S,
    K8S_VERSION,
    MATERIALIZE_JOB,
    ROOT,
    SIDECAR_JOB,
    SOCKET_TARGET,
    STORE_CONFIG,
    STORE_SETTINGS,
    container,
    data_listen_port,
    flag,
    grpc_probe_port,
    k8s_yaml_files,
    load_all,
    load_one,
)


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
    assert (
        kustomization["namespace"]
        == load_one(K8S / "daemonset" / "namespace.yaml", "Namespace")["metadata"]["name"]
    )


def test_the_sidecar_is_a_native_sidecar_with_its_socket_and_cache_where_the_trainer_looks() -> (
    None
):
    spec = load_one(SIDECAR_JOB, "Job")["spec"]["template"]["spec"]
    server = container(spec, "cacheserver")
    assert server in spec["initContainers"] and server["restartPolicy"] == "Always"
    volumes = {v["name"]: v for v in spec["volumes"]}
    socket_mount = next(m for m in server["volumeMounts"] if m["mountPath"] == "/run/cacheserver")
    assert volumes[socket_mount["name"]]["emptyDir"]["medium"] == "Memory"
    train = container(spec, "train")
    assert any(
        m["name"] == socket_mount["name"] and m["mountPath"] == "/run/cacheserver"
        for m in train["volumeMounts"]
    )
    assert {"name": "SHARDCACHE_TARGET", "value": SOCKET_TARGET} in train["env"]
    cache_mount = next(
        m for m in server["volumeMounts"] if m["mountPath"] == flag(server["args"], "--data-dir")
    )
    cache = volumes[cache_mount["name"]]["emptyDir"]
    assert "sizeLimit" in cache
    for kind in ("requests", "limits"):
        assert "ephemeral-storage" in server["resources"][kind]


@pytest.mark.parametrize(
    "path,kind", [(SIDECAR_JOB, "Job"), (DAEMONSET, "DaemonSet")], ids=["sidecar", "daemonset"]
)
def test_the_daemon_runs_locked_down_and_has_longer_to_stop_than_it_drains(
    path: Path, kind: str
) -> None:
    spec = load_one(path, kind)["spec"]["template"]["spec"]
    server = container(spec, "cacheserver")
    sc = server["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert server["resources"]["requests"] and server["resources"]["limits"]
    grace = float(flag(server["args"], "--grace"))
    assert spec["terminationGracePeriodSeconds"] > grace
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["grpc"]["port"] == grpc_probe_port(server)


def test_the_daemonset_keeps_caches_and_socket_on_host_paths_the_client_pod_mounts() -> None:
    spec = load_one(DAEMONSET, "DaemonSet")["spec"]["template"]["spec"]
    server = container(spec, "cacheserver")
    volumes = {v["name"]: v for v in spec["volumes"]}
    host = {
        m["mountPath"]: volumes[m["name"]]["hostPath"]
        for m in server["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    }
    assert host[flag(server["args"], "--data-dir")]["type"] == "DirectoryOrCreate"
    client_spec = load_one(CLIENT_POD, "Pod")["spec"]
    client_volumes = {v["name"]: v for v in client_spec["volumes"]}
    [train] = client_spec["containers"]
    client_host = {
        m["mountPath"]: client_volumes[m["name"]]["hostPath"]["path"]
        for m in train["volumeMounts"]
        if "hostPath" in client_volumes[m["name"]]
    }
    assert client_host == {"/run/cacheserver": host["/run/cacheserver"]["path"]}
    service = load_one(K8S / "daemonset" / "service.yaml", "Service")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert (
        service["spec"]["selector"]
        == spec.get("nodeSelector", {})
        | load_one(DAEMONSET, "DaemonSet")["spec"]["selector"]["matchLabels"]
    )


def _named_port(c: dict[str, Any], port: int | str) -> int:
    """A Service's targetPort as a number: itself, or the container port of that name."""
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return int(number)


def test_the_fleet_service_is_headless_over_every_ready_daemon_and_the_client_pod_reads_it() -> (
    None
):
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
    [port] = [p for p in spec["ports"] if p["name"] == "grpc"]
    # no proxy translates ports: clients connect to the pods' port itself
    assert port["port"] == _named_port(server, port["targetPort"]) == grpc_probe_port(server)
    assert port["protocol"] == "TCP" and port["appProtocol"] == "grpc"
    # and the daemon listens there on every address of the pod, its pod IP included
    listens = [a for i, a in enumerate(server["args"]) if i and server["args"][i - 1] == "--listen"]
    assert f"0.0.0.0:{port['port']}" in listens
    namespace = yaml.safe_load((K8S / "daemonset" / "kustomization.yaml").read_text())["namespace"]
    [train] = load_one(CLIENT_POD, "Pod")["spec"]["containers"]
    env = {e["name"]: e["value"] for e in train["env"] if "value" in e}
    fleet = f"dns:///{service['metadata']['name']}.{namespace}.svc.cluster.local:{port['port']}"
    assert parse_targets(env["SHARDCACHE_TARGETS"]) == [fleet]
    # the node's own daemon stays at hand: the CLI's target, and CacheClient()'s without a store
    assert env["SHARDCACHE_TARGET"] == SOCKET_TARGET


def _tcp_listens(args: list[str]) -> list[str]:
    return [
        a
        for i, a in enumerate(args)
        if i and args[i - 1] == "--listen" and not a.startswith("unix:")
    ]


@pytest.mark.parametrize(
    "path,kind", [(SIDECAR_JOB, "Job"), (DAEMONSET, "DaemonSet")], ids=["sidecar", "daemonset"]
)
def test_the_daemon_opens_a_fixed_data_port_beside_grpc_and_declares_it(
    path: Path, kind: str
) -> None:
    server = container(load_one(path, kind)["spec"]["template"]["spec"], "cacheserver")
    address = flag(server["args"], "--data-listen")
    host, _, port = address.rpartition(":")
    # fixed (not auto, a free port), so Services and NetworkPolicies can name it, and on
    # every address gRPC listens on: a client reaches it where it reached gRPC
    assert port.isdigit() and int(port) != 0
    [grpc_listen] = _tcp_listens(server["args"])
    assert host == grpc_listen.rpartition(":")[0] == "0.0.0.0"
    assert int(port) != grpc_probe_port(server)
    assert _named_port(server, "data") == int(port)
    assert [p["protocol"] for p in server["ports"] if p["name"] == "data"] == ["TCP"]


@pytest.mark.parametrize(
    "path", [K8S / "daemonset" / "service.yaml", FLEET_SERVICE], ids=["node-local", "fleet"]
)
def test_the_daemonsets_services_carry_the_data_port_under_its_own_number(path: Path) -> None:
    """The daemon announces its own data port number and the client connects to that
    number at the address it reached gRPC at, so each Service passes it untranslated."""
    server = container(load_one(DAEMONSET, "DaemonSet")["spec"]["template"]["spec"], "cacheserver")
    ports = {p["name"]: p for p in load_one(path, "Service")["spec"]["ports"]}
    assert set(ports) == {"grpc", "data"}
    for name, listening in (
        ("grpc", grpc_probe_port(server)),
        ("data", data_listen_port(server["args"])),
    ):
        port = ports[name]
        assert port["port"] == _named_port(server, port["targetPort"]) == listening, name
        assert port["protocol"] == "TCP"


def test_the_network_policy_in_the_deploy_guide_admits_every_port_the_daemonset_declares() -> None:
    """docs/deploy.md's NetworkPolicy: the DaemonSet's pods, gRPC, the data port and the
    metrics port (a policy passing gRPC alone would leave reads on gRPC)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    text = (ROOT / "docs" / "deploy.md").read_text()
    [policy] = [
        d
        for block in re.findall(r"```yaml\n(.*?)```", text, re.S)
        for d in yaml.safe_load_all(block)
        if d and d["kind"] == "NetworkPolicy"
    ]
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    daemonset = load_one(DAEMONSET, "DaemonSet")
    server = container(daemonset["spec"]["template"]["spec"], "cacheserver")
    namespace = yaml.safe_load((K8S / "daemonset" / "kustomization.yaml").read_text())["namespace"]
    assert policy["metadata"]["namespace"] == namespace
    assert (
        policy["spec"]["podSelector"]["matchLabels"] == daemonset["spec"]["selector"]["matchLabels"]
    )
    admitted = {
        (p["port"], p["protocol"]) for rule in policy["spec"]["ingress"] for p in rule["ports"]
    }
    assert admitted == {(p["containerPort"], p["protocol"]) for p in server["ports"]}


def test_the_sidecar_trainer_names_its_own_daemon_not_a_fleet() -> None:
    train = container(load_one(SIDECAR_JOB, "Job")["spec"]["template"]["spec"], "train")
    names = {e["name"] for e in train["env"]}
    assert "SHARDCACHE_TARGET" in names and "SHARDCACHE_TARGETS" not in names


def test_the_daemonset_serves_metrics_on_its_pod_ip_where_prometheus_is_told_to_scrape() -> None:
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


@pytest.mark.parametrize(
    "path,kind", [(SIDECAR_JOB, "Job"), (DAEMONSET, "DaemonSet")], ids=["sidecar", "daemonset"]
)
def test_the_daemon_takes_the_store_from_an_optional_config_map_and_credentials_from_an_optional_secret(  # noqa: E501
    path: Path, kind: str
) -> None:
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
    values, sources = config.resolve({"data_dir": Path("/var/lib/shardcache")}, None, environ=data)
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
    assert spec["completions"] == spec["parallelism"] == int(flag(args, "--indexes"))
    assert int(flag(args, "--shards")) >= spec["completions"]
    assert flag(args, "--index") == "$(JOB_COMPLETION_INDEX)"
    assert spec["backoffLimitPerIndex"] >= 1 and spec["maxFailedIndexes"] == 0
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # usage errors (2) and what a retry cannot cure (3) fail the index at once
    [fail] = [r for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailIndex"]
    assert fail["onExitCodes"] == {
        "containerName": "materialize",
        "operator": "In",
        "values": [2, 3],
    }
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
            "name": "shardcache-store-credentials",
            "key": name,
            "optional": True,
        }
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


def test_the_materialize_job_command_runs_one_index_and_says_if_the_store_is_unreachable() -> None:
    store = load_one(STORE_CONFIG, "ConfigMap")["data"]
    argv = _job_argv(
        store
        | {
            "JOB_COMPLETION_INDEX": "3",
            "CACHESERVER_STORE": "s3://shardcache-test/caches",
            "CACHESERVER_STORE_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        }
    )
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": store["AWS_DEFAULT_REGION"],
    }
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr  # retried by backoffLimitPerIndex
    assert "index 3: the object store cannot be reached" in result.stderr
    # with the shipped ConfigMap (no store named yet) it is a usage error: FailIndex
    result = subprocess.run(
        _job_argv(store | {"JOB_COMPLETION_INDEX": "3"}),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "s3://BUCKET/PREFIX" in result.stderr, result.stderr


def test_the_daemonset_reads_its_credentials_from_a_secret_and_the_client_its_token() -> None:
    spec = load_one(DAEMONSET, "DaemonSet")["spec"]["template"]["spec"]
    server = container(spec, "cacheserver")
    volumes = {v["name"]: v for v in spec["volumes"]}
    [mount] = [m for m in server["volumeMounts"] if "secret" in volumes[m["name"]]]
    secret = volumes[mount["name"]]["secret"]
    assert mount["readOnly"] is True and secret["optional"] is True
    env = {e["name"]: e for e in server["env"]}
    ref = env["CACHESERVER_AUTH_FILE"]["valueFrom"]["secretKeyRef"]
    # the path comes from the same Secret: no Secret, no --auth-file (the daemon runs open)
    assert ref["name"] == secret["secretName"] and ref["optional"] is True
    assert f"--from-literal={ref['key']}={mount['mountPath']}/auth.toml" in DAEMONSET.read_text()
    [train] = load_one(CLIENT_POD, "Pod")["spec"]["containers"]
    token = {e["name"]: e for e in train["env"]}["CACHESERVER_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True
