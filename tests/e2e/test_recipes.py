"""docs/getting-started.md's recipes, run as written: the blocks marked `<!-- recipe: NAME -->`
are taken from the page itself, so the page cannot drift from what works.

A newcomer's setup: no root paths (a HOME and XDG_RUNTIME_DIR of the test's own), the daemon on
loopback with its metrics on, a pipeline cached, read from a second process, read from "another
host" (a second loopback address, 127.0.0.2, over TLS with a token, the files of the daemon out
of its sight: SHARDCACHE_DIRECT=false), and `cacheserver top` against the metrics. Only the
ports change (free ones instead of 50051, 50052, 9464) and the remote host's name. The tests
run in the page's order, as one user: the remote read reads the quickstart's cache.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import trustme
from daemon import free_port
from exposition import scrape
from grpc_health.v1 import health_pb2, health_pb2_grpc
from waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
README = ROOT / "README.md"
REMOTE_HOST = "127.0.0.2"  # the "other host": another loopback address of this machine


def recipes(page: Path = PAGE) -> dict[str, str]:
    """{name: the code block after its `<!-- recipe: name -->` marker}."""
    found = re.findall(r"<!-- recipe: (\S+) -->\n```\w*\n(.*?)```", page.read_text(), re.S)
    blocks = dict(found)
    assert len(blocks) == len(found), "two recipe blocks share a name"
    return blocks


class Newcomer:
    """A user with a home of their own, running the page's blocks with free ports."""

    def __init__(self, root: Path) -> None:
        self.home, self.run_dir, self.work = root / "home", root / "run", root / "work"
        self.bin = root / "bin"
        for d in (self.home, self.run_dir, self.work, self.bin):
            d.mkdir(mode=0o700)
        for name, how in (
            ("python", f'exec {sys.executable} "$@"'),
            ("python3", f'exec {sys.executable} "$@"'),
            ("cacheserver", f'exec {sys.executable} -m cacheserver "$@"'),
        ):
            script = self.bin / name
            script.write_text(f"#!/bin/sh\n{how}\n")
            script.chmod(0o755)
        self.grpc, self.data, self.metrics = free_port(), free_port(), free_port()
        self.env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "HOME": str(self.home),
            "XDG_RUNTIME_DIR": str(self.run_dir),
            "PYTHONPATH": str(ROOT),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            # the defaults the page names, moved to this run's ports
            "SHARDCACHE_TARGET": f"127.0.0.1:{self.grpc}",
            "SHARDCACHE_METRICS_URL": f"http://127.0.0.1:{self.metrics}/metrics",
        }
        self.blocks = {name: self.ported(text) for name, text in recipes().items()}

    def ported(self, text: str) -> str:
        for old, new in (
            ("50051", str(self.grpc)),
            ("50052", str(self.data)),
            ("9464", str(self.metrics)),
            ("0.0.0.0", REMOTE_HOST),
            ("cachehost", REMOTE_HOST),
        ):
            text = text.replace(old, new)
        return text

    def shell(self, name: str, env: dict[str, str] | None = None) -> str:
        """Run block name in bash, in the work dir; its stdout (fails on a non-zero exit)."""
        return self.run(["bash", "-euc", self.blocks[name]], env)

    def python(self, name: str, env: dict[str, str] | None = None) -> str:
        """Save block name under its own name in the work dir and run it."""
        (self.work / name).write_text(self.blocks[name])
        return self.run(["python", name], env)

    def run(self, command: list[str], env: dict[str, str] | None) -> str:
        done = subprocess.run(
            command,
            cwd=self.work,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stderr[-3000:]}"
        return done.stdout

    def serve(self, name: str) -> subprocess.Popen[bytes]:
        """Start block name, one `cacheserver serve` command, as the daemon itself."""
        block = self.blocks[name]
        assert block.startswith("cacheserver serve "), block
        with open(self.work / f"{name}.log", "ab") as log:  # the child keeps its own copy
            return subprocess.Popen(
                ["bash", "-c", f"exec {block}"],
                cwd=self.work,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")


def serving(target: str, credentials: grpc.ChannelCredentials | None = None) -> bool:
    with (
        grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    ) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=2
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def started(daemon: subprocess.Popen[bytes], user: Newcomer, name: str, target: str, **kw) -> None:
    def up() -> bool:
        assert daemon.poll() is None, f"the daemon exited:\n{user.log(name)}"
        return serving(target, **kw)

    wait_until(up, 60, f"{name}'s daemon serving at {target}")


def stop(daemon: subprocess.Popen[bytes]) -> int:
    daemon.send_signal(signal.SIGTERM)
    try:
        return daemon.wait(60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Newcomer]:
    yield Newcomer(tmp_path_factory.mktemp("newcomer"))


def test_every_recipe_block_on_the_page_is_one_the_test_runs() -> None:
    assert set(recipes()) == {
        "serve",
        "cache_it.py",
        "read_it.py",
        "look",
        "token",
        "serve-remote",
        "read_remote.py",
        "run-remote",
    }


def test_the_readme_starts_the_daemon_as_getting_started_does() -> None:
    assert recipes(README) == {"serve": recipes()["serve"]}


def test_the_quickstart_runs_without_root_and_top_sees_the_daemon(user: Newcomer) -> None:
    daemon = user.serve("serve")
    try:
        started(daemon, user, "serve", f"127.0.0.1:{user.grpc}")
        assert "READY 10000 elements" in user.python("cache_it.py")
        assert "10000 elements read" in user.python("read_it.py")
        look = user.blocks["look"].replace("cacheserver top", "cacheserver top --once --interval 1")
        (user.work / "look.sh").write_text(look)
        out = user.run(["bash", "-eu", "look.sh"], env={"COLUMNS": "160"})
    finally:
        assert stop(daemon) == 0, user.log("serve")
    assert (user.home / ".cache" / "shardcache").is_dir()
    assert re.search(r"quickstart\s+READY", out), out  # ls and top list the cache
    assert "readers" in out and "caches" in out, out  # top's frame, from the metrics


def test_another_host_reads_the_cache_over_tls_with_the_token(
    user: Newcomer, tmp_path: Path
) -> None:
    # The site's CA and the cache host's certificate, for the name the client dials.
    ca = trustme.CA()
    issued = ca.issue_cert(REMOTE_HOST)
    conf = user.home / ".config" / "shardcache"
    user.shell("token")
    issued.cert_chain_pems[0].write_to_path(str(conf / "server.pem"))
    issued.private_key_pem.write_to_path(str(conf / "server.key"))
    # What the other host was handed: the token file and the CA, in its working directory.
    ca.cert_pem.write_to_path(str(user.work / "ca.pem"))
    (user.work / "token").write_text((conf / "token").read_text())

    daemon = user.serve("serve-remote")
    try:
        started(
            daemon,
            user,
            "serve-remote",
            f"{REMOTE_HOST}:{user.grpc}",
            credentials=grpc.ssl_channel_credentials(ca.cert_pem.bytes()),
        )
        (user.work / "run-remote.sh").write_text(user.blocks["run-remote"])
        (user.work / "read_remote.py").write_text(user.blocks["read_remote.py"])
        elsewhere = {"SHARDCACHE_DIRECT": "false", "SHARDCACHE_TARGET": ""}
        out = user.run(["bash", "-eu", "run-remote.sh"], env=elsewhere)
        without_token = subprocess.run(
            ["python", "read_remote.py"],
            cwd=user.work,
            env={**user.env, **elsewhere, "CACHESERVER_TOKEN": "not-the-token"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        metrics = scrape(f"http://127.0.0.1:{user.metrics}/metrics")
    finally:
        assert stop(daemon) == 0, user.log("serve-remote")
    assert "10000 elements read from quickstart" in out, out
    data_bytes = metrics.get(("shardcache_read_bytes_total", (("plane", "data"),)), 0)
    assert data_bytes > 0, "the remote read did not take the data port"
    assert without_token.returncode != 0
    assert "UnauthenticatedError" in without_token.stderr, without_token.stderr[-2000:]
