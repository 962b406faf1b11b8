"""The ``swarm`` engine: a run's workers as one Docker Swarm service, with a node agent on every node.

Per run (all labelled ``squall.run=<run id>`` plus the owner labels, so ``squall gc`` finds them):

* a Swarm secret holding a random token: the node agents read it from /run/secrets and refuse
  any request without it;
* an attachable, internal overlay network on a subnet from Squall's pool, sized for the workers
  (a /22 holds 1000; the workers never reach outside it);
* ``<name>-<run>-node-agent``: a global service (one task per node) on the host network, with
  NET_ADMIN, SYS_ADMIN, SYS_PTRACE and SYS_NICE, the host's /proc, the node's Docker socket and
  Docker's network namespaces (the overlay bridge's is among them), the code and the run's state
  directory (:mod:`.node_agent`);
* ``<name>-<run>-w``: the workers, a replicated service with one replica per worker, DNS
  round-robin endpoints (no IPVS needed), no restart, CPU and memory limits and the TCP sysctls;
  replica ``slot`` is worker ``slot - 1`` and mounts ``<run dir>/w<slot>`` at /squall/run.

If the engine is in no swarm, one is initialised for the run and left again at teardown
(:mod:`.membership`); a swarm that was there is left as it was. Jobs, the job results and the
metrics files work as on the local engine: the harness talks to each worker's job agent through
its node's agent; a worker's directory is on its node, and when that node is not this host the
agent's ``fetch`` copies each job's files here as the job ends (:class:`SwarmJobHandle`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import secrets
import shutil
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from docker.errors import APIError, NotFound
from docker.types import (
    EndpointSpec,
    IPAMConfig,
    IPAMPool,
    Mount,
    Resources,
    RestartPolicy,
    SecretReference,
    ServiceMode,
)

from squall.cluster import lifecycle
from squall.cluster.agent_client import AgentClient
from squall.cluster.cluster import RUN_MOUNT, SRC_MOUNT, Cluster, JobHandle, Node, NodeState
from squall.cluster.engine import ENGINE_ERRORS
from squall.cluster.errors import ClusterError
from squall.cluster.image import REPO_ROOT, current_worker_tag
from squall.cluster.jobs import JobResult
from squall.cluster.ownership import write_owner
from squall.cluster.program_image import cached_context
from squall.cluster.spec import SWARM, ClusterSpec
from squall.cluster.spec import Mount as ClusterMount
from squall.cluster.subnets import pick_free
from squall.cluster.swarm import folders, membership
from squall.cluster.swarm.agent_image import ensure_agent_image
from squall.cluster.swarm.folders import FolderError
from squall.cluster.swarm.job_files import write_job
from squall.cluster.swarm.remote import NodeLink, Placed, RelayAgentClient, SwarmShaper, offsets
from squall.cluster.swarm.wire import NodeCommand
from squall.shaping.base import Endpoint, Shaper

logger = logging.getLogger(__name__)

HOST_PROC = "/host/proc"
CAPS = ("CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_NICE")
LABEL_ROLE = "squall.role"  # "workers", "node-agent", "token", "network"
POLL_S = 0.3


def subnet_prefix(workers: int) -> int:
    """The longest prefix whose subnet holds ``workers`` plus network, gateway and broadcast (at most /24)."""
    return min(24, 32 - math.ceil(math.log2(workers + 3)))


def free_port() -> int:
    """A TCP port free on this host now (the agents listen on it on every node)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class SwarmNode(Node):
    """A worker of a swarm run: where it runs, and its job agent reached through that node's agent."""

    host: str = ""  # the swarm node (hostname) it runs on
    link: NodeLink | None = None  # that node's agent
    mirrored: bool = False  # run_dir is a copy on this host, filled through the agent (the node is elsewhere)

    @property
    def netns_path(self) -> str:
        """Where the namespace is, as a location: only the node's agent resolves it (after the cgroup check)."""
        return f"swarm://{self.host}/{self.container_id[:12]}"

    @property
    def endpoint(self) -> Endpoint:
        """This worker as the shaping plan sees it."""
        return Endpoint(self.index, self.address, self.netns_path)

    @property
    def agent(self) -> AgentClient:
        """The job agent, through the node agent (same interface)."""
        assert self.link is not None
        return RelayAgentClient(self.link, self.index + 1)  # type: ignore[return-value]

    @property
    def placed(self) -> Placed:
        """What the node agents need to find this worker."""
        return Placed(self.index, self.address, self.host, self.container_id)


