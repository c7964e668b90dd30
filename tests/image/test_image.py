"""The image, built and run: the daemon container and the sidecar pod, with podman.

Opt-in (SHARDCACHE_IMAGE_TESTS=1, as `make image-test` sets it): it needs root, podman
and the image `make image` builds (SHARDCACHE_IMAGE, default localhost/shardcache:0.1.0),
and takes a few minutes, so the CI suite skips it, CI=true included. Run it before landing
any change to deploy/ (tests/README).

One pod as deploy/k8s/sidecar lays it out (the daemon's data dir on a named volume, the
socket on a memory-backed volume, both shared with a training container of the same image
that mounts the data read-only) lives through the module: the daemon starts as uid 10001
and serves health on both listeners, the trainer writes a cache and reads it back
directly, `podman stop` drains it, the container restarted on its volume serves the cache,
a SIGKILL loses nothing committed. Then the sidecar Job's own pod, under `podman kube play`.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from daemon import free_port
from deploy_tree import (
    SIDECAR_JOB,
    SOCKET_TARGET,
    container,
    flag,
    kubelet_probe,
    load_one,
)
from waits import wait_until

from client import CacheClient

pytestmark = pytest.mark.skipif(
    os.environ.get("SHARDCACHE_IMAGE_TESTS") != "1",
    reason="runs the container image with podman (root, minutes): opt in with "
    "SHARDCACHE_IMAGE_TESTS=1, or `make image-test`",
)

IMAGE = os.environ.get("SHARDCACHE_IMAGE", "localhost/shardcache:0.1.0")
TRAINER = Path(__file__).with_name("trainer.py")
SIDECAR_SPEC = load_one(SIDECAR_JOB, "Job")["spec"]["template"]["spec"]
DAEMON_ARGS = container(SIDECAR_SPEC, "cacheserver")["args"]
GRACE_S = float(flag(DAEMON_ARGS, "--grace"))
DATA_DIR = flag(DAEMON_ARGS, "--data-dir")
SOCKET_DIR = str(Path(SOCKET_TARGET.removeprefix("unix://")).parent)
#: what the manifest's trainer is told; it mounts the data dir read-only here
LOCAL_DATA_DIR = "/shardcache-data"

# What this host needs of podman, not what a user types: the VM lacks CAP_SYS_RESOURCE
# (the runtime may not raise rlimits, so the containers get limits it already has) and
# its cgroups are a v1/v2 hybrid that systemd's cgroup manager does not drive.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
cgroup_manager = "cgroupfs"
"""


