"""A cluster of worker containers on one private Docker network, with an agent in each.

Usage::

    with Cluster(ClusterSpec(workers=4)) as cluster:
        results = cluster.run_job("echo_mesh")
        cluster.kill(3); cluster.restart(3)

Creation is all or nothing: a bad spec, an unknown image or a subnet in use raise before anything
is created, and a failure half-way removes what was created. Teardown runs on normal exit, on an
exception and on SIGINT/SIGTERM (:mod:`squall.cluster.lifecycle`); ``squall gc`` handles SIGKILL.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import logging
import math
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import psutil
from docker.errors import APIError, ImageNotFound, NotFound
from docker.types import IPAMConfig, IPAMPool

from squall.cluster import lifecycle
from squall.cluster.agent_client import AgentClient
from squall.cluster.engine import ENGINE_ERRORS, docker_client
from squall.cluster.errors import ClusterError, ClusterSpecError, ImageError, JobError
from squall.cluster.forkserve import ForkServer, agent_command, forked_agent_argv, standin_command
from squall.cluster.image import REPO_ROOT, current_worker_tag
from squall.cluster.jobs import JobResult
from squall.cluster.ownership import LABEL_NODE, Owner, new_run_id, state_root, write_owner
from squall.cluster.remote import require_local_engine
from squall.cluster.spec import LOCAL, ClusterSpec, node_address
from squall.cluster.subnets import overlapping, pick_free
from squall.shaping.base import Endpoint, Shaper
from squall.worker.commands import FALLBACK_FILE, PID_FILE

logger = logging.getLogger(__name__)

SRC_MOUNT = "/squall/src"  # the project's code, read-only
RUN_MOUNT = "/squall/run"  # this node's directory: agent socket and job outputs
AGENT_SOCKET = f"{RUN_MOUNT}/agent.sock"  # the agent's socket, as the containers see it
MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 108 bytes
CANCEL_S = 1.0  # seconds an agent gets to cancel a job when the run is stopped
T = TypeVar("T")


@dataclass(frozen=True)
class Node:
    """One worker container, as the shaping and experiment layers see it."""

    index: int  # 0..workers-1
    name: str  # container name
    container_id: str  # Docker id
    address: str  # data-plane IPv4 address
    pid: int  # host pid of the container's init: its network namespace is /proc/<pid>/ns/net
    run_dir: Path  # host directory mounted at /squall/run

    @property
    def netns_path(self) -> str:
        """Path of the container's network namespace, for setns/nsenter."""
        return f"/proc/{self.pid}/ns/net"

    @property
    def endpoint(self) -> Endpoint:
        """This node as the shaping layer sees it."""
        return Endpoint(self.index, self.address, self.netns_path)

    @property
    def agent(self) -> AgentClient:
        """Client of this node's agent."""
        return AgentClient(self.run_dir / "agent.sock")


@dataclass(frozen=True)
class NodeState:
    """What the engine says of one node's container."""

    running: bool  # the container's process is alive (a paused container still runs)
    paused: bool  # frozen by the cgroup freezer


