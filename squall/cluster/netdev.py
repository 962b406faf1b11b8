"""Bytes a worker container's loopback device carried: traffic that stayed inside the container.

The ranks of one node (``--nproc-per-node K``) reach each other at the container's own address, which
the kernel routes over the loopback device, never over ``eth0``: that traffic is neither shaped nor in
the shaping backends' per-link counts. The kernel counts it on ``lo`` in the container's network
namespace (IP bytes, as the link counts are), and ``/proc/<pid>/net/dev`` shows any process's
namespace, so the host reads it from the container's init without entering anything.

Each packet on ``lo`` is counted once as sent (and once as received): :func:`loopback_bytes` gives the
sent count. A container's namespace, and its counters, are new after a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from squall.cluster.backend import ClusterBackend
from squall.cluster.errors import ClusterError
from squall.cluster.spec import LOCAL

logger = logging.getLogger(__name__)

PROC = Path("/proc")
LOOPBACK = "lo"


class NetDevError(ValueError):
    """``/proc/<pid>/net/dev`` could not be read or parsed; says which and why."""


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/net/dev``'s table: device -> (bytes received, bytes sent) (pure)."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines()[2:]:  # two header lines
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 16:
            raise NetDevError(f"not a /proc/net/dev row: {line!r}")
        try:
            out[name.strip()] = (int(fields[0]), int(fields[8]))
        except ValueError as exc:
            raise NetDevError(f"not a /proc/net/dev row: {line!r}") from exc
    return out


def loopback_sent(pid: int, proc: Path = PROC) -> int:
    """Bytes the loopback device of ``pid``'s network namespace has sent since the namespace was made."""
    path = proc / str(pid) / "net" / "dev"
    try:
        devices = parse_net_dev(path.read_text())
    except OSError as exc:
        raise NetDevError(f"cannot read {path}: {exc}") from exc
    if LOOPBACK not in devices:
        raise NetDevError(f"{path} lists no {LOOPBACK!r} device (devices: {sorted(devices)})")
    return devices[LOOPBACK][1]


class LoopbackMeter:
    """Each node's loopback bytes over one run, counted across churn.

    ``read(node)`` gives the node's counter now. :meth:`start` takes every node's base; :meth:`before_kill`
    banks what a node's namespace counted before churn takes it away (its restart starts from zero);
    :meth:`finish` gives each node's bytes over the run, None for a node whose counter could not be read.
    """

    def __init__(self, read: Callable[[int], int], nodes: int) -> None:
        self.read = read
        self.nodes = nodes
        self.base: list[int | None] = [None] * nodes  # each node's counter when the run (or its restart) began
        self.banked = [0] * nodes  # bytes counted by namespaces that churn took away
        self.errors: list[str] = []  # readings that failed

    def _read(self, node: int) -> int | None:
        try:
            return self.read(node)
        except (NetDevError, ClusterError, OSError) as exc:
            self.errors.append(f"node {node}: {exc}")
            logger.debug("reading node %d's loopback counter: %s", node, exc)
            return None

    def start(self) -> None:
        """Every node's counter now is its base."""
        self.base = [self._read(n) for n in range(self.nodes)]

    def before_kill(self, node: int) -> None:
        """Bank what ``node`` counted so far; its next namespace counts from zero."""
        now, base = self._read(node), self.base[node]
        if now is not None and base is not None:
            self.banked[node] += max(0, now - base)
            self.base[node] = 0
        else:
            self.base[node] = None

    def restarted(self, node: int) -> None:
        """``node``'s container runs again, in a new namespace (its counter started at zero)."""
        if self.base[node] is not None:
            self.base[node] = 0

    def finish(self) -> tuple[int | None, ...]:
        """Each node's loopback bytes over the run (None where a reading failed)."""
        out: list[int | None] = []
        for node in range(self.nodes):
            now, base = self._read(node), self.base[node]
            out.append(None if now is None or base is None else self.banked[node] + max(0, now - base))
        return tuple(out)


def loopback_reader(cluster: ClusterBackend) -> Callable[[int], int] | None:
    """How to read a node's loopback counter on ``cluster`` (None: its engine cannot say)."""
    if cluster.engine == LOCAL:
        return lambda node: loopback_sent(cluster.nodes[node].pid)
    return None