class Podman:
    """podman with this test's containers.conf; every call checked, output returned."""

    def __init__(self, conf: Path) -> None:
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def __call__(self, *args: str, check: bool = True, timeout: float = 180) -> str:
        result = subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}"
            )
        return result.stdout

    def memory_volume(self, name: str) -> None:
        """A tmpfs volume the daemon's uid owns, as the manifest's socket volume (an
        emptyDir with medium: Memory)."""
        self(
            "volume",
            "create",
            "--opt",
            "type=tmpfs",
            "--opt",
            "device=tmpfs",
            "--opt",
            "o=uid=10001,gid=10001,mode=0750",
            name,
        )

    def state(self, name: str, what: str) -> str:
        return self("inspect", "--format", "{{" + what + "}}", name).strip()

    def log(self, name: str) -> list[str]:
        """The daemon's JSON log lines' messages (--log-format json)."""
        result = subprocess.run(
            ["podman", "logs", name],
            env=self.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=60,
        )
        text = result.stdout  # the container's stdout and stderr
        return [json.loads(line)["message"] for line in text.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed (apt-get install -y podman buildah runc)")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    runtime = '\nruntime = "runc"\n' if shutil.which("runc") else ""
    conf.write_text(CONTAINERS_CONF + runtime)
    run = Podman(conf)
    if subprocess.run(["podman", "image", "exists", IMAGE], env=run.env).returncode:
        pytest.fail(f"no image {IMAGE}: build it first (make image)")
    return run


@dataclass
class Pod:
    """The sidecar's pod: its name, volumes, the daemon container and its published
    gRPC port on the host's loopback."""

    podman: Podman
    name: str
    port: int
    daemon: str = ""
    volumes: dict[str, str] = field(default_factory=dict)

    def trainer(self, command: str, cache: str, count: int) -> dict[str, Any]:
        """trainer.py in a container of the same image, as the manifest's `train`: same
        uid, read-only root, the socket and the data dir (read-only) shared. Its JSON."""
        out = self.podman(
            "run",
            "--rm",
            "--pod",
            self.name,
            "--user",
            "10001:10001",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--volume",
            f"{self.volumes['socket']}:{SOCKET_DIR}",
            "--volume",
            f"{self.volumes['cache']}:{LOCAL_DATA_DIR}:ro",
            "--volume",
            f"{TRAINER}:/opt/trainer.py:ro",
            "--env",
            f"SHARDCACHE_TARGET={SOCKET_TARGET}",
            "--env",
            f"SHARDCACHE_LOCAL_DATA_DIR={LOCAL_DATA_DIR}",
            "--entrypoint",
            "python3",
            IMAGE,
            "/opt/trainer.py",
            command,
            cache,
            str(count),
        )
        return dict(json.loads(out.strip().splitlines()[-1]))

    def serving(self) -> None:
        """What the manifest's startupProbe does, from the host through the published port."""
        startup = container(SIDECAR_SPEC, "cacheserver")["startupProbe"]
        kubelet_probe(
            self.port, startup, float(startup["periodSeconds"]) * float(startup["failureThreshold"])
        )

    def caches(self) -> dict[str, tuple[str, int]]:
        """Every cache the daemon lists, over TCP from the host: (state, elements)."""
        with CacheClient(f"127.0.0.1:{self.port}") as cc:
            return {c.name: (c.state, c.num_elements) for c in cc.list()}


@pytest.fixture(scope="module")
def pod(podman: Podman) -> Iterator[Pod]:
    p = Pod(podman, f"shardcache-test-{uuid.uuid4().hex[:8]}", free_port())
    p.volumes = {"cache": f"{p.name}-cache", "socket": f"{p.name}-socket"}
    try:
        podman("volume", "create", p.volumes["cache"])
        podman.memory_volume(p.volumes["socket"])
        podman("pod", "create", "--name", p.name, "--publish", f"127.0.0.1:{p.port}:50051")
        # the image's own command (the manifests'), locked down as the manifest locks it:
        # a read-only root with no tmpfs on /tmp or /run, as readOnlyRootFilesystem gives
        p.daemon = f"{p.name}-cacheserver"
        podman(
            "create",
            "--pod",
            p.name,
            "--name",
            p.daemon,
            "--read-only",
            "--read-only-tmpfs=false",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--volume",
            f"{p.volumes['cache']}:{DATA_DIR}",
            "--volume",
            f"{p.volumes['socket']}:{SOCKET_DIR}",
            IMAGE,
        )
        podman("start", p.daemon)
        yield p
    finally:
        podman("pod", "rm", "--force", "--time", "0", p.name, check=False)
        podman("volume", "rm", "--force", *p.volumes.values(), check=False)


def _status(pid: int) -> dict[str, list[str]]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.split() for k, _, v in (line.partition(":") for line in lines)}


def test_the_daemon_runs_as_uid_10001_as_pid_1_and_serves_health_on_tcp(pod: Pod) -> None:
    pod.serving()
    status = _status(int(pod.podman.state(pod.daemon, ".State.Pid")))
    assert status["Uid"] == ["10001"] * 4 and status["Gid"] == ["10001"] * 4
    assert status["NSpid"][-1] == "1"  # PID 1 in its namespace: SIGTERM is its own
    assert status["CapEff"] == ["0000000000000000"]
    assert pod.podman.state(pod.daemon, ".Config.Cmd") == "[" + " ".join(DAEMON_ARGS) + "]", (
        "the image's command is the manifests'"
    )


