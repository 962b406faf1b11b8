"""Emulated swarm nodes: Docker-in-Docker containers that join this engine's swarm as workers.

For testing the swarm engine across machines on one machine. Per run (run id ``r``), all labelled
``squall.run=r`` plus the owner labels, so ``squall gc`` removes what a dead run left:

* a bridge network ``squall-dind-r`` of their own;
* ``squall-dind-r-n<i>``: privileged containers of :func:`~.dind_image.ensure_node_image`'s image,
  each running its own ``dockerd`` (overlay2 on an anonymous volume, removed with the container),
  hostname ``sqd-r-n<i>``, the checkout bind-mounted read-only at the same path (the workers and
  agents mount the code from there, as on the host);
* the images the run needs (worker and node agent), streamed ``docker save | docker load`` into
  every node's engine once per node per run;
* the nodes' swarm entries: each node joins this engine's swarm as a worker and the manager labels
  it ``squall.run=r`` (``squall gc`` removes the entries of dead runs).

The host engine stays the manager; a swarm it is not in is initialised for the run and left again
at the end (:mod:`.membership`, with the run recorded like a cluster's). :meth:`DindNodes.close`
makes the nodes leave, removes them, their swarm entries and the network: nothing is left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from docker.errors import NotFound

from squall.cluster import lifecycle
from squall.cluster.engine import ENGINE_ERRORS
from squall.cluster.errors import ClusterError
from squall.cluster.image import REPO_ROOT
from squall.cluster.ownership import LABEL_RUN, Owner, new_run_id, state_root
from squall.cluster.spec import SWARM
from squall.cluster.swarm import membership
from squall.cluster.swarm.dind_image import ensure_node_image

logger = logging.getLogger(__name__)

LABEL_ROLE = "squall.role"
ROLE = "dind-node"
PREFIX = "squall-dind"
MAX_NODES = 8
SWARM_CLI = SWARM  # the docker CLI's subcommand has the engine's name
#: The nodes' engines put their containers' cgroups under their own container's (see the entrypoint).
CGROUP_ROOT = "/sys/fs/cgroup"
#: Linux capability names by bit number (linux/capability.h), as Docker's --cap-add takes them; up to
#: AUDIT_READ (37): Debian 12's engine (20.10) refuses the newer PERFMON, BPF and CHECKPOINT_RESTORE.
CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
                "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK",
                "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN",
                "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE",
                "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
                "BLOCK_SUSPEND", "AUDIT_READ")


@dataclass(frozen=True)
class DindSpec:
    """How many emulated nodes, and how long each may take to start its engine and join."""

    nodes: int = 2
    ready_timeout_s: float = 120.0
    load_timeout_s: float = 900.0  # streaming the images into one node

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or isinstance(self.nodes, bool) or not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"DindSpec: nodes={self.nodes!r}; allowed: an integer 1 .. {MAX_NODES}")
        for key in ("ready_timeout_s", "load_timeout_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"DindSpec: {key}={value!r}; allowed: a number of seconds > 0")


@dataclass
class Timings:
    """Seconds each phase of the start took (for the closing note's figures)."""

    image: float = 0.0
    containers: float = 0.0
    engines: float = 0.0
    load: float = 0.0
    join: float = 0.0
    load_per_node: dict[str, float] = field(default_factory=dict)


class DindNodes:
    """A run's Docker-in-Docker swarm workers (see the module docstring); a context manager."""

    def __init__(self, client: Any, spec: DindSpec | None = None, *, images: Sequence[str] = (),
                 run_id: str | None = None) -> None:
        self.client = client
        self.spec = spec or DindSpec()
        self.images = tuple(images)
        self.run_id = run_id or new_run_id()
        self.owner = Owner.me()
        self.network_name = f"{PREFIX}-{self.run_id}"
        self.names = [f"{PREFIX}-{self.run_id}-n{i}" for i in range(1, self.spec.nodes + 1)]
        self.hostnames = [f"sqd-{self.run_id}-n{i}" for i in range(1, self.spec.nodes + 1)]
        self.addresses: dict[str, str] = {}  # hostname -> its address on the nodes' bridge
        self.timings = Timings()
        self.image = ""
        self._joined_record = False
        self._closed = False

    @property
    def labels(self) -> dict[str, str]:
        """What every object of the run carries."""
        return {**self.owner.labels(self.run_id, state_root() / self.run_id), LABEL_ROLE: ROLE}

    # -- start ------------------------------------------------------------------------------------
    def start(self) -> DindNodes:
        """Image, swarm, network, nodes with their engines, images loaded, joined; all or nothing."""
        lifecycle.register(self)
        try:
            t0 = time.monotonic()
            self.image = ensure_node_image(self.client)
            self.timings.image = time.monotonic() - t0
            membership.join_or_init(self.client, self.run_id)
            self._joined_record = True
            t0 = time.monotonic()
            self._create()
            self.timings.containers = time.monotonic() - t0
            t0 = time.monotonic()
            self._each(self._await_engine)
            self.timings.engines = time.monotonic() - t0
            t0 = time.monotonic()
            if self.images:
                self._each(self._load)
            self.timings.load = time.monotonic() - t0
            t0 = time.monotonic()
            self._join()
            self.timings.join = time.monotonic() - t0
        except ENGINE_ERRORS as exc:
            self.close()
            raise ClusterError(f"emulated nodes of run {self.run_id}: the Docker engine failed: {exc}") from exc
        except BaseException:
            self.close()
            raise
        logger.info("%d Docker-in-Docker swarm nodes of run %s ready (%s)", self.spec.nodes, self.run_id, self.timings)
        return self

    def _create(self) -> None:
        self.client.networks.create(self.network_name, driver="bridge", labels=self.labels, check_duplicate=True)
        for name, hostname in zip(self.names, self.hostnames, strict=True):
            api = self.client.api
            binds = {str(REPO_ROOT): {"bind": str(REPO_ROOT), "mode": "ro"}}
            v2 = os.path.exists(f"{CGROUP_ROOT}/cgroup.controllers")
            if not v2:  # v1: the host's hierarchy, the node's engine nests under the node's own group
                binds[CGROUP_ROOT] = {"bind": CGROUP_ROOT, "mode": "rw"}
            host_config = api.create_host_config(
                init=True, network_mode=self.network_name, cap_add=host_capabilities(),
                security_opt=["seccomp=unconfined", "apparmor=unconfined"], binds=binds,
                cgroupns="private" if v2 else None,
            )
            # what `--security-opt systempaths=unconfined` does: the node's engine mounts a fresh /proc
            # in each of its containers, which the kernel refuses while parts of this one are masked
            host_config["MaskedPaths"] = []
            host_config["ReadonlyPaths"] = []
            created = api.create_container(self.image, name=name, hostname=hostname, labels=self.labels,
                                           host_config=host_config)
            api.start(created["Id"])
        for name, hostname in zip(self.names, self.hostnames, strict=True):
            attrs = self.client.api.inspect_container(name)
            self.addresses[hostname] = attrs["NetworkSettings"]["Networks"][self.network_name]["IPAddress"]

    def _each(self, call: Callable[[str], None]) -> None:
        with ThreadPoolExecutor(max_workers=len(self.names)) as pool:
            errors = [e for e in pool.map(lambda n: _error_of(call, n), self.names) if e is not None]
        if errors:
            raise ClusterError("; ".join(str(e) for e in errors))

    def exec(self, name: str, argv: Sequence[str], *, timeout: float = 60.0) -> str:
        """Run a command in node ``name``; its output, :class:`ClusterError` when it fails."""
        try:
            proc = subprocess.run(["docker", "exec", name, *argv], capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(f"{name}: {' '.join(argv)}: {exc}") from exc
        if proc.returncode != 0:
            raise ClusterError(f"{name}: {' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
        return proc.stdout

    def _await_engine(self, name: str) -> None:
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while True:
            try:
                self.exec(name, ["docker", "info", "--format", "{{.Driver}}"], timeout=20)
                return
            except ClusterError as exc:
                container = self.client.containers.get(name)
                if container.status != "running":
                    raise ClusterError(f"{name}: its engine exited: {container.logs(tail=20).decode()}") from exc
                if time.monotonic() > deadline:
                    raise ClusterError(f"{name}: its engine did not answer within {self.spec.ready_timeout_s} s: "
                                       f"{exc}") from exc
            time.sleep(0.5)

    def _load(self, name: str) -> None:
        """``docker save <images> | docker exec -i <node> docker load``: streamed, never on disk here."""
        t0 = time.monotonic()
        save = subprocess.Popen(["docker", "save", *self.images], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            load = subprocess.run(["docker", "exec", "-i", name, "docker", "load", "-q"], stdin=save.stdout,
                                  capture_output=True, text=True, timeout=self.spec.load_timeout_s, check=False)
        finally:
            assert save.stdout is not None
            save.stdout.close()
            try:
                save.wait(timeout=30)
            except subprocess.TimeoutExpired:
                save.kill()
                save.wait()
        if save.returncode != 0 or load.returncode != 0:
            why = (save.stderr.read().decode(errors="replace") if save.stderr else "") + load.stderr
            raise ClusterError(f"{name}: loading {', '.join(self.images)} failed: {why.strip()[-800:]}")
        if save.stderr:
            save.stderr.close()
        self.timings.load_per_node[name] = round(time.monotonic() - t0, 1)
        logger.info("%s: %s loaded in %.1f s", name, ", ".join(self.images), time.monotonic() - t0)

    def _join(self) -> None:
        info = self.client.info().get("Swarm", {})
        manager = info.get("NodeAddr")
        token = self.client.swarm.attrs["JoinTokens"]["Worker"]
        for name, hostname in zip(self.names, self.hostnames, strict=True):
            self.exec(name, ["docker", SWARM_CLI, "join", "--token", token, "--advertise-addr",
                             self.addresses[hostname], f"{manager}:2377"], timeout=self.spec.ready_timeout_s)
        deadline = time.monotonic() + self.spec.ready_timeout_s
        pending = set(self.hostnames)
        while pending:
            for node in self.client.nodes.list():
                hostname = node.attrs.get("Description", {}).get("Hostname")
                if hostname in pending and node.attrs.get("Status", {}).get("State") == "ready":
                    spec = dict(node.attrs["Spec"])
                    spec["Labels"] = {**(spec.get("Labels") or {}), LABEL_RUN: self.run_id, LABEL_ROLE: ROLE}
                    node.update(spec)
                    pending.discard(hostname)
            if pending and time.monotonic() > deadline:
                raise ClusterError(f"nodes {sorted(pending)} did not become ready swarm workers within "
                                   f"{self.spec.ready_timeout_s} s")
            if pending:
                time.sleep(0.5)

    # -- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Leave, remove the nodes, their swarm entries and the network; release the swarm. Safe twice."""
        if self._closed:
            return
        self._closed = True
        errors = remove_run(self.client, self.run_id, hostnames=self.hostnames)
        if self._joined_record:
            try:
                membership.release(self.client, self.run_id)
            except ClusterError as exc:
                errors.append(str(exc))
        lifecycle.unregister(self)
        if errors:
            raise ClusterError(f"emulated nodes of run {self.run_id} left things behind: {'; '.join(errors)}")

    def __enter__(self) -> DindNodes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def host_capabilities(status: str = "/proc/self/status") -> list[str]:
    """The capabilities this machine can grant: its bounding set, by name.

    Not ``--privileged``: that asks for every capability the kernel knows, and an engine that runs
    in a sandbox without some of them (here: no CAP_SYS_RESOURCE) cannot start such a container.
    """
    with open(status) as fh:
        line = next(x for x in fh if x.startswith("CapBnd:"))
    mask = int(line.split()[1], 16)
    return [name for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1]


def _error_of(call: Callable[[str], None], name: str) -> BaseException | None:
    try:
        call(name)
    except Exception as exc:
        return exc
    return None


def remove_run(client: Any, run_id: str, *, hostnames: Sequence[str] = ()) -> list[str]:
    """Remove run ``run_id``'s emulated nodes: leave, containers (with their volume), swarm entries, network.

    Also what ``squall gc`` runs for a dead run. Returns what could not be removed.
    """
    errors: list[str] = []
    flt = {"label": [f"{LABEL_RUN}={run_id}", f"{LABEL_ROLE}={ROLE}"]}
    try:
        containers = client.containers.list(all=True, filters=flt)
    except ENGINE_ERRORS as exc:
        return [f"listing the emulated nodes: {exc}"]
    every_hostname = {*hostnames, *(c.attrs.get("Config", {}).get("Hostname", "") for c in containers)}
    for c in containers:  # leaving first lets the manager see them go at once
        if c.status == "running":
            with contextlib.suppress(*ENGINE_ERRORS, OSError, subprocess.SubprocessError):
                subprocess.run(["docker", "exec", c.name, "docker", SWARM_CLI, "leave", "--force"],
                               capture_output=True, timeout=30, check=False)
    for c in containers:
        try:
            c.remove(force=True, v=True)
        except NotFound:
            pass
        except ENGINE_ERRORS as exc:
            errors.append(f"container {c.name}: {exc}")
    errors += remove_swarm_entries(client, run_id, every_hostname)
    try:
        for net in client.networks.list(filters=flt):
            with contextlib.suppress(NotFound):
                net.remove()
    except ENGINE_ERRORS as exc:
        errors.append(f"network {PREFIX}-{run_id}: {exc}")
    return errors


def remove_swarm_entries(client: Any, run_id: str | None, hostnames: Sequence[str] | set[str] = ()) -> list[str]:
    """``docker node rm --force`` the manager's entries of a run's nodes (labelled, or by hostname).

    With ``run_id=None`` every labelled entry of an emulated node goes (gc decides which runs).
    Nothing to do when this engine manages no swarm.
    """
    errors: list[str] = []
    if membership.swarm_state(client) != "active" or not membership.is_manager(client):
        return errors
    try:
        nodes = client.nodes.list()
    except ENGINE_ERRORS as exc:
        return [f"listing the swarm's nodes: {exc}"]
    for node in nodes:
        labels = node.attrs.get("Spec", {}).get("Labels") or {}
        hostname = node.attrs.get("Description", {}).get("Hostname", "")
        ours = labels.get(LABEL_ROLE) == ROLE and (run_id is None or labels.get(LABEL_RUN) == run_id)
        if not ours and hostname not in hostnames:
            continue
        if node.attrs.get("ManagerStatus"):
            continue  # never the manager itself
        try:
            node.remove(force=True)
        except NotFound:
            pass
        except ENGINE_ERRORS as exc:
            errors.append(f"swarm node {hostname}: {exc}")
    return errors


def node_runs(client: Any) -> dict[str, str]:
    """Swarm node id -> run id, for every entry of an emulated node the manager holds."""
    if membership.swarm_state(client) != "active" or not membership.is_manager(client):
        return {}
    out = {}
    for node in client.nodes.list(filters={"node.label": f"{LABEL_ROLE}={ROLE}"}):
        run = (node.attrs.get("Spec", {}).get("Labels") or {}).get(LABEL_RUN)
        if run:
            out[node.id] = run
    return out