class JobHandle:
    """A job started on some nodes; :meth:`wait` collects the results."""

    def __init__(self, cluster: Cluster, job_id: str, nodes: list[int], timeout: float) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.nodes = nodes
        self.deadline = time.monotonic() + timeout
        self._stop = threading.Event()

    def wait(self, *, raise_on_failure: bool = True) -> list[JobResult]:
        """Block until every node finished or the deadline passed (then cancel); return the results.

        Interrupted (SIGINT, SIGTERM: a ``BaseException`` in this thread), it cancels the job on
        every node and returns at once, without waiting for the jobs to end on their own: the
        waiting threads used to be joined, which kept a stopped run training to the end of its budget.
        """
        results = self.cluster._parallel([partial(self._wait_one, i) for i in self.nodes], interrupt=self.cancel)
        bad = [r for r in results if not r.ok]
        if bad and raise_on_failure:
            raise JobError(f"job {self.job_id} failed on {len(bad)} of {len(results)} nodes:\n  "
                           + "\n  ".join(r.describe() for r in bad))
        return results

    def _wait_one(self, index: int) -> JobResult:
        node = self.cluster.nodes[index]
        out_dir = node.run_dir / "jobs" / self.job_id
        try:
            while not self._stop.is_set():
                left = self.deadline - time.monotonic()
                answer = node.agent.checked({"cmd": "wait", "job_id": self.job_id, "timeout": max(0.0, min(left, 5))},
                                            timeout=max(left, 0) + 10)
                if answer["state"] == "done":
                    return JobResult(index, self.job_id, "done", answer["exit_code"], answer["duration_s"], out_dir)
                if left <= 0:
                    answer = node.agent.checked({"cmd": "cancel", "job_id": self.job_id})
                    return JobResult(index, self.job_id, "timeout", answer.get("exit_code"),
                                     answer.get("duration_s"), out_dir)
        except JobError as exc:
            if not self._stop.is_set():
                logger.warning("node %d lost job %s: %s", index, self.job_id, exc)
                return JobResult(index, self.job_id, "lost", None, None, out_dir)
        return JobResult(index, self.job_id, "cancelled", None, None, out_dir)

    def cancel(self) -> None:
        """Kill the job on every node now (the agents SIGKILL its process group); errors are logged.

        The waits under way end at once: each agent answers a parked wait when its job ends.
        """
        self._stop.set()
        t0 = time.monotonic()

        def one(index: int) -> None:
            try:
                self.cluster.nodes[index].agent.checked({"cmd": "cancel", "job_id": self.job_id}, timeout=CANCEL_S)
            except (JobError, ValueError, IndexError) as exc:  # a dead node's job is gone anyway
                logger.debug("cancelling job %s on node %d: %s", self.job_id, index, exc)

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=CANCEL_S)
        logger.info("job %s cancelled on %d nodes in %.2f s", self.job_id, len(self.nodes), time.monotonic() - t0)