class SwarmJobHandle(JobHandle):
    """A job on a swarm: each node's outputs are fetched through its agent when they are elsewhere."""

    cluster: SwarmCluster

    def _wait_one(self, index: int) -> JobResult:
        result = super()._wait_one(index)
        node = self.cluster.nodes[index]
        if isinstance(node, SwarmNode) and node.mirrored:  # cancelled too: a stopped rank's logs matter
            try:
                self.cluster.fetch(node, self.job_id)
            except ClusterError as exc:
                logger.warning("worker %d: fetching job %s's files: %s", index, self.job_id, exc)
        return result


class SwarmCluster(Cluster):
    """A run's workers as a Swarm service, shaped by the node agents (see the module docstring)."""

    engine = SWARM

    def __init__(self, spec: ClusterSpec, *, client: Any | None = None, run_id: str | None = None,
                 state_dir: Path | None = None) -> None:
        super().__init__(spec, client=client, run_id=run_id, state_dir=state_dir)
        prefix = f"{spec.name}-{self.run_id}"
        self.worker_service = f"{prefix}-w"
        self.agent_service = f"{prefix}-node-agent"
        self.secret_name = f"{prefix}-token"
        self.links: dict[str, NodeLink] = {}
        self.offsets: dict[str, float] = {}
        self.initialised_swarm = False
        self._token = secrets.token_hex(32)
        self._port = 0
        self._service_ids: list[str] = []
        self._secret_id: str | None = None
        self._joined = False
        #: copy job outputs through the agents: None = for workers on other machines only; True = for
        #: all (a one-node test of the path a multi-machine run takes)
        self.mirror: bool | None = None
        #: where the workers may run: Swarm placement constraints (e.g. ``node.labels.squall.role==dind-node``)
        #: and at most this many per node (None: no limit), set before :meth:`start`
        self.constraints: tuple[str, ...] = ()
        self.max_per_node: int | None = None
        self.lacking_image: tuple[str, ...] = ()  # nodes whose engine lacks the workers' image
        self._image = ""

    # -- creation ---------------------------------------------------------------------------------
    def start(self) -> SwarmCluster:
        """Swarm, secret, network, agents, workers; wait for every job agent; all or nothing."""
        if self._started:
            raise ClusterError(f"cluster {self.run_id} was already started")
        self._started = True
        image = self._check_image()
        agent_image = ensure_agent_image(self.client)
        lifecycle.register(self)
        t0 = time.monotonic()
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            write_owner(self.state_dir, self.owner, self.run_id)
            self.initialised_swarm = membership.join_or_init(self.client, self.run_id)
            self._joined = True
            self._create_secret()
            self._create_overlay()
            self._start_agents(agent_image)
            deadline = time.monotonic() + self.spec.ready_timeout_s
            self._await_agents(deadline)
            self.offsets = offsets(self.links)
            self._check_image_on_nodes(image)
            self._copy_mounts()
            self._start_workers(image)
            self.nodes = self._await_workers(deadline)
            self._parallel([partial(self._await_agent, n, deadline) for n in self.nodes], interrupt=self._stop.set)
        except ENGINE_ERRORS as exc:
            self._close_quietly()
            raise ClusterError(f"cluster {self.run_id}: the Docker engine failed while creating it: {exc}") from exc
        except BaseException:
            self._close_quietly()
            raise
        logger.info("swarm cluster %s: %d workers on %d node(s), %s, ready in %.1f s (clock offsets %s)",
                    self.run_id, len(self.nodes), len(self.links), self.subnet, time.monotonic() - t0, self.offsets)
        return self

    def _labels(self, role: str) -> dict[str, str]:
        return {**self.labels, LABEL_ROLE: role}

    def _create_secret(self) -> None:
        secret = self.client.secrets.create(name=self.secret_name, data=self._token.encode(),
                                            labels=self._labels("token"))
        self._secret_id = secret.id

    def _create_overlay(self) -> None:
        rng = random.Random()
        prefix = subnet_prefix(self.spec.workers)
        for attempt in range(12):
            candidate = self.spec.network if self.spec.subnet else pick_free(self._used_subnets(), rng=rng,
                                                                             prefix=prefix)
            ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(candidate))])
            try:
                net = self.client.networks.create(self.network_name, driver="overlay", attachable=True,
                                                  internal=True, ipam=ipam, labels=self._labels("network"),
                                                  check_duplicate=True)
            except APIError as exc:
                if self.spec.subnet is None and "overlap" in str(exc).lower() and attempt < 11:
                    continue
                raise ClusterError(f"cannot create overlay network {self.network_name} on {candidate}: {exc}") \
                    from exc
            self._network_id = net.id
            self.subnet = candidate
            return

    def _start_agents(self, image: str) -> None:
        self._port = free_port()
        mount_root = self.state_dir.parent.parent  # exists on every node (/var/tmp for root); the agent makes the rest
        env = {"SQUALL_RUN": self.run_id, "SQUALL_AGENT_PORT": str(self._port),
               "SQUALL_TOKEN_FILE": "/run/secrets/squall-token", "SQUALL_WORKER_SERVICE": self.worker_service,
               "SQUALL_NETWORK": self.network_name, "SQUALL_RUN_DIR": str(self.state_dir),
               "SQUALL_WORKERS": str(self.spec.workers), "SQUALL_OWNER_UID": str(os.getuid()),
               "SQUALL_OWNER_GID": str(os.getgid()), "SQUALL_HOST_PROC": HOST_PROC, "PYTHONPATH": SRC_MOUNT}
        mounts = [Mount(HOST_PROC, "/proc", type="bind", read_only=True),
                  Mount("/var/run/docker.sock", "/var/run/docker.sock", type="bind"),
                  Mount(SRC_MOUNT, str(REPO_ROOT), type="bind", read_only=True),
                  Mount(str(mount_root), str(mount_root), type="bind")]
        assert self._secret_id is not None
        secret = SecretReference(self._secret_id, self.secret_name, filename="squall-token", uid="0", gid="0",
                                 mode=0o400)
        service = self.client.services.create(
            image, command=["python3", "-m", "squall.cluster.swarm.node_agent"], name=self.agent_service,
            env=[f"{k}={v}" for k, v in env.items()], mounts=mounts, secrets=[secret], cap_add=list(CAPS),
            user="0:0", init=True, networks=["host"], mode=ServiceMode("global"), labels=self._labels("node-agent"),
            container_labels=self._labels("node-agent"), restart_policy=RestartPolicy(condition="none"),
        )
        self._service_ids.append(service.id)

    def _swarm_nodes(self) -> list[tuple[str, str]]:
        """(hostname, address) of every ready, active node: one agent task runs on each."""
        out = []
        for n in self.client.nodes.list():
            attrs = n.attrs
            if attrs.get("Status", {}).get("State") != "ready" or attrs.get("Spec", {}).get("Availability") != "active":
                continue
            addr = attrs.get("Status", {}).get("Addr") or ""
            if addr in ("", "0.0.0.0"):  # a manager may report 0.0.0.0: its advertise address is elsewhere
                addr = (attrs.get("ManagerStatus") or {}).get("Addr", "").rsplit(":", 1)[0]
            out.append((attrs.get("Description", {}).get("Hostname", ""), addr))
        return out

    def _task_errors(self, service: str) -> list[str]:
        errors = []
        for task in self.client.api.tasks(filters={"service": service}):
            status = task.get("Status", {})
            if status.get("State") in ("failed", "rejected"):
                errors.append(f"{status.get('State')}: {status.get('Err') or status.get('Message')}")
        return errors

    def _await_agents(self, deadline: float) -> None:
        wanted = self._swarm_nodes()
        while True:
            self._check_stop("node agents")
            for hostname, addr in wanted:
                if hostname in self.links:
                    continue
                link = NodeLink(hostname, addr, self._port, self._token)
                with contextlib.suppress(ClusterError):
                    answer = link.call(NodeCommand.HELLO, timeout=2)
                    self.links[answer["node"]] = replace(link, node=str(answer["node"]))
            if len(self.links) >= len(wanted):
                return
            errors = self._task_errors(self.agent_service)
            if errors:
                raise ClusterError(f"node agent of run {self.run_id} failed: {'; '.join(errors)}")
            if time.monotonic() > deadline:
                raise ClusterError(f"node agents answered on {sorted(self.links)} but not on every node of "
                                   f"{[h for h, _ in wanted]} within {self.spec.ready_timeout_s} s")
            time.sleep(POLL_S)

    def _start_workers(self, image: str) -> None:
        threads = str(max(1, math.floor(self.spec.cpus)))
        env = {"SQUALL_RUN": self.run_id, "SQUALL_NODE_SLOT": "{{.Task.Slot}}",
               "SQUALL_WORKERS": str(self.spec.workers), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
               **dict(self.spec.env)}
        mounts = [Mount(SRC_MOUNT, str(REPO_ROOT), type="bind", read_only=True),
                  Mount(RUN_MOUNT, f"{self.state_dir}/w{{{{.Task.Slot}}}}", type="bind")]
        copied = iter(range(len(self.spec.mounts)))
        mounts += [Mount(m.target, str(folders.copy_dir(self.state_dir, next(copied))), type="bind", read_only=True)
                   if self._is_copied(m) else Mount(m.target, m.source, type="bind", read_only=m.read_only)
                   for m in self.spec.mounts]
        command = ["python3", "-m", "squall.worker.agent", "--socket", f"{RUN_MOUNT}/agent.sock",
                   "--preload", ",".join(self.spec.preload)]
        service = self.client.services.create(
            image, command=command, name=self.worker_service, env=[f"{k}={v}" for k, v in env.items()],
            mounts=mounts, hostname="w{{.Task.Slot}}", user=f"{os.getuid()}:{os.getgid()}", init=True,
            sysctls=self.spec.sysctls(), networks=[self.network_name],
            mode=ServiceMode("replicated", replicas=self.spec.workers),
            resources=Resources(cpu_limit=int(self.spec.cpus * 1e9), mem_limit=self.spec.memory_bytes),
            restart_policy=RestartPolicy(condition="none"), endpoint_spec=EndpointSpec(mode="dnsrr"),
            labels=self._labels("workers"), container_labels=self._labels("workers"),
            constraints=list(self.constraints) or None, maxreplicas=self.max_per_node,
        )
        self._service_ids.append(service.id)

    def _survey(self) -> dict[int, tuple[str, dict[str, Any]]]:
        """Slot -> (node, the agent's record of its running, verified worker)."""
        found: dict[int, tuple[str, dict[str, Any]]] = {}
        for node, link in self.links.items():
            for w in link.call(NodeCommand.WORKERS)["workers"]:
                if w["running"] and w["verified"] and w["address"]:
                    found[int(w["slot"])] = (node, w)
        return found

    def _await_workers(self, deadline: float) -> list[Node]:
        while True:
            self._check_stop("workers")
            found = self._survey()
            if all(slot in found for slot in range(1, self.spec.workers + 1)):
                return [self._node_of(slot - 1, *found[slot]) for slot in range(1, self.spec.workers + 1)]
            errors = self._task_errors(self.worker_service)
            if errors:
                lacking = f" (nodes without the image {self._image}: {', '.join(self.lacking_image)})" \
                    if self.lacking_image else ""
                raise ClusterError(f"workers of run {self.run_id} failed to start: {'; '.join(errors[:3])}{lacking}")
            if time.monotonic() > deadline:
                raise ClusterError(f"only {len(found)} of {self.spec.workers} workers ran within "
                                   f"{self.spec.ready_timeout_s} s")
            time.sleep(POLL_S)

    def _node_of(self, index: int, node: str, w: dict[str, Any]) -> SwarmNode:
        mirrored = self.mirror if self.mirror is not None else node != socket.gethostname()
        run_dir = self.state_dir / ("collected" if mirrored else "") / f"w{index + 1}"
        return SwarmNode(index, str(w["name"]), str(w["container_id"]), str(w["address"]), 0, run_dir,
                         host=node, link=self.links[node], mirrored=mirrored)

    def fetch(self, node: SwarmNode, job_id: str, *, every: bool = True) -> None:
        """Copy a job's files from the worker's node into ``node.run_dir`` here (:mod:`.job_files`; without
        ``every``, its text files only: a running program's lines)."""
        assert node.link is not None
        answer = node.link.call(NodeCommand.FETCH, slot=node.index + 1, job_id=job_id, every=every, timeout=60)
        try:
            left_out = write_job(answer, node.run_dir / "jobs" / job_id)
        except (FolderError, ValueError, OSError) as exc:
            raise ClusterError(f"worker {node.index}: job {job_id}'s files from node {node.host}: {exc}") from exc
        if left_out and every:
            logger.warning("worker %d: job %s: %d file(s) too large to copy from node %s, left there: %s", node.index,
                           job_id, len(left_out), node.host, ", ".join(left_out[:5]))

    def sync_job(self, index: int, job_id: str) -> None:
        """While a job runs: its text files (a program's stdout and stderr) copied here if its worker is on
        another machine, so what watches them (the hang watch, the live display) sees them grow."""
        node = self._swarm_node(index)
        if node.mirrored:
            self.fetch(node, job_id, every=False)

    def _check_image_on_nodes(self, image: str) -> None:
        """Which nodes lack the workers' image: Swarm pulls nothing from here, each node needs its own copy.
        A program image whose build context was kept (:func:`~squall.cluster.program_image.cached_context`)
        is built on those nodes from a copy of it; any other is named if the workers fail to start."""
        self._image = image
        answers = {node: link.call(NodeCommand.IMAGE, name=image) for node, link in self.links.items()}
        lacking = sorted(node for node, a in answers.items() if not a["present"])
        context = cached_context(image)
        base = current_worker_tag(self.client)
        if lacking and context is not None and base is not None:
            t0 = time.monotonic()
            self._parallel([partial(self._build_on, self.links[node], context, image, base) for node in lacking],
                           interrupt=self._stop.set)
            logger.info("%s built on %s in %.1f s", image, ", ".join(lacking), time.monotonic() - t0)
            lacking = []
        self.lacking_image = tuple(lacking)
        if lacking:
            logger.warning("image %s is not on swarm node(s) %s: no worker can run there (load it: docker save | "
                           "docker load)", image, ", ".join(lacking))

    @staticmethod
    def _build_on(link: NodeLink, context: Path, image: str, base: str) -> None:
        """Copy a program image's build context to one node and have its agent build the image there."""
        try:
            for dirs, pieces in folders.requests_for(context):
                link.call(NodeCommand.PUT_FILES, image=True, dirs=dirs, pieces=pieces, timeout=120)
        except FolderError as exc:
            raise ClusterError(f"copying {image}'s build context to node {link.node}: {exc}") from exc
        link.call(NodeCommand.BUILD, tag=image, base=base, timeout=960)

    @staticmethod
    def _is_copied(mount: ClusterMount) -> bool:
        return folders.is_copied(mount.source, mount.read_only, REPO_ROOT)

    def _copy_mounts(self) -> None:
        """Copy each read-only mount outside the checkout (a program's snapshot, a third party's code) to every
        node, through its agent (:mod:`.folders`): the workers mount the node's copy."""
        copied = [m for m in self.spec.mounts if self._is_copied(m)]
        if not copied:
            return
        if len(copied) > folders.MAX_MOUNTS:
            raise ClusterError(f"{len(copied)} folders to copy to the nodes; at most {folders.MAX_MOUNTS}")
        t0 = time.monotonic()

        def one(link: NodeLink) -> int:
            sent = 0
            for k, m in enumerate(copied):
                for dirs, pieces in folders.requests_for(Path(m.source)):
                    link.call(NodeCommand.PUT_FILES, mount=k, dirs=dirs, pieces=pieces, timeout=120)
                    sent += sum(len(p["data"]) for p in pieces)
            return sent

        try:
            sent = self._parallel([partial(one, link) for link in self.links.values()], interrupt=self._stop.set)
        except FolderError as exc:
            raise ClusterError(f"copying a folder to the swarm's nodes: {exc}") from exc
        logger.info("%d folder(s) copied to %d node(s) in %.1f s (%.1f MB of base64 each)", len(copied),
                    len(self.links), time.monotonic() - t0, max(sent, default=0) / 1e6)

    def start_job(self, entry: str, config: dict[str, Any] | None = None, *, nodes: Sequence[int] | None = None,
                  timeout: float = 120.0, seed: int = 0,
                  per_node: Mapping[int, Mapping[str, Any]] | None = None) -> JobHandle:
        """As on the local engine; outputs of workers on other machines are fetched when each ends."""
        handle = super().start_job(entry, config, nodes=nodes, timeout=timeout, seed=seed, per_node=per_node)
        swarm = SwarmJobHandle(self, handle.job_id, handle.nodes, timeout)
        swarm.deadline = handle.deadline
        return swarm

    def _check_stop(self, what: str) -> None:
        if self._stop.is_set():
            raise ClusterError(f"start-up of run {self.run_id} was interrupted while waiting for the {what}")

    def _await_agent(self, node: Node, deadline: float) -> None:
        if node.agent.wait_ready(deadline) is None:
            raise ClusterError(f"job agent of {node.name} did not answer within {self.spec.ready_timeout_s} s")

    # -- the interface ----------------------------------------------------------------------------
    def placement(self) -> dict[int, str]:
        """Worker index -> the swarm node it runs on."""
        return {n.index: n.host for n in self._swarm_nodes_of()}

    def clock_offsets(self) -> dict[str, float]:
        """Node -> its clock minus this host's (seconds), measured at start."""
        return dict(self.offsets)

    def open_shaper(self, backend: str | None = None) -> Shaper:
        """A shaper that runs in the node agents, each on its own node's workers."""
        self._require_running()
        return SwarmShaper(list(self.links.values()), [n.placed for n in self._swarm_nodes_of()],
                           locate=lambda i: self._swarm_node(i).placed, backend=backend)

    def _swarm_nodes_of(self) -> list[SwarmNode]:
        return [n for n in self.nodes if isinstance(n, SwarmNode)]

    def _swarm_node(self, index: int) -> SwarmNode:
        node = self._node(index)
        assert isinstance(node, SwarmNode) and node.link is not None
        return node

    # -- churn ------------------------------------------------------------------------------------
    def _container_call(self, index: int, action: str) -> None:
        node = self._swarm_node(index)
        assert node.link is not None
        node.link.call(NodeCommand.CONTAINER, container_id=node.container_id, action=action)

    def kill(self, index: int) -> None:
        """SIGKILL worker ``index`` (Swarm does not replace it: restart condition none)."""
        self._container_call(index, "kill")

    def pause(self, index: int) -> None:
        """Freeze worker ``index``."""
        self._container_call(index, "pause")

    def unpause(self, index: int) -> None:
        """Resume worker ``index``."""
        self._container_call(index, "unpause")

    def restart(self, index: int, *, wait_ready: bool = True) -> Node:
        """Start worker ``index``'s container again; its address is read afresh (it may change)."""
        node = self._swarm_node(index)
        with contextlib.suppress(FileNotFoundError):
            (node.run_dir / "agent.sock").unlink()
        self._container_call(index, "restart")
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while True:
            found = self._survey().get(index + 1)
            if found is not None and found[1]["container_id"] == node.container_id:
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"worker {index} did not run again within {self.spec.ready_timeout_s} s")
            time.sleep(POLL_S)
        fresh = self._node_of(index, *found)
        if fresh.address != node.address:
            logger.info("worker %d restarted with a new address %s (was %s)", index, fresh.address, node.address)
        self.nodes[index] = fresh
        if wait_ready:
            self._await_agent(fresh, time.monotonic() + self.spec.ready_timeout_s)
        return fresh

    def disconnect(self, index: int) -> None:
        """Take worker ``index``'s data-plane interface down (Swarm keeps its network attachment)."""
        node = self._swarm_node(index)
        assert node.link is not None
        node.link.call(NodeCommand.LINK, container_id=node.container_id, up=False)

    def reconnect(self, index: int) -> None:
        """Bring worker ``index``'s interface back up, same address."""
        node = self._swarm_node(index)
        assert node.link is not None
        node.link.call(NodeCommand.LINK, container_id=node.container_id, up=True)

    def state(self, index: int) -> NodeState:
        """Whether worker ``index`` runs and is paused, as its node's engine says."""
        node = self._swarm_node(index)
        assert node.link is not None
        for w in node.link.call(NodeCommand.WORKERS)["workers"]:
            if w["container_id"] == node.container_id:
                return NodeState(running=bool(w["running"]), paused=bool(w["paused"]))
        raise ClusterError(f"worker {index} ({node.name}) is gone from node {node.host}")

    # -- teardown ---------------------------------------------------------------------------------
    def _remove_all(self) -> list[str]:
        errors: list[str] = []
        if self._client is None:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            return errors
        label = {"label": f"squall.run={self.run_id}"}
        with contextlib.suppress(*ENGINE_ERRORS):
            self._service_ids = list({*self._service_ids, *(s.id for s in self.client.services.list(filters=label))})
        for sid in self._service_ids:
            try:
                self.client.api.remove_service(sid)
            except NotFound:
                pass
            except ENGINE_ERRORS as exc:
                errors.append(f"service {sid[:12]}: {exc}")
        with contextlib.suppress(*ENGINE_ERRORS):
            for c in self.client.containers.list(all=True, filters=label):
                with contextlib.suppress(NotFound):
                    c.remove(force=True, v=True)
        errors += self._remove_network()
        try:
            for s in self.client.secrets.list(filters=label):
                with contextlib.suppress(NotFound):
                    s.remove()
        except ENGINE_ERRORS as exc:
            errors.append(f"secret {self.secret_name}: {exc}")
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.nodes = []
        if self._joined:
            try:
                membership.release(self.client, self.run_id)
            except ClusterError as exc:
                errors.append(str(exc))
        return errors

    def _remove_network(self, wait_s: float = 30.0) -> list[str]:
        """The overlay goes once Swarm has released the tasks' attachments (a few seconds)."""
        label = {"label": f"squall.run={self.run_id}"}
        deadline = time.monotonic() + wait_s
        last = ""
        while True:
            try:
                nets = self.client.networks.list(filters=label)
                if not nets:
                    return []
                for net in nets:  # Swarm deletes an overlay when its last task is gone: ask until it is
                    with contextlib.suppress(NotFound):
                        net.remove()
                last = "still listed after removal"
            except ENGINE_ERRORS as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                return [f"network {self.network_name}: {last}"]
            time.sleep(0.5)

