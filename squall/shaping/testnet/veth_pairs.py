"""Network namespaces joined by veth pairs, for tests and benchmarks of the daemon (needs root).

Every namespace is named ``<prefix>-<random>-<host>`` and every process started through the
testbed is tracked; :meth:`Testbed.close` (also on an exception inside ``with``) kills those
processes and deletes the namespaces, which removes their veth ends and iptables rules with them.
Link ``k`` gets the subnet ``10.(77 + k // 256).(k % 256).0/24`` with ``.1`` on the first host and
``.2`` on the second; interfaces are created directly inside the namespaces, never in the host.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squall.shaping.kernel.netns import netns_of_name, socket_in

logger = logging.getLogger(__name__)
REPO_ROOT = str(Path(__file__).resolve().parents[3])


@dataclass(frozen=True)
class Link:
    """One veth pair: addresses on each side."""

    a: str  # host key of the first end
    b: str  # host key of the second end
    addr_a: str  # address of a's end
    addr_b: str  # address of b's end


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


class Testbed:
    """A set of namespaces and veth links that cleans up after itself."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, prefix: str = "squall-test"):
        self.tag = f"{prefix}-{secrets.token_hex(3)}"
        self.hosts: dict[str, str] = {}  # key -> netns name
        self.links: list[Link] = []
        self._ifcount: dict[str, int] = {}
        self._procs: list[subprocess.Popen[Any]] = []

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def add_host(self, key: str) -> str:
        """Create namespace ``<tag>-<key>`` with loopback up; return its name."""
        name = f"{self.tag}-{key}"
        _ip("netns", "add", name)
        self.hosts[key] = name
        self._ifcount[key] = 0
        _ip("-n", name, "link", "set", "lo", "up")
        return name

    def path(self, key: str) -> str:
        """The namespace file of host ``key`` (for setns, nsenter and the daemon config)."""
        return netns_of_name(self.hosts[key])

    def link(self, a: str, b: str) -> Link:
        """Join hosts ``a`` and ``b`` with a veth pair on a fresh /24."""
        k = len(self.links)
        subnet = f"10.{77 + k // 256}.{k % 256}"
        link = Link(a, b, f"{subnet}.1", f"{subnet}.2")
        if_a, if_b = self._next_if(a), self._next_if(b)
        _ip(
            "-n",
            self.hosts[a],
            "link",
            "add",
            if_a,
            "type",
            "veth",
            "peer",
            "name",
            if_b,
            "netns",
            self.hosts[b],
        )
        for key, ifname, addr in ((a, if_a, link.addr_a), (b, if_b, link.addr_b)):
            _ip("-n", self.hosts[key], "addr", "add", f"{addr}/24", "dev", ifname)
            _ip("-n", self.hosts[key], "link", "set", ifname, "up")
        self.links.append(link)
        return link

    def _next_if(self, key: str) -> str:
        n = self._ifcount[key]
        self._ifcount[key] = n + 1
        return f"eth{n}"

    def spawn(self, key: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside host ``key`` (``ip netns exec``); killed by :meth:`close`."""
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = subprocess.Popen(["ip", "netns", "exec", self.hosts[key], *argv], env=env, **kwargs)
        self._procs.append(proc)
        return proc

    def start_echo(self, key: str, port: int, realtime: int = 5) -> subprocess.Popen[Any]:
        """Run the UDP echo probe server in host ``key`` and wait until it is bound.

        ``realtime`` is its SCHED_FIFO priority: below the daemon's default (10), above any worker.
        """
        argv = [sys.executable, "-m", "squall.shaping.testnet.echo_probe", "echo", "--port", str(port)]
        proc = self.spawn(key, [*argv, "--realtime", str(realtime)], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            raise OSError(f"echo server in {key} did not start: {line!r}")
        return proc

    def udp_socket(self, key: str) -> socket.socket:
        """A UDP socket living in host ``key``, usable from this process."""
        return socket_in(self.path(key), socket.AF_INET, socket.SOCK_DGRAM)

    def tcp_socket(self, key: str) -> socket.socket:
        """A TCP socket living in host ``key``."""
        return socket_in(self.path(key), socket.AF_INET, socket.SOCK_STREAM)

    def close(self) -> None:
        """Kill spawned processes, delete the namespaces (and with them links and rules)."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self._procs.clear()
        for name in self.hosts.values():
            try:
                _ip("netns", "del", name)
            except OSError as exc:
                logger.warning("deleting namespace %s: %s", name, exc)
        self.hosts.clear()
