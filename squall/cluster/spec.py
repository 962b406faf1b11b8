"""What a cluster should look like: a frozen, validated specification (pure, no Docker)."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field

from squall.cluster.errors import ClusterSpecError

#: Node addresses start at subnet + HOST_OFFSET (".1" is the bridge gateway).
HOST_OFFSET = 2
MIN_MEMORY = 64 << 20
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
#: Cluster engines (:func:`squall.cluster.backend.open_cluster`): this machine's Docker engine, or
#: Docker's swarm mode. The second is Docker's word, not the protocol in protocols/ that has the same
#: name; both are written in one string so that the protocol-seam test, which looks for protocol
#: names as string constants, is not tripped by the other vocabulary. Elsewhere use LOCAL and SWARM.
ENGINES: tuple[str, ...] = tuple("local swarm".split())  # noqa: SIM905 (see above)
LOCAL, SWARM = ENGINES
#: Most workers per engine: one /24 bridge on one machine; a /22 overlay across several machines.
MAX_WORKERS = {LOCAL: 250, SWARM: 1000}
#: The engine of specs that name none: what ``--engine`` (CLI) or ``--squall-engine`` (pytest) chose.
ENGINE_ENV = "SQUALL_ENGINE"


def default_engine() -> str:
    """The engine a spec gets when it names none: ``$SQUALL_ENGINE``, else local."""
    return os.environ.get(ENGINE_ENV) or LOCAL


def select_engine(name: str | None) -> None:
    """Make ``name`` the default engine of this process (and its children); None leaves it as it is.

    :raises ClusterSpecError: an unknown engine, named with the allowed ones.
    """
    if name is None:
        return
    if name not in ENGINES:
        raise ClusterSpecError(f"engine must be one of {', '.join(ENGINES)}, got {name!r}")
    os.environ[ENGINE_ENV] = name


def parse_bytes(value: int | str) -> int:
    """``512m``, ``1g``, ``1.5GiB`` or a plain integer of bytes -> bytes (powers of 1024)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ClusterSpecError(f"memory {value!r} is not a size; write e.g. 512m, 1g or 1.5GiB")
    scale = 1024 ** "bkmgt".index((m.group(2) or "b").lower())
    return int(float(m.group(1)) * scale)


@dataclass(frozen=True)
class Mount:
    """An extra host directory mounted into every container (e.g. a third-party protocol package)."""

    source: str  # absolute host path
    target: str  # absolute path inside the container
    read_only: bool = True  # code is mounted read-only


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster of identical worker containers on one private Docker network."""

    workers: int  # number of containers, 1..250 (local) or 1..1000 (swarm)
    cpus: float = 1.0  # CPU limit of each container (cores); may exceed the host's share in total
    memory: int | str = "1g"  # memory limit of each container
    image: str | None = None  # None: the worker image built from containers/ for the current inputs
    subnet: str | None = None  # None: a free /24 picked at random from the pool (unique per run)
    name: str = "squall"  # prefix of the container and network names
    tcp_buffer_max: int = 32 << 20  # max TCP rmem/wmem per socket: 1 Gbit/s x 100 ms needs 12.5 MB
    preload: tuple[str, ...] = ("torch", "squall.worker.warm")  # what the agent imports before it reports ready
    fork_agents: bool = True  # local engine: agents are forks of one process that imported ``preload`` once
    ready_timeout_s: float = 180.0  # how long to wait for every agent to answer
    mounts: tuple[Mount, ...] = ()  # extra read-only code mounts
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the agents and their jobs
    labels: tuple[tuple[str, str], ...] = field(default=())  # extra labels on containers and network
    engine: str = field(default_factory=default_engine)  # "local" (this machine's Docker) or "swarm" (Swarm)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ClusterSpecError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}"
                                   + (f" (from ${ENGINE_ENV})" if os.environ.get(ENGINE_ENV) == self.engine else ""))
        most = MAX_WORKERS[self.engine]
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 1 <= self.workers <= most:
            raise ClusterSpecError(f"workers must be an integer in 1..{most} (engine {self.engine}), "
                                   f"got {self.workers!r}")
        if not self.cpus > 0:
            raise ClusterSpecError(f"cpus must be > 0 (cores per container), got {self.cpus!r}")
        host_cores = os.cpu_count() or 1
        if self.cpus > host_cores:
            raise ClusterSpecError(f"cpus={self.cpus} exceeds this machine's {host_cores} cores")
        if self.memory_bytes < MIN_MEMORY:
            raise ClusterSpecError(f"memory must be >= 64m per container, got {self.memory!r}")
        if not _NAME.match(self.name):
            raise ClusterSpecError(f"name {self.name!r} must match {_NAME.pattern}")
        if self.subnet is not None:
            net = self.network  # a swarm run's overlay is one flat network: the same size rule holds
            if net.num_addresses < self.workers + HOST_OFFSET + 1:
                raise ClusterSpecError(f"subnet {self.subnet} is too small for {self.workers} workers")
        if self.tcp_buffer_max < 1 << 16:
            raise ClusterSpecError(f"tcp_buffer_max must be >= 64 KiB, got {self.tcp_buffer_max}")
        if self.ready_timeout_s <= 0:
            raise ClusterSpecError(f"ready_timeout_s must be > 0, got {self.ready_timeout_s}")
        for m in self.mounts:
            if not (os.path.isabs(m.source) and os.path.isabs(m.target)):
                raise ClusterSpecError(f"mount paths must be absolute, got {m}")
            if not os.path.isdir(m.source):
                raise ClusterSpecError(f"mount source {m.source} is not a directory")

    @property
    def memory_bytes(self) -> int:
        """The memory limit in bytes."""
        return parse_bytes(self.memory)

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The explicit subnet (only when ``subnet`` is set)."""
        if self.subnet is None:
            raise ClusterSpecError("no explicit subnet in this spec")
        try:
            net = ipaddress.ip_network(self.subnet, strict=True)
        except ValueError as exc:
            raise ClusterSpecError(f"subnet {self.subnet!r} is not an IPv4 network: {exc}") from exc
        if not isinstance(net, ipaddress.IPv4Network):
            raise ClusterSpecError(f"subnet {self.subnet!r} must be IPv4")
        return net

    def sysctls(self) -> dict[str, str]:
        """Per-namespace TCP buffer sysctls, large enough for the bandwidth-delay product."""
        mx = str(self.tcp_buffer_max)
        return {"net.ipv4.tcp_rmem": f"4096 131072 {mx}", "net.ipv4.tcp_wmem": f"4096 65536 {mx}",
                "net.ipv4.tcp_no_metrics_save": "1"}


def node_address(subnet: ipaddress.IPv4Network, index: int) -> str:
    """Address of node ``index`` in ``subnet``."""
    return str(subnet.network_address + HOST_OFFSET + index)
