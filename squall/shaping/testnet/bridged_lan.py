"""Hosts on one bridge, like a cluster's containers, in plain namespaces: for tests and benchmarks (root).

Built on :class:`squall.shaping.testnet.veth_pairs.Testbed` (names ``<prefix>-<hex>-<key>``, processes tracked,
everything deleted by ``close``, also after an exception)::

    h0 (10.78.0.2) ─┐
    h1 (10.78.0.3) ─┼─ br0 in namespace "sw"
    ...            ─┘

Each host has one ``eth0`` (a veth whose peer is a bridge port), so its :class:`~squall.shaping.base.Endpoint`
looks exactly like a container's. Addresses are ``10.78.<i // 250>.<i % 250 + 2>/16``.
"""

from __future__ import annotations

import subprocess
from typing import Any, Self

from squall.shaping.base import Endpoint
from squall.shaping.kernel.iptables import normalize_save
from squall.shaping.testnet.echo_probe import ProbeResult, probe, realtime
from squall.shaping.testnet.veth_pairs import Testbed

NETNS_AWARE = frozenset({"tc", "ip"})  # tools that take -n NAME to run in a named namespace
PROBE_PRIORITY = 5  # SCHED_FIFO of the probing thread: as the echo servers, below the delay daemon


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


class BridgedLan:
    """``n`` hosts on a bridge; a context manager that deletes everything on exit."""

    def __init__(self, n: int, prefix: str = "squall-test"):
        self.bed = Testbed(prefix=prefix)
        self.endpoints: list[Endpoint] = []
        self._keys: list[str] = []  # testbed key of each host (a renewed host gets a new one)
        try:
            self._sw = sw = self.bed.add_host("sw")
            _ip("-n", sw, "link", "add", "br0", "type", "bridge")
            _ip("-n", sw, "link", "set", "br0", "up")
            for i in range(n):
                self._add(i, sw)
        except BaseException:
            self.bed.close()
            raise

    def _add(self, i: int, sw: str, key: str | None = None) -> Endpoint:
        key = key or f"h{i}"
        host = self.bed.add_host(key)
        address = f"10.78.{i // 250}.{i % 250 + 2}"
        _ip("-n", sw, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", host)
        _ip("-n", sw, "link", "set", f"p{i}", "master", "br0", "up")
        _ip("-n", host, "addr", "add", f"{address}/16", "dev", "eth0")
        _ip("-n", host, "link", "set", "eth0", "up")
        endpoint = Endpoint(i, address, self.bed.path(key))
        if i < len(self.endpoints):
            self.endpoints[i], self._keys[i] = endpoint, key
        else:
            self.endpoints.append(endpoint)
            self._keys.append(key)
        return endpoint

    def renew(self, i: int) -> Endpoint:
        """Host ``i`` "restarts": a new namespace with the same address takes its place on the bridge.

        The old namespace stays (without its eth0) until :meth:`close`, like a container's that a
        helper still holds.
        """
        _ip("-n", self._sw, "link", "del", f"p{i}")  # takes the old eth0 with it
        return self._add(i, self._sw, key=f"{self._keys[i]}r")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the processes, delete the namespaces."""
        self.bed.close()

    def ns(self, i: int) -> str:
        """Name of host ``i``'s namespace."""
        return self.bed.hosts[self._keys[i]]

    def run(self, i: int, argv: list[str], stdin: str | None = None) -> str:
        """Run ``argv`` in host ``i`` and return its output; raise on failure."""
        return self.run_in(self.ns(i), argv, stdin)

    @staticmethod
    def run_in(ns: str, argv: list[str], stdin: str | None = None) -> str:
        """Run ``argv`` in the namespace named ``ns``.

        ``tc`` and ``ip`` enter it themselves (``-n``), anything else through ``ip netns exec``, which
        also remounts ``/sys`` for the namespace: one process fewer and no mounts, what a test that
        reads the kernel's state dozens of times pays for most under the netem VM's emulated CPUs.
        """
        command = [argv[0], "-n", ns, *argv[1:]] if argv[0] in NETNS_AWARE else ["ip", "netns", "exec", ns, *argv]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, check=True).stdout

    def key(self, i: int) -> str:
        """The testbed key of host ``i`` (for ``bed.spawn`` and the socket helpers)."""
        return self._keys[i]

    def start_echo(self, i: int, port: int) -> None:
        """The UDP echo probe server in host ``i``."""
        self.bed.start_echo(self._keys[i], port)

    def probe(self, src: int, dst: int, port: int, **kwargs: Any) -> ProbeResult:
        """Application-level UDP probe from host ``src`` to the echo server of host ``dst``."""
        sock = self.bed.udp_socket(self._keys[src])
        try:
            with realtime(PROBE_PRIORITY):
                return probe(sock, (self.endpoints[dst].address, port), **kwargs)
        finally:
            sock.close()

    def snapshot(self) -> list[str]:
        """Per host: qdiscs, classes, filters, links and (normalized) iptables, to compare before and after."""
        out = []
        for i in range(len(self.endpoints)):
            cmds = [["tc", "qdisc", "show"], ["tc", "class", "show", "dev", "eth0"],
                    ["tc", "filter", "show", "dev", "eth0"], ["ip", "-o", "link", "show"]]
            out.append("".join(self.run(i, cmd) for cmd in cmds) + normalize_save(self.run(i, ["iptables-save"])))
        return out