class Cluster:
    """Worker containers with agents, on an internal network unique to this run (the ``local`` engine)."""

    engine = LOCAL

    def __init__(self, spec: ClusterSpec, *, client: Any | None = None, run_id: str | None = None,
                 state_dir: Path | None = None) -> None:
        self.spec = spec
        self.run_id = run_id or new_run_id()
        self.state_dir = (state_dir or state_root()) / self.run_id
        self.owner = Owner.me()
        self.nodes: list[Node] = []
        self.subnet: ipaddress.IPv4Network | None = None
        self.network_name = f"{spec.name}-{self.run_id}"
        self.image: str | None = None
        self._client = client
        self._network_id: str | None = None
        self._container_ids: list[str] = []
        self._forks: ForkServer | None = None  # set by start() when agents are forked in
        self._agent_env: dict[int, tuple[dict[str, str], str]] = {}  # node -> its container's env and cwd
        self._job_ids = itertools.count(1)
        self._closed = False
        self._started = False
        self._stop = threading.Event()  # set when start-up is interrupted: stop waiting for agents

    # -- context manager --------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def client(self) -> Any:
        """The Docker client (created on first use)."""
        if self._client is None:
            self._client = docker_client()
        return self._client

    @property
    def fork_server(self) -> ForkServer | None:
        """The fork server whose children are the agents (None: each agent is its container's command)."""
        return self._forks

    @property
    def labels(self) -> dict[str, str]:
        """Labels on everything this run creates."""
        return {**dict(self.spec.labels), **self.owner.labels(self.run_id, self.state_dir)}

    # -- creation ---------------------------------------------------------------------------------
    def start(self) -> Cluster:
        """Create the network and the containers and wait for every agent; all or nothing."""
        if self._started:
            raise ClusterError(f"cluster {self.run_id} was already started")
        self._started = True
        image = self._check_image()
        subnet = self._check_subnet()
        sock = self.state_dir / f"{self.spec.name}-{self.run_id}-w{self.spec.workers - 1}" / "agent.sock"
        if len(str(sock)) > MAX_SOCKET_PATH:
            raise ClusterSpecError(f"state directory {self.state_dir} is too long for a Unix socket path "
                                   f"({len(str(sock))} > {MAX_SOCKET_PATH}); set SQUALL_STATE_DIR to a shorter path")
        lifecycle.register(self)
        t0 = time.monotonic()
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            write_owner(self.state_dir, self.owner, self.run_id)
            self._forks = self._fork_server(image)
            # the fork server's imports are the longest step: they start first and overlap the rest
            fork_start = self._forks and ThreadPoolExecutor(1).submit(self._forks.start)
            try:
                self._create_network(subnet)
                self.nodes = self._parallel([partial(self._start_node, i, image) for i in range(self.spec.workers)],
                                            interrupt=self._stop.set, join_interrupted=True)
            finally:
                if fork_start:
                    fork_start.result()  # created, or failed, before anything is torn down
            # the run's own pids must be its containers in this machine's /proc, or shaping would enter
            # unrelated namespaces: a remote engine is refused here, pointing to --engine swarm
            require_local_engine(self.client, container_ids=[n.container_id for n in self.nodes])
            deadline = time.monotonic() + self.spec.ready_timeout_s
            self._parallel([partial(self._await_agent, n, deadline) for n in self.nodes], interrupt=self._stop.set)
        except ENGINE_ERRORS as exc:
            self._close_quietly()
            raise ClusterError(f"cluster {self.run_id}: the Docker engine failed while creating it: {exc}") from exc
        except BaseException:
            self.close()
            raise
        logger.info("cluster %s: %d workers on %s ready in %.1f s", self.run_id, len(self.nodes), self.subnet,
                    time.monotonic() - t0)
        return self

    def _check_image(self) -> str:
        image = self.spec.image
        if image is None:
            image = current_worker_tag(self.client)
            if image is None:
                raise ImageError("the worker image is not built for the current inputs; run 'squall image build' "
                                 "(or 'make image')")
        else:
            try:
                self.client.images.get(image)
            except ImageNotFound as exc:
                raise ClusterSpecError(f"image {image!r} is not present in the Docker engine; build it with "
                                       "'squall image build' or name a local image") from exc
        self.image = image
        return image

    def _used_subnets(self) -> list[ipaddress.IPv4Network]:
        used: list[ipaddress.IPv4Network] = []
        for net in self.client.networks.list():
            for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
                with contextlib.suppress(KeyError, ValueError, TypeError):
                    n = ipaddress.ip_network(cfg["Subnet"], strict=False)
                    if isinstance(n, ipaddress.IPv4Network):
                        used.append(n)
        # Host interfaces too: a run must not shadow a real network of this machine.
        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family.name == "AF_INET" and a.netmask and not a.address.startswith("127."):
                    used.append(ipaddress.ip_network(f"{a.address}/{a.netmask}", strict=False))  # type: ignore[arg-type]
        return used

    def _check_subnet(self) -> ipaddress.IPv4Network | None:
        if self.spec.subnet is None:
            return None
        net = self.spec.network
        clash = overlapping(net, self._used_subnets())
        if clash is not None:
            raise ClusterSpecError(f"subnet {net} is already in use (overlaps {clash}); choose another or leave "
                                   "subnet unset to get a free one")
        return net

    def _create_network(self, subnet: ipaddress.IPv4Network | None) -> None:
        rng = random.Random()
        for attempt in range(12):
            candidate = subnet or pick_free(self._used_subnets(), rng=rng)
            ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(candidate),
                                                     gateway=str(candidate.network_address + 1))])
            try:
                net = self.client.networks.create(self.network_name, driver="bridge", internal=True, ipam=ipam,
                                                  labels=self.labels, check_duplicate=True)
            except APIError as exc:
                if subnet is None and "overlap" in str(exc).lower() and attempt < 11:
                    continue  # another run took it a moment ago: pick again
                raise ClusterError(f"cannot create network {self.network_name} on {candidate}: {exc}") from exc
            self._network_id = net.id
            self.subnet = candidate
            return

    def _start_node(self, index: int, image: str) -> Node:
        assert self.subnet is not None
        name = f"{self.spec.name}-{self.run_id}-w{index}"
        run_dir = self.state_dir / name
        run_dir.mkdir(parents=True, exist_ok=True)
        address = node_address(self.subnet, index)
        api = self.client.api
        binds = {**self._code_binds(), str(run_dir): {"bind": RUN_MOUNT, "mode": "rw"}}
        host_config = api.create_host_config(
            binds=binds, nano_cpus=int(self.spec.cpus * 1e9), mem_limit=self.spec.memory_bytes,
            memswap_limit=self.spec.memory_bytes, sysctls=self.spec.sysctls(), init=True,
            network_mode=self.network_name, pids_limit=4096,
        )
        networking = api.create_networking_config({self.network_name: api.create_endpoint_config(ipv4_address=address)})
        env = {"SQUALL_NODE": str(index), **self._run_env()}
        command = (standin_command(RUN_MOUNT, AGENT_SOCKET, self.spec.preload) if self._forks is not None
                   else agent_command(AGENT_SOCKET, self.spec.preload))
        container = api.create_container(
            image, command=command, name=name, hostname=f"w{index}", detach=True, environment=env,
            labels={**self.labels, LABEL_NODE: str(index)}, host_config=host_config,
            networking_config=networking, user=f"{os.getuid()}:{os.getgid()}",
        )
        cid = container["Id"]
        self._container_ids.append(cid)
        api.start(cid)
        info = api.inspect_container(cid)
        self._agent_env[index] = (_env_of(info), info["Config"].get("WorkingDir") or "/")
        node = Node(index, name, cid, address, int(info["State"]["Pid"]), run_dir)
        if self._forks is not None:  # as soon as this container and the server are up, not after all
            self._forks.wait_ready(time.monotonic() + self.spec.ready_timeout_s, self._stop)
            if not self._stop.is_set():
                self._place_agent(node)
        return node

    def _fork_server(self, image: str) -> ForkServer | None:
        """The run's fork server, when its agents are forked in (the spec asks, and there is something to
        import once)."""
        if not (self.spec.fork_agents and self.spec.preload):
            return None
        return ForkServer(self.client, name=f"{self.spec.name}-{self.run_id}-fork", image=image,
                          directory=self.state_dir / f"{self.spec.name}-{self.run_id}-fork", labels=self.labels,
                          env=self._run_env(), preload=self.spec.preload, code=self._code_binds())

    def _run_env(self) -> dict[str, str]:
        """The environment every worker gets (and the fork server, which imports what they would)."""
        # as many intra-op threads as the container has CPUs: torch would start one per host core, and
        # two threads under a one-CPU quota get throttled in turn (a tiny model computed ~60x slower)
        threads = str(max(1, math.floor(self.spec.cpus)))
        return {"SQUALL_RUN": self.run_id, "SQUALL_WORKERS": str(self.spec.workers),
                "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, **dict(self.spec.env)}

    def _code_binds(self) -> dict[str, dict[str, str]]:
        """The project's code and the spec's mounts, as every worker (and the fork server) gets them."""
        binds = {str(REPO_ROOT): {"bind": SRC_MOUNT, "mode": "ro"}}
        for m in self.spec.mounts:
            binds[m.source] = {"bind": m.target, "mode": "ro" if m.read_only else "rw"}
        return binds

    def _place_agent(self, node: Node) -> None:
        """Have the fork server put ``node``'s agent in its container (or its stand-in start one)."""
        assert self._forks is not None
        env, cwd = self._agent_env[node.index]
        self._forks.place(node.pid, node.run_dir, env, cwd,
                          forked_agent_argv(RUN_MOUNT, AGENT_SOCKET, self.spec.preload))

    def _await_agent(self, node: Node, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self._stop.is_set():
                raise ClusterError(f"start-up of {node.name} was interrupted")
            if node.agent.wait_ready(min(deadline, time.monotonic() + 0.25)) is not None:
                return
            state = self.client.api.inspect_container(node.container_id)["State"]
            if not state.get("Running"):
                logs = self.client.api.logs(node.container_id, tail=20).decode(errors="replace")
                raise ClusterError(f"container {node.name} exited ({state.get('ExitCode')}) before its agent "
                                   f"answered:\n{logs}")
        raise ClusterError(f"agent of {node.name} did not answer within {self.spec.ready_timeout_s} s")

    # -- jobs -------------------------------------------------------------------------------------
    def start_job(self, entry: str, config: dict[str, Any] | None = None, *, nodes: Sequence[int] | None = None,
                  timeout: float = 120.0, seed: int = 0,
                  per_node: Mapping[int, Mapping[str, Any]] | None = None) -> JobHandle:
        """Start ``entry`` on ``nodes`` (default all) and return at once.

        ``per_node`` maps a node index to keys laid over ``config`` for that node only (e.g. its
        emulated device).
        """
        self._require_running()
        chosen = list(range(len(self.nodes))) if nodes is None else list(nodes)
        for i in chosen:
            if not 0 <= i < len(self.nodes):
                raise JobError(f"node {i} does not exist; this cluster has nodes 0..{len(self.nodes) - 1}")
        job_id = f"j{next(self._job_ids):04d}"
        peers = [n.address for n in self.nodes]
        extra = {i: dict(v) for i, v in (per_node or {}).items()}

        def dispatch(i: int) -> None:
            spec = {"job_id": job_id, "entry": entry, "rank": i, "world_size": len(self.nodes), "peers": peers,
                    "out_dir": f"{RUN_MOUNT}/jobs/{job_id}", "config": {**(config or {}), **extra.get(i, {})},
                    "seed": seed,
                    "deadline_s": timeout}
            self.nodes[i].agent.checked({"cmd": "run", "job": spec})

        self._parallel([partial(dispatch, i) for i in chosen])
        return JobHandle(self, job_id, chosen, timeout)

    def run_job(self, entry: str, config: dict[str, Any] | None = None, *, nodes: Sequence[int] | None = None,
                timeout: float = 120.0, seed: int = 0, raise_on_failure: bool = True,
                per_node: Mapping[int, Mapping[str, Any]] | None = None) -> list[JobResult]:
        """Run ``entry`` on ``nodes`` (default all) and wait for every result."""
        return self.start_job(entry, config, nodes=nodes, timeout=timeout, seed=seed, per_node=per_node).wait(
            raise_on_failure=raise_on_failure)

    def endpoints(self) -> list[Endpoint]:
        """What the shaping layer needs of each node: index, address and network namespace."""
        self._require_running()
        return [n.endpoint for n in self.nodes]

    def placement(self) -> dict[int, str]:
        """Every worker runs on this machine."""
        return {n.index: LOCAL for n in self.nodes}

    def clock_offsets(self) -> dict[str, float]:
        """One machine, one clock."""
        return {LOCAL: 0.0}

    def open_shaper(self, backend: str | None = None) -> Shaper:
        """A shaper running in this process, entering the containers' namespaces through /proc."""
        from squall.shaping import open_shaper

        return open_shaper(self.endpoints(), run_id=self.run_id, backend=backend)

    # -- churn ------------------------------------------------------------------------------------
    def kill(self, index: int) -> None:
        """SIGKILL node ``index``'s container (its jobs die with it)."""
        self._api_call(index, self.client.api.kill)

    def pause(self, index: int) -> None:
        """Freeze node ``index`` (cgroup freezer): it stops answering but keeps its state."""
        self._api_call(index, self.client.api.pause)

    def unpause(self, index: int) -> None:
        """Resume a paused node."""
        self._api_call(index, self.client.api.unpause)

    def restart(self, index: int, *, wait_ready: bool = True) -> Node:
        """Start node ``index`` again (after a kill, or restart it if it runs), same address, fresh agent."""
        node = self._node(index)
        for stale in ("agent.sock", PID_FILE):
            with contextlib.suppress(FileNotFoundError):
                (node.run_dir / stale).unlink()
        self._api_call(index, lambda cid: self.client.api.restart(cid, timeout=1))
        pid = int(self.client.api.inspect_container(node.container_id)["State"]["Pid"])
        node = replace(node, pid=pid)
        self.nodes[index] = node
        if self._forks is not None and not (node.run_dir / FALLBACK_FILE).exists():
            self._place_agent(node)
        if wait_ready:
            self._await_agent(node, time.monotonic() + self.spec.ready_timeout_s)
        return node

    def disconnect(self, index: int) -> None:
        """Take node ``index`` off the network (its interface disappears)."""
        node = self._node(index)
        self._api_call(index, lambda cid: self.client.api.disconnect_container_from_network(cid, self._network_id))
        logger.info("node %d (%s) disconnected", index, node.address)

    def reconnect(self, index: int) -> None:
        """Put node ``index`` back on the network with its old address."""
        node = self._node(index)
        self._api_call(index, lambda cid: self.client.api.connect_container_to_network(
            cid, self._network_id, ipv4_address=node.address))

    # -- inspection -------------------------------------------------------------------------------
    def state(self, index: int) -> NodeState:
        """Whether node ``index``'s container runs and whether it is paused, as the engine says."""
        node = self._node(index)
        try:
            state = self.client.api.inspect_container(node.container_id)["State"]
        except ENGINE_ERRORS as exc:
            raise ClusterError(f"node {index} ({node.name}): {exc}") from exc
        return NodeState(running=bool(state.get("Running")), paused=bool(state.get("Paused")))

    def memory_mb(self, index: int) -> float:
        """Node ``index``'s memory without page cache (cgroup v1 ``rss``, v2 ``anon``), in MiB."""
        node = self._node(index)
        try:
            stats = self.client.api.stats(node.container_id, stream=False)["memory_stats"].get("stats", {})
        except ENGINE_ERRORS as exc:
            raise ClusterError(f"node {index} ({node.name}): {exc}") from exc
        anon = stats.get("total_rss", stats.get("rss", stats.get("anon", 0)))
        return float(anon) / 2**20

    def _node(self, index: int) -> Node:
        self._require_running()
        if not 0 <= index < len(self.nodes):
            raise ClusterError(f"node {index} does not exist; this cluster has nodes 0..{len(self.nodes) - 1}")
        return self.nodes[index]

    def _api_call(self, index: int, call: Callable[[str], Any]) -> None:
        node = self._node(index)
        try:
            call(node.container_id)
        except ENGINE_ERRORS as exc:
            raise ClusterError(f"node {index} ({node.name}): {exc}") from exc

    def _require_running(self) -> None:
        if self._closed or not self.nodes:
            raise ClusterError(f"cluster {self.run_id} is not running")

    # -- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Remove every container, the network and the run's files; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with lifecycle.signals_held():
            t0 = time.monotonic()
            errors = self._remove_all()
            lifecycle.unregister(self)
        if errors:
            raise ClusterError(f"teardown of run {self.run_id} left things behind (run 'squall gc'): "
                               + "; ".join(errors))
        logger.info("cluster %s torn down in %.1f s", self.run_id, time.monotonic() - t0)

    def _close_quietly(self) -> None:
        """Close while another error is on its way out: what teardown leaves is logged, not raised."""
        try:
            self.close()
        except ClusterError as exc:
            logger.error("%s", exc)

    def _remove_all(self) -> list[str]:
        errors: list[str] = []
        # Also find containers by label: a failure between create and bookkeeping must not leak.
        ids = set(self._container_ids)
        if self._client is not None:
            with contextlib.suppress(*ENGINE_ERRORS):
                found = self.client.containers.list(all=True, filters={"label": f"squall.run={self.run_id}"})
                ids |= {c.id for c in found}

        def remove(cid: str) -> None:
            try:
                self.client.api.remove_container(cid, force=True, v=True)
            except NotFound:
                pass
            except ENGINE_ERRORS as exc:
                errors.append(f"container {cid[:12]}: {exc}")

        self._parallel([partial(remove, c) for c in ids])
        networks = {self._network_id} if self._network_id is not None else set()
        if self._client is not None:  # by label too: a signal during its creation must not leak it
            with contextlib.suppress(*ENGINE_ERRORS):
                networks |= {n["Id"] for n in self.client.api.networks(filters={"label": f"squall.run={self.run_id}"})}
        for network_id in networks:
            try:
                self.client.api.remove_network(network_id)
            except NotFound:
                pass
            except ENGINE_ERRORS as exc:
                errors.append(f"network {self.network_name}: {exc}")
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.nodes = []
        return errors

    # -- helpers ----------------------------------------------------------------------------------
    @staticmethod
    def _parallel(calls: Iterable[Callable[[], T]], *, interrupt: Callable[[], None] | None = None,
                  join_interrupted: bool = False) -> list[T]:
        """Run ``calls`` in threads; return results in order; re-raise the first failure.

        With ``interrupt``: when this thread is interrupted (SIGINT/SIGTERM raise here), call it (it
        makes the calls return soon) and re-raise at once instead of joining the threads, unless
        ``join_interrupted``; without, the calls are waited for (they are short, and what they create
        must be known to teardown).
        """
        calls = list(calls)
        if not calls:
            return []
        pool = ThreadPoolExecutor(max_workers=min(16, len(calls)))
        join = True
        try:
            futures = [pool.submit(c) for c in calls]
            return [f.result() for f in futures]
        except BaseException as exc:
            if interrupt is not None and not isinstance(exc, Exception):
                join = join_interrupted
                interrupt()
            raise
        finally:
            pool.shutdown(wait=join, cancel_futures=not join)


def _env_of(info: Mapping[str, Any]) -> dict[str, str]:
    """A container's environment as ``docker inspect`` lists it (``NAME=value`` lines)."""
    env = {}
    for line in info["Config"].get("Env") or []:
        name, sep, value = line.partition("=")
        if sep:
            env[name] = value
    return env