def test_a_trainer_in_the_pod_writes_over_the_socket_and_reads_back_directly(pod: Pod) -> None:
    pod.serving()
    seen = pod.trainer("write", "epoch-1", 300)
    assert seen["uid"] == 10001
    assert seen["health_socket"] == "SERVING" and seen["health_tcp"] == "SERVING"
    assert (seen["state"], seen["num_elements"], seen["wrong"]) == ("READY", 300, 0)
    assert seen["direct_passes"] == 1, "the trainer read the mounted files, not gRPC"


def test_podman_stop_sends_sigterm_and_the_daemon_drains_and_exits_0_within_its_grace(
    pod: Pod,
) -> None:
    pod.serving()
    # podman kills past its timeout: a little over --grace, so only a drain that ends
    # within --grace exits by itself
    pod.podman("stop", "--time", str(int(GRACE_S) + 5), pod.daemon, timeout=GRACE_S + 60)
    assert pod.podman.state(pod.daemon, ".State.ExitCode") == "0"
    log = pod.podman.log(pod.daemon)
    assert "received SIGTERM" in log
    assert f"draining in-flight streams (up to {GRACE_S:.0f}s)" in log
    assert log[-1] == "stopped"


def test_the_container_restarted_on_its_volume_serves_the_cache_ready(pod: Pod) -> None:
    pod.podman("start", pod.daemon)
    pod.serving()
    assert pod.caches() == {"epoch-1": ("READY", 300)}
    seen = pod.trainer("read", "epoch-1", 300)
    assert (seen["wrong"], seen["direct_passes"]) == (0, 1)


def test_a_kill_9_of_the_container_loses_nothing_committed(pod: Pod) -> None:
    pod.serving()
    assert pod.trainer("write", "epoch-2", 200)["state"] == "READY"
    pod.podman("kill", "--signal", "KILL", pod.daemon)
    pod.podman("wait", pod.daemon)
    assert pod.podman.state(pod.daemon, ".State.ExitCode") == "137"
    pod.podman("start", pod.daemon)
    pod.serving()
    assert pod.caches() == {"epoch-1": ("READY", 300), "epoch-2": ("READY", 200)}
    for cache, count in (("epoch-1", 300), ("epoch-2", 200)):
        assert pod.trainer("read", cache, count)["wrong"] == 0


# --- the sidecar Job's own pod under `podman kube play` ----------------------------------


def sidecar_pod(name: str, ports: dict[int, int]) -> dict[str, Any]:
    """The sidecar Job's pod template as a Pod that podman 4.3 plays. What is translated,
    here only, never in the manifest: the native sidecar (an init container with
    restartPolicy: Always, which podman would run to completion first) becomes one of the
    pod's containers; the images become the one built here, the trainer running
    trainer.py; each containerPort (which podman publishes on the host, unlike a kubelet)
    is published on loopback at a free port. Everything else is the manifest's."""
    spec = copy.deepcopy(SIDECAR_SPEC)
    sidecars = spec.pop("initContainers")
    assert [c.pop("restartPolicy") for c in sidecars] == ["Always"]
    spec["containers"] = sidecars + spec["containers"]
    daemon, train = container(spec, "cacheserver"), container(spec, "train")
    daemon["image"] = train["image"] = IMAGE
    for port in daemon["ports"]:
        port |= {"hostIP": "127.0.0.1", "hostPort": ports[port["containerPort"]]}
    train["command"] = ["python3", "-c", TRAINER.read_text(), "write", "kube-play", "100"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_the_sidecar_jobs_pod_plays_in_podman_and_its_trainer_reads_directly(
    podman: Podman, tmp_path: Path
) -> None:
    name = f"shardcache-kube-{uuid.uuid4().hex[:8]}"
    daemon = container(SIDECAR_SPEC, "cacheserver")
    ports = {p["containerPort"]: free_port() for p in daemon["ports"]}
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(sidecar_pod(name, ports)))
    try:
        podman("kube", "play", str(manifest))
        # podman 4.3 has no gRPC probes: the kubelet's, from the host, on the pod's port
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            kubelet_probe(ports[daemon[probe]["grpc"]["port"]], daemon[probe], 60)
        train = f"{name}-train"
        podman("wait", train)
        out = podman("logs", train)
        assert podman.state(train, ".State.ExitCode") == "0", out
        seen = json.loads(out.strip().splitlines()[-1])
        assert seen["uid"] == 10001 and seen["gid"] == 10001
        assert seen["health_socket"] == "SERVING" and seen["health_tcp"] == "SERVING"
        assert (seen["state"], seen["num_elements"], seen["wrong"]) == ("READY", 100, 0)
        assert seen["direct_passes"] == 1

        server = f"{name}-cacheserver"
        assert podman.state(server, ".Config.Cmd") == "[" + " ".join(daemon["args"]) + "]"
        assert podman.state(server, ".Config.User") == "10001:10001"
        assert podman.state(server, ".HostConfig.ReadonlyRootfs") == "true"
        # the Job ends: the kubelet stops the sidecar after the trainer, within the
        # pod's terminationGracePeriodSeconds
        grace = float(SIDECAR_SPEC["terminationGracePeriodSeconds"])
        podman("pod", "stop", "--time", str(int(grace)), name, timeout=grace + 60)
        assert podman.state(server, ".State.ExitCode") == "0"
        assert podman.log(server)[-1] == "stopped"
    finally:
        podman("kube", "down", str(manifest), check=False)


