"""Test hosts on one machine: Linux network namespaces on a bridge, with links that can be cut.

Each host is a network namespace ``<prefix><name>`` with one interface, ``eth0``, at
``<subnet>.<n>/24``; its peer is attached to a bridge in the root namespace, which holds the
gateway address ``<subnet>.1``, so processes of the root namespace (the test driver, the Spark
master) reach every host and are reached there.  :meth:`TestHosts.cut` sets a host's peer link
down: its processes keep running but reach nobody and nobody reaches them (a network partition,
not a crash) until :meth:`TestHosts.heal`.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's ``ip``; :func:`netns_unavailable`
says why not when it cannot work.  Real hosts need none of this: see ``deploy/README.md``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Host", "NetnsError", "TestHosts", "netns_unavailable"]


class NetnsError(RuntimeError):
    """An ``ip`` command failed (its stderr is in the message)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def netns_unavailable() -> str | None:
    """None if namespaces and veth links can be created here, else the reason."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"rhprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
        _ip("link", "add", f"{probe}a", "type", "veth", "peer", "name", f"{probe}b")
    except NetnsError as exc:
        return f"cannot create a network namespace with a veth link: {exc}"
    finally:
        _ip("link", "del", f"{probe}a", check=False)
        _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One namespace host: where its processes run and the address they have."""

    name: str
    namespace: str
    address: str
    link: str  # the peer interface in the root namespace (cut: set down)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host (``ip netns exec`` execs it: the pid is the program's)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class TestHosts:
    """Namespace hosts on one bridge; a context manager that removes them all at the end."""

    __test__ = False  # not a pytest class

    def __init__(self, names: Iterable[str], subnet: str = "10.231.0", prefix: str | None = None) -> None:
        self.subnet = subnet
        self.gateway = f"{subnet}.1"  # the root namespace's address on the bridge
        tag = self.tag = prefix or f"rh{uuid.uuid4().hex[:4]}"
        self.names = list(names)
        self.bridge = f"{tag}br"
        self.hosts: dict[str, Host] = {}
        for i, name in enumerate(self.names):
            self.hosts[name] = Host(name, f"{tag}-{name}", f"{subnet}.{10 + i}", f"{tag}v{i}")

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def host_of(self, address: str) -> Host | None:
        return next((h for h in self.hosts.values() if h.address == address), None)

    def create(self) -> TestHosts:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for h in self.hosts.values():
                _ip("netns", "add", h.namespace)
                _ip("link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.namespace)
                _ip("link", "set", h.link, "master", self.bridge)
                _ip("link", "set", h.link, "up")
                inside = ["netns", "exec", h.namespace, "ip"]
                _ip(*inside, "addr", "add", f"{h.address}/24", "dev", "eth0")
                _ip(*inside, "link", "set", "eth0", "up")
                _ip(*inside, "link", "set", "lo", "up")
                _ip(*inside, "route", "add", "default", "via", self.gateway)
        except BaseException:
            self.destroy()
            raise
        return self

    def cut(self, name: str) -> None:
        """Partition ``name`` from everybody; its processes keep running."""
        _ip("link", "set", self.hosts[name].link, "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].link, "up")

    def destroy(self) -> None:
        """Delete the namespaces, links and bridge, whatever of them exists (also from another
        process that made the same ``TestHosts``); processes still inside keep running: stop them
        first."""
        for h in self.hosts.values():
            _ip("link", "del", h.link, check=False)  # (deleting one end of a veth deletes both)
            _ip("netns", "del", h.namespace, check=False)
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> TestHosts:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()
