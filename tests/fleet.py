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

    def __init__(
        self,
        store: tuple[str, str, dict[str, str]],
        port: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(port, free_port())
        self.store = store
        self.extra_args = tuple(extra_args)

    def add(self) -> Daemon:
        url, endpoint, env = self.store
        host = f"127.0.0.{len(self.members) + 2}"
        d = Daemon(
            extra_args=(
                "--store",
                url,
                "--store-endpoint",
                endpoint,
                "--store-pull",
                "on-read",
                "--metrics-listen",
                f"{host}:{self.metrics_port}",
                *self.extra_args,
            ),
            env={**os.environ, **env},
            host=host,
            port=self.port,
        )
        return self._start(d, host)

    def close(self) -> None:
        for d in self.members:
            d.close()


def shards_on(d: Daemon, name: str) -> set[int]:
    """The shards of cache name on member d's disk (pulled there, or written there)."""
    directory = d.data_dir / "caches" / name
    if not directory.is_dir():
        return set()
    return {
        int(p.name.removeprefix("shard-"))
        for p in directory.glob("shard-*")
        if (p / "data.mdb").exists()
    }


def metric(d: Daemon, sample: str) -> float:
    """The value of one sample (name and labels, as exposed) on member d's /metrics, a name
    without labels summing all its series (shardcache_read_bytes_total: both planes); 0 if
    absent."""
    prefixes = (sample + " ",) if "{" in sample else (sample + " ", sample + "{")
    with urllib.request.urlopen(d.metrics_url, timeout=10) as response:  # type: ignore[attr-defined]
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in response.read().decode().splitlines()
            if line.startswith(prefixes)
        )


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


class NetnsLink:
    """Network namespace sc<pid>m<i>, joined to this one by a veth pair: the namespace's end
    is 10.231.i.2 (``host``), this one's 10.231.i.1 (``gateway``). set(up=False) takes the
    link down as a pulled cable would; rate(mbit) caps it both ways (tc tbf). ``prefix``
    runs a command inside the namespace (`ip netns exec`, which execs it)."""

    def __init__(self, i: int) -> None:
        tag = f"sc{os.getpid() % 100000}"
        self.ns, self._outside, self._inside = f"{tag}m{i}", f"{tag}r{i}", f"{tag}p{i}"
        self.host, self.gateway = f"10.231.{i}.2", f"10.231.{i}.1"
        self.prefix = ("ip", "netns", "exec", self.ns)
        _ip("netns", "add", self.ns)
        _ip("link", "add", self._outside, "type", "veth", "peer", "name", self._inside)
        _ip("link", "set", self._inside, "netns", self.ns)
        _ip("addr", "add", f"{self.gateway}/24", "dev", self._outside)
        _ip("link", "set", self._outside, "up")
        _ip("addr", "add", f"{self.host}/24", "dev", self._inside, ns=self.ns)
        _ip("link", "set", self._inside, "up", ns=self.ns)
        _ip("link", "set", "lo", "up", ns=self.ns)

    def set(self, up: bool) -> None:
        _ip("link", "set", self._outside, "up" if up else "down")

    def rate(self, mbit: float | None) -> None:
        """Cap the link at mbit both ways; None lifts the cap."""
        for dev, prefix in ((self._outside, ()), (self._inside, self.prefix)):
            command = [
                "tc",
                "qdisc",
                "replace",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                f"{mbit}mbit",
                "burst",
                "64kb",
                "latency",
                "10ms",
            ]
            if mbit is None:
                command = ["tc", "qdisc", "del", "dev", dev, "root"]
            subprocess.run(
                [*prefix, *command], check=mbit is not None, capture_output=True, timeout=30
            )

    def close(self) -> None:
        subprocess.run(
            ["ip", "netns", "del", self.ns], capture_output=True, timeout=30
        )  # its veth pair goes with it


class _NetnsDaemon(Daemon):
    """A daemon run inside a network namespace (prefix: NetnsLink's)."""

    prefix: tuple[str, ...] = ()

    @property
    def command(self) -> list[str]:
        return [*self.prefix, *super().command]


class NetnsFleet(_Fleet):
    """Members in network namespaces of their own, each joined to this one by a NetnsLink.

    Member i is 10.231.i.2; this namespace's end of its link is 10.231.i.1, where the store
    (listening on every address) is reached from inside. link(i, up=False) takes the
    member's link down as a pulled cable would; rate(i, mbit) caps it both ways.
    """

    def __init__(
        self,
        store_port: int,
        env: dict[str, str],
        url: str,
        port: int | None = None,
        metrics: bool = False,
    ) -> None:
        # each member has its addresses to itself: fixed ports, so placement is too
        super().__init__(port or 50051, 9464 if metrics else 0)
        self.store_port = store_port
        self.env = env
        self.url = url
        self.links: list[NetnsLink] = []

    def add(self) -> Daemon:
        link = NetnsLink(len(self.members) + 1)
        self.links.append(link)
        d = _NetnsDaemon(
            extra_args=(
                "--store",
                self.url,
                "--store-endpoint",
                f"http://{link.gateway}:{self.store_port}",
                "--store-pull",
                "on-read",
                *(
                    ("--metrics-listen", f"{link.host}:{self.metrics_port}")
                    if self.metrics_port
                    else ()
                ),
            ),
            env={**os.environ, **self.env},
            host=link.host,
            port=self.port,
        )
        d.prefix = link.prefix
        return self._start(d, link.host)

    def link(self, i: int, up: bool) -> None:
        """Member i's (0-based) link up or down."""
        self.links[i].set(up)

    def rate(self, i: int, mbit: float) -> None:
        self.links[i].rate(mbit)

    def close(self) -> None:
        for d, link in zip(self.members, self.links):
            d.close()
            link.close()