# --- the -tf image: a daemon that materializes -------------------------------------------


def _has_socket(podman: Podman, container_name: str) -> bool:
    path = SOCKET_TARGET.removeprefix("unix://")
    return (
        subprocess.run(
            ["podman", "exec", container_name, "test", "-S", path],
            env=podman.env,
            capture_output=True,
        ).returncode
        == 0
    )


TF_IMAGE = os.environ.get("SHARDCACHE_TF_IMAGE", f"{IMAGE}-tf")
PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"


def test_the_tf_image_materializes_an_entry_point_the_daemon_image_refuses_clearly(
    podman: Podman,
) -> None:
    if subprocess.run(["podman", "image", "exists", TF_IMAGE], env=podman.env).returncode:
        pytest.skip(f"no image {TF_IMAGE}: make image-tf builds it")
    name = f"shardcache-mat-{uuid.uuid4().hex[:8]}"
    socket_volume = f"{name}-socket"
    serve = [
        "serve",
        "--data-dir",
        DATA_DIR,
        "--listen",
        SOCKET_TARGET,
        "--pythonpath",
        "/opt/pipelines",
        "--materialize-allow",
        "mat_pipelines",
    ]
    materialize = [
        "cacheserver",
        "materialize",
        "mat_pipelines:records",
        "--name",
        "m",
        "--shards",
        "2",
    ]
    try:
        podman.memory_volume(socket_volume)
        for image in (IMAGE, TF_IMAGE):
            daemon = f"{name}-{image.rpartition(':')[2]}"
            podman(
                "run",
                "--detach",
                "--name",
                daemon,
                "--read-only",
                "--read-only-tmpfs=false",
                "--volume",
                f"{socket_volume}:{SOCKET_DIR}",
                "--volume",
                f"{PIPELINES}:/opt/pipelines:ro",
                image,
                *serve,
            )
            exec_ = ["exec", "--env", f"SHARDCACHE_TARGET={SOCKET_TARGET}", daemon]
            wait_until(
                lambda d=daemon: _has_socket(podman, d),
                60,  # type: ignore[misc]
                f"{daemon}'s socket",
            )
            result = subprocess.run(
                ["podman", *exec_, *materialize],
                env=podman.env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if image == IMAGE:
                assert result.returncode != 0, result.stderr
                assert "has no TensorFlow" in result.stderr and "make image-tf" in result.stderr
            else:
                assert result.returncode == 0, result.stderr
                listed = podman(*exec_, "cacheserver", "ls")
                assert "m " in listed and "READY" in listed, listed
            podman("rm", "--force", "--volumes", "--time", "0", daemon)
    finally:
        podman(
            "rm",
            "--force",
            "--ignore",
            "--volumes",
            "--time",
            "0",
            *(f"{name}-{i.rpartition(':')[2]}" for i in (IMAGE, TF_IMAGE)),
            check=False,
        )
        podman("volume", "rm", "--force", socket_volume, check=False)
