"""A fleet of real daemons over one object store, for tests and the fleet bench.

Members listen on loopback addresses of their own (127.0.0.2, 127.0.0.3, ...)
at one port, as pods of a DaemonSet do on their node IPs; ``hosts_name`` adds a
name to /etc/hosts that resolves to all of them, as a headless Service's does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.daemon import Daemon, free_port

HOSTS = Path("/etc/hosts")


class _Fleet:
    """Members started one by one, each listening on its own address (and a unix socket)."""

    def __init__(self, port: int | None, metrics_port: int) -> None:
        self.port = port or free_port()
        self.metrics_port = metrics_port
        self.members: list[Daemon] = []

    def _start(self, d: Daemon, host: str) -> Daemon:
        if self.metrics_port:
            d.metrics_url = f"http://{host}:{self.metrics_port}/metrics"  # type: ignore[attr-defined]
        d.listen = (d.tcp_target, d.unix_target)  # the member's own address only
        self.members.append(d)
        d.start()
        return d

    @property
    def targets(self) -> list[str]:
        return [d.tcp_target for d in self.members]


class LoopbackFleet(_Fleet):
    """Members on 127.0.0.2, 127.0.0.3, ..., each with --store and --store-pull on-read."""

    def __init__(self, store: tuple[str, str, dict[str, str]], port: int | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        super().__init__(port, free_port())
        self.store = store
        self.extra_args = tuple(extra_args)

    def add(self) -> Daemon:
        url, endpoint, env = self.store
        host = f"127.0.0.{len(self.members) + 2}"
        d = Daemon(extra_args=("--store", url, "--store-endpoint", endpoint,
                               "--store-pull", "on-read", "--metrics-listen",
                               f"{host}:{self.metrics_port}", *self.extra_args),
                   env={**os.environ, **env}, host=host, port=self.port)
        return self._start(d, host)

    def close(self) -> None:
        for d in self.members:
            d.close()


def shards_on(d: Daemon, name: str) -> set[int]:
    """The shards of cache name on member d's disk (pulled there, or written there)."""
    directory = d.data_dir / "caches" / name
    if not directory.is_dir():
        return set()
    return {int(p.name.removeprefix("shard-")) for p in directory.glob("shard-*")
            if (p / "data.mdb").exists()}


def metric(d: Daemon, sample: str) -> float:
    """The value of one sample (name and labels, as exposed) on member d's /metrics, a name
    without labels summing all its series (shardcache_read_bytes_total: both planes); 0 if
    absent."""
    prefixes = (sample + " ",) if "{" in sample else (sample + " ", sample + "{")
    with urllib.request.urlopen(d.metrics_url, timeout=10) as response:  # type: ignore[attr-defined]
        return sum(float(line.rsplit(" ", 1)[1])
                   for line in response.read().decode().splitlines()
                   if line.startswith(prefixes))


@contextlib.contextmanager
def hosts_name(name: str, addresses: Sequence[str]) -> Iterator[HostsName]:
    """name resolves to addresses (through /etc/hosts) inside the block."""
    entry = HostsName(name)
    entry.set(addresses)
    try:
        yield entry
    finally:
        entry.set(())


class HostsName:
    def __init__(self, name: str) -> None:
        self.name = name
        self._tag = f"# shardcache test {os.getpid()} {name}"

    def set(self, addresses: Sequence[str]) -> None:
        """Replace this name's lines in /etc/hosts with one line per address."""
        kept = [line for line in HOSTS.read_text().splitlines() if not line.endswith(self._tag)]
        added = [f"{a} {self.name} {self._tag}" for a in addresses]
        HOSTS.write_text("\n".join([*kept, *added]) + "\n")


def can_edit_hosts() -> bool:
    return os.access(HOSTS, os.W_OK)


def _ip(*args: str, ns: str | None = None) -> None:
    command = ["ip", *(("netns", "exec", ns, "ip") if ns else ()), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


def can_make_netns() -> bool:
    """Root with `ip netns` at hand: namespaces and veth pairs can be made."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


class _NetnsDaemon(Daemon):
    """A daemon run inside network namespace ns (`ip netns exec`, which execs it)."""

    ns = ""

    @property
    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *super().command]


class NetnsFleet(_Fleet):
    """Members in network namespaces of their own, each joined to this one by a veth pair.

    Member i is 10.231.i.2 in namespace sc<pid>m<i>; this namespace's end of its
    link is 10.231.i.1, where the store (listening on every address) is reached
    from inside. link(i, up=False) takes the member's link down as a pulled cable
    would; rate(i, mbit) caps it both ways (tc tbf).
    """

    def __init__(self, store_port: int, env: dict[str, str], url: str,
                 port: int | None = None, metrics: bool = False) -> None:
        # each member has its addresses to itself: fixed ports, so placement is too
        super().__init__(port or 50051, 9464 if metrics else 0)
        self.store_port = store_port
        self.env = env
        self.url = url
        self._tag = f"sc{os.getpid() % 100000}"

    def _names(self, i: int) -> tuple[str, str, str]:
        return f"{self._tag}m{i}", f"{self._tag}r{i}", f"{self._tag}p{i}"

    def add(self) -> Daemon:
        i = len(self.members) + 1
        ns, outside, inside = self._names(i)
        _ip("netns", "add", ns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", ns)
        _ip("addr", "add", f"10.231.{i}.1/24", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("addr", "add", f"10.231.{i}.2/24", "dev", inside, ns=ns)
        _ip("link", "set", inside, "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)
        d = _NetnsDaemon(extra_args=(
            "--store", self.url, "--store-endpoint", f"http://10.231.{i}.1:{self.store_port}",
            "--store-pull", "on-read", *(("--metrics-listen", f"10.231.{i}.2:{self.metrics_port}")
                                         if self.metrics_port else ())),
            env={**os.environ, **self.env},
            host=f"10.231.{i}.2", port=self.port)
        d.ns = ns
        return self._start(d, f"10.231.{i}.2")

    def link(self, i: int, up: bool) -> None:
        """Member i's (0-based) link up or down."""
        _ip("link", "set", self._names(i + 1)[1], "up" if up else "down")

    def rate(self, i: int, mbit: float) -> None:
        ns, outside, inside = self._names(i + 1)
        for dev, where in ((outside, None), (inside, ns)):
            command = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                       f"{mbit}mbit", "burst", "64kb", "latency", "10ms"]
            subprocess.run(["ip", "netns", "exec", where, *command] if where else command,
                           check=True, capture_output=True, timeout=30)

    def close(self) -> None:
        for i, d in enumerate(self.members):
            d.close()
            subprocess.run(["ip", "netns", "del", self._names(i + 1)[0]],
                           capture_output=True, timeout=30)  # its veth pair goes with it
