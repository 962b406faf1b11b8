"""The node agent: one per swarm node (the run's ``squall-node-agent`` global service).

It runs in a container on the node's host network with NET_ADMIN, SYS_ADMIN, SYS_PTRACE and
SYS_NICE, the host's ``/proc`` at ``/host/proc``, the node's Docker socket and the run's state
directory, and serves the harness over TCP (:mod:`.wire`; every request must carry the run's token,
read from the Swarm secret at start). What it does, always for *this node's* workers only:

* ``workers``: finds the run's worker containers on this node through the node's Docker engine and
  says where each runs (slot, container id, data-plane address); before it ever uses a container's
  ``/proc/<pid>`` it checks that ``/host/proc/<pid>/cgroup`` names that container id, so a pid
  recycled by an unrelated process is refused;
* ``shape_*``: runs the same shapers as the local engine (:func:`squall.shaping.open_shaper`) on
  this node's endpoints; the harness computes nothing different, it sends every node the whole
  :class:`~squall.shaping.base.LinkState` and the endpoint list, and each agent applies the part
  that lands in its own namespaces (workers on other nodes are handed to the shaper as namespaces
  that are not here, which the shapers skip);
* ``relay``: passes a request to a worker's job agent (its Unix socket in the state directory) and
  returns the answer, so jobs run and are waited for as on the local engine; ``fetch``: a job's
  files (:mod:`.job_files`), for a harness on another machine;
* ``put_files``: pieces of a folder the workers mount (a program's snapshot), written into the run's
  copy of it on this node (:mod:`.folders`: relative paths only, checked); ``image``: whether this
  node's engine holds an image the workers need; ``build``: a program image (the worker image plus
  a program's requirements) built on this node from its context, copied here the same way;
* ``container`` and ``link``: churn (kill, pause, unpause, restart; interface down/up) on this
  node's workers;
* ``hello``: the node's name and clock, for the harness to measure clock offsets.

Those are :class:`~squall.cluster.swarm.wire.NodeCommand`'s members, each with one handler in
:attr:`Agent.handlers`; a request naming anything else is answered with the list of known ones.

Run with ``python3 -m squall.cluster.swarm.node_agent``; configuration comes from the environment
the service sets (:data:`ENV_KEYS`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docker import errors as docker_errors

from squall.cluster.agent_client import AgentClient
from squall.cluster.errors import JobError
from squall.cluster.swarm import folders, wire
from squall.cluster.swarm.job_files import read_job
from squall.cluster.swarm.wire import NodeCommand
from squall.shaping.base import (
    ELSEWHERE_PREFIX,
    Endpoint,
    LinkCounters,
    LinkState,
    MultiHostShaper,
    Shaper,
    ShapingError,
)
from squall.worker.commands import UnknownCommand, command_of

logger = logging.getLogger("squall.node_agent")

Handler = Callable[[dict[str, Any]], dict[str, Any]]  # one command's request (token removed) to its answer

ENV_KEYS = ("SQUALL_RUN", "SQUALL_AGENT_PORT", "SQUALL_TOKEN_FILE", "SQUALL_WORKER_SERVICE", "SQUALL_NETWORK",
            "SQUALL_RUN_DIR", "SQUALL_WORKERS", "SQUALL_OWNER_UID", "SQUALL_OWNER_GID")
HOST_PROC = os.environ.get("SQUALL_HOST_PROC", "/host/proc")
CONTAINER_ACTIONS = ("kill", "pause", "unpause", "restart", "start")
SLOT_LABEL = "com.docker.swarm.task.name"  # "<service>.<slot>.<task id>"
JOB_ID = re.compile(r"^j[0-9]{4,9}$")  # the cluster's job ids; nothing else names a directory to read
SERVICE_LABEL = "com.docker.swarm.service.name"
PROGRAM_TAG = re.compile(r"^squall-program:[0-9a-f]{6,64}$")  # the only images an agent builds
BUILD_TIMEOUT_S = 900  # one program image's build on a node
WORKER_TAG = re.compile(r"^squall-worker:[0-9a-f]{6,64}$")  # ... and only on the worker image


@dataclass(frozen=True)
class Config:
    """What the service tells the agent through its environment."""

    run_id: str
    port: int
    token: str
    worker_service: str
    network: str
    run_dir: Path
    workers: int
    owner: tuple[int, int]  # uid, gid of the harness: the workers' directories belong to it

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Config:
        """Read and check the environment; ``ValueError`` names a missing or bad key."""
        missing = [k for k in ENV_KEYS if not env.get(k)]
        if missing:
            raise ValueError(f"node agent: environment lacks {', '.join(missing)}")
        token = Path(env["SQUALL_TOKEN_FILE"]).read_text().strip()
        if len(token) < 32:
            raise ValueError("node agent: the token secret is shorter than 32 characters")
        return cls(env["SQUALL_RUN"], int(env["SQUALL_AGENT_PORT"]), token, env["SQUALL_WORKER_SERVICE"],
                   env["SQUALL_NETWORK"], Path(env["SQUALL_RUN_DIR"]), int(env["SQUALL_WORKERS"]),
                   (int(env["SQUALL_OWNER_UID"]), int(env["SQUALL_OWNER_GID"])))


def slot_dir(run_dir: Path, slot: int) -> Path:
    """The directory worker ``slot`` (1-based, Swarm's numbering) mounts at /squall/run."""
    return run_dir / f"w{slot}"


def cgroup_names(pid: int, container_id: str, proc: str = HOST_PROC) -> bool:
    """Whether ``/proc/<pid>/cgroup`` (as the host sees it) puts the process in that container."""
    try:
        text = Path(proc, str(pid), "cgroup").read_text()
    except OSError:
        return False
    return len(container_id) >= 12 and container_id in text


class Agent:
    """The agent's state: the node's Docker engine, the run's shaper, and the workers it found."""

    def __init__(self, config: Config, docker: Any) -> None:
        self.config = config
        self.docker = docker
        self.node = socket.gethostname()
        self.shaper: Shaper | None = None
        self.lock = threading.RLock()
        # the stand-in namespace of endpoints on other nodes (the shapers skip it by its name)
        self._placeholder = tempfile.NamedTemporaryFile(prefix=ELSEWHERE_PREFIX)  # noqa: SIM115
        #: one handler per command (:class:`~squall.cluster.swarm.wire.NodeCommand`)
        self.handlers = self._handlers()

    # -- workers ----------------------------------------------------------------------------------
    def workers(self) -> list[dict[str, Any]]:
        """The run's worker containers on this node, checked against /proc."""
        found = []
        mine = {"label": f"{SERVICE_LABEL}={self.config.worker_service}"}
        for summary in self.docker.api.containers(all=True, filters=mine):
            try:
                attrs = self.docker.api.inspect_container(summary["Id"])
            except docker_errors.NotFound:  # removed between the listing and the inspect
                continue
            labels = attrs["Config"].get("Labels") or {}
            try:
                slot = int(labels.get(SLOT_LABEL, "").split(".")[1])
            except (IndexError, ValueError):
                continue
            state = attrs["State"]
            net = (attrs["NetworkSettings"].get("Networks") or {}).get(self.config.network) or {}
            pid = int(state.get("Pid") or 0)
            running = bool(state.get("Running"))
            cid = str(attrs["Id"])
            found.append({"slot": slot, "container_id": cid, "name": str(attrs["Name"]).lstrip("/"),
                          "address": net.get("IPAddress") or "", "running": running,
                          "paused": bool(state.get("Paused")),
                          "verified": running and pid > 0 and cgroup_names(pid, cid)})
        return sorted(found, key=lambda w: (w["slot"], not w["running"]))

    def _container(self, container_id: str) -> Any:
        c = self.docker.containers.get(container_id)
        if (c.attrs["Config"].get("Labels") or {}).get(SERVICE_LABEL) != self.config.worker_service:
            raise PermissionError(f"container {container_id[:12]} is not a worker of run {self.config.run_id}")
        return c

    def netns_of(self, container_id: str) -> str:
        """The network namespace path of a running worker, after the cgroup check."""
        c = self._container(container_id)
        pid = int(c.attrs["State"].get("Pid") or 0)
        if pid <= 0 or not cgroup_names(pid, c.id):
            raise PermissionError(f"pid {pid} is not in container {container_id[:12]} (cgroup check failed)")
        return f"{HOST_PROC}/{pid}/ns/net"

    def container(self, container_id: str, action: str) -> None:
        """Churn on one of this node's workers."""
        if action not in CONTAINER_ACTIONS:
            raise ValueError(f"action {action!r} is not one of {', '.join(CONTAINER_ACTIONS)}")
        c = self._container(container_id)
        if action == "restart":
            slot = int((c.attrs["Config"].get("Labels") or {}).get(SLOT_LABEL, "").split(".")[1])
            with contextlib.suppress(FileNotFoundError):  # the new job agent's socket replaces it
                (slot_dir(self.config.run_dir, slot) / "agent.sock").unlink()
            c.restart(timeout=1)
        else:
            getattr(c, action)()

    def link(self, container_id: str, up: bool) -> None:
        """Take a worker's data-plane interface down (a disconnect) or bring it back up."""
        path = self.netns_of(container_id)
        subprocess.run(["nsenter", f"--net={path}", "ip", "link", "set", "dev", "eth0", "up" if up else "down"],
                       check=True, capture_output=True, timeout=10)

    def fetch(self, slot: int, job_id: str, every: bool = False) -> dict[str, Any]:
        """A job's files on this node (:func:`~.job_files.read_job`), for a harness on another machine."""
        if not 1 <= slot <= self.config.workers or not JOB_ID.match(job_id):
            raise ValueError(f"no job {job_id!r} on slot {slot}")
        return read_job(slot_dir(self.config.run_dir, slot) / "jobs" / job_id, every=every)

    def put_files(self, request: dict[str, Any]) -> int:
        """Write pieces of the run's copied mount ``request["mount"]`` into its copy on this node (:mod:`.folders`);
        the number of pieces written."""
        root = folders.image_context_dir(self.config.run_dir) if request.get("image") \
            else folders.copy_dir(self.config.run_dir, int(request["mount"]))
        root.mkdir(parents=True, exist_ok=True)
        folders.make_dirs(root, request.get("dirs", []))
        pieces = request.get("pieces", [])
        if not isinstance(pieces, list):
            raise folders.FolderError("pieces must be a list")
        for piece in pieces:
            folders.write_piece(root, piece)
        for path in (root.parent, root, *root.rglob("*")):  # the harness's user reads it, and removes it at the end
            os.chown(path, *self.config.owner)
            if path.is_dir():
                path.chmod(0o755)
        return len(pieces)

    def build(self, tag: str, base: str) -> float:
        """Build program image ``tag`` on ``base`` (the worker image, which this node holds) from the context
        copied here (``put_files`` with ``image``); the seconds it took."""
        if not PROGRAM_TAG.match(tag) or not WORKER_TAG.match(base):
            raise ValueError(f"only a program image is built here on the worker image, not {tag!r} on {base!r}")
        if not self.has_image(base):
            raise ValueError(f"this node lacks the worker image {base}: load it first")
        context = folders.image_context_dir(self.config.run_dir)
        if not (context / "Dockerfile").is_file():
            raise ValueError(f"no build context was copied to {context}")
        import docker

        t0 = time.monotonic()
        builder = docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=BUILD_TIMEOUT_S)
        try:
            builder.images.build(path=str(context), tag=tag, buildargs={"BASE": base}, rm=True, forcerm=True,
                                 labels={"squall.image": tag.split(":", 1)[0]})
        finally:
            builder.close()
        logger.info("built %s on %s in %.1f s", tag, base, time.monotonic() - t0)
        return time.monotonic() - t0

    def has_image(self, name: str) -> bool:
        """Whether this node's engine holds image ``name``."""
        try:
            self.docker.images.get(name)
        except docker_errors.ImageNotFound:
            return False
        return True

    # -- shaping ----------------------------------------------------------------------------------
    def name_overlay_namespace(self) -> str | None:
        """Make the overlay's bridge namespace visible as an ``ip netns`` name; returns its path.

        Docker keeps it as ``/run/docker/netns/1-<network id[:10]>`` in the engine's mount namespace,
        created when the first worker attaches, after this agent started; a bind mount would not
        see it without shared propagation, so it is reached through the engine's /proc root.
        Shapers that hold packets on the bridge look for it among /run/netns.
        """
        net_id = self.docker.networks.get(self.config.network).id
        name = f"1-{net_id[:10]}"
        for comm in Path(HOST_PROC).glob("[0-9]*/comm"):
            with contextlib.suppress(OSError):
                if comm.read_text().strip() != "dockerd":
                    continue
                target = comm.parent / "root" / "run" / "docker" / "netns" / name
                if target.exists():
                    link = Path("/run/netns") / name
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.unlink(missing_ok=True)
                    link.symlink_to(target)
                    return str(link)
        logger.warning("the overlay namespace %s was not found under any dockerd's /proc root", name)
        return None

    def shape_open(self, backend: str | None, endpoints: list[dict[str, Any]]) -> str:
        """Open a shaper on every endpoint; those with a container here get their real namespace."""
        from squall.shaping import open_shaper

        with self.lock:
            if self.shaper is not None:
                self.shaper.close()
                self.shaper = None
            self.name_overlay_namespace()
            mine: list[Endpoint] = []
            others: list[int] = []
            for e in endpoints:
                cid = e.get("container_id")
                here = bool(cid) and e.get("node") == self.node
                netns = self.netns_of(str(cid)) if here else self._placeholder.name
                mine.append(Endpoint(int(e["index"]), str(e["address"]), netns))
                if not here:
                    others.append(int(e["index"]))
            if len(others) == len(mine):  # no worker of the run here: nothing to shape on this node
                shaper: Shaper = IdleShaper(backend or _default_backend())
            else:
                shaper = open_shaper(mine, run_id=self.config.run_id, backend=backend)
                _multi_host(shaper).place(others)
            self.shaper = shaper
            logger.info("shaper %s open: %d endpoints here, %d elsewhere", shaper.backend, len(mine) - len(others),
                        len(others))
            return shaper.backend

    def _shaper(self) -> Shaper:
        if self.shaper is None:
            raise ShapingError("no shaper is open on this node")
        return self.shaper

    def shape_close(self) -> None:
        """Clear and stop this node's shaper, if one is open."""
        with self.lock:
            if self.shaper is not None:
                self.shaper.close()
                self.shaper = None

    def shape_replace(self, request: dict[str, Any]) -> None:
        """A worker restarted: re-plan it on this node's shaper, here or as one elsewhere."""
        with self.lock:
            shaper = self._shaper()
            cid = request.get("container_id")
            here = bool(cid) and request.get("node") == self.node
            netns = self.netns_of(str(cid)) if here else self._placeholder.name
            endpoint = Endpoint(int(request["index"]), str(request["address"]), netns)
            if here:
                shaper.replace_endpoint(endpoint)
            else:
                _multi_host(shaper).replace_elsewhere(endpoint)

    def _on_shaper(self, act: Callable[[Shaper], object]) -> None:
        with self.lock:
            act(self._shaper())

    # -- requests ---------------------------------------------------------------------------------
    def _handlers(self) -> dict[NodeCommand, Handler]:
        """One handler per command: the request (token removed) to the answer."""
        return {
            NodeCommand.HELLO: lambda r: {"ok": True, "node": self.node, "time": time.time(),
                                          "run": self.config.run_id},
            NodeCommand.WORKERS: lambda r: {"ok": True, "node": self.node, "workers": self.workers()},
            NodeCommand.RELAY: self.relay,
            NodeCommand.FETCH: lambda r: {"ok": True, **self.fetch(int(r["slot"]), str(r["job_id"]),
                                                                   bool(r.get("every", False)))},
            NodeCommand.PUT_FILES: lambda r: {"ok": True, "written": self.put_files(r)},
            NodeCommand.BUILD: lambda r: {"ok": True, "seconds": self.build(str(r["tag"]), str(r["base"]))},
            NodeCommand.IMAGE: lambda r: {"ok": True, "node": self.node, "present": self.has_image(str(r["name"]))},
            NodeCommand.CONTAINER: _done(lambda r: self.container(str(r["container_id"]), str(r["action"]))),
            NodeCommand.LINK: _done(lambda r: self.link(str(r["container_id"]), bool(r["up"]))),
            NodeCommand.SHAPE_OPEN: lambda r: {"ok": True,
                                               "backend": self.shape_open(r.get("backend"), list(r["endpoints"]))},
            NodeCommand.SHAPE_APPLY: _done(lambda r: self._on_shaper(lambda s: s.apply(wire.decode_state(r["state"])))),
            NodeCommand.SHAPE_CLEAR: _done(lambda r: self._on_shaper(lambda s: s.clear())),
            NodeCommand.SHAPE_CHECK: _done(lambda r: self._on_shaper(lambda s: s.check())),
            NodeCommand.SHAPE_REPLACE: _done(self.shape_replace),
            NodeCommand.SHAPE_COUNTERS: self.shape_counters,
            NodeCommand.SHAPE_CLOSE: _done(lambda r: self.shape_close()),
        }

    def relay(self, request: dict[str, Any]) -> dict[str, Any]:
        """Pass ``request["request"]`` to slot ``request["slot"]``'s job agent; its answer, or None and why."""
        slot = int(request["slot"])
        if not 1 <= slot <= self.config.workers:
            raise ValueError(f"slot {slot} outside 1..{self.config.workers}")
        client = AgentClient(slot_dir(self.config.run_dir, slot) / "agent.sock")
        timeout = float(request.get("timeout", 30.0))
        try:
            return {"ok": True, "answer": client.request(dict(request["request"]), timeout=timeout)}
        except (JobError, ValueError) as exc:
            return {"ok": True, "answer": None, "error": str(exc)}

    def shape_counters(self, request: dict[str, Any]) -> dict[str, Any]:
        """This node's link counters, as rows."""
        with self.lock:
            return {"ok": True, "counters": wire.encode_counters(self._shaper().counters())}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one authenticated request; an unknown command is refused with the known ones."""
        try:
            cmd = command_of(NodeCommand, request)
        except UnknownCommand as exc:
            return {"ok": False, "error": str(exc)}
        return self.handlers[cmd](request)

    def close(self) -> None:
        """Clear and stop the shaper (the run is ending)."""
        with self.lock:
            if self.shaper is not None:
                try:
                    self.shaper.close()
                except ShapingError as exc:
                    logger.error("closing the shaper: %s", exc)
                self.shaper = None
        self._placeholder.close()


def _done(act: Callable[[dict[str, Any]], object]) -> Handler:
    """A handler that does ``act`` and answers a plain ``ok``."""

    def handler(request: dict[str, Any]) -> dict[str, Any]:
        act(request)
        return {"ok": True}

    return handler


def _multi_host(shaper: Shaper) -> MultiHostShaper:
    """``shaper`` as one host's shaper of several; refused for a backend that cannot be one."""
    if not isinstance(shaper, MultiHostShaper):
        raise ShapingError(f"the {shaper.backend} shaper cannot leave endpoints on other nodes alone")
    return shaper


def _default_backend() -> str:
    from squall.shaping.select import netem_probe

    return "netem" if netem_probe().available else "nfqueue"


class IdleShaper:
    """The shaper of a node where none of the run's workers runs: every command is a no-op.

    It reports the backend the other nodes use, so the harness's check that all nodes agree holds.
    """

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def apply(self, state: LinkState) -> None:
        """Nothing lands on this node."""

    def clear(self) -> None:
        """Nothing to remove."""

    def check(self) -> None:
        """Nothing can have stopped."""

    def counters(self) -> LinkCounters:
        """No link is counted here."""
        return LinkCounters()

    def replace_endpoint(self, endpoint: Endpoint) -> None:
        """A worker restarted on this node, which opened no shaper since none ran here: reopen it."""
        raise ShapingError(f"worker {endpoint.index} now runs on this node, which opened no shaper: reopen it")

    def place(self, elsewhere: Collection[int]) -> None:
        """Every endpoint is elsewhere already."""

    def replace_elsewhere(self, endpoint: Endpoint) -> None:
        """A worker on another node restarted: nothing here."""

    def close(self) -> None:
        """Nothing to stop."""


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock = self.connection
        sock.settimeout(600)
        try:
            request = wire.read_line(sock)
        except (wire.WireError, OSError) as exc:
            logger.warning("bad request from %s: %s", self.client_address, exc)
            return
        agent = self.server.agent
        if not wire.token_ok(request.pop("token", None), agent.config.token):
            logger.warning("request without the run's token from %s refused", self.client_address)
            with contextlib.suppress(OSError):
                wire.write_line(sock, {"ok": False, "error": "unauthenticated"})
            return
        try:
            answer = agent.handle(request)
        except Exception as exc:
            logger.warning("%s failed: %s", request.get("cmd"), exc, exc_info=logger.isEnabledFor(logging.DEBUG))
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(OSError):
            wire.write_line(sock, answer)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], agent: Agent) -> None:
        self.agent = agent
        super().__init__(address, _Handler)


def prepare_dirs(config: Config) -> None:
    """The workers' directories on this node (their bind mounts must exist before they start)."""
    for slot in range(1, config.workers + 1):
        d = slot_dir(config.run_dir, slot)
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, *config.owner)


def main() -> int:
    """Serve until SIGTERM (the service is removed), then clear the shaping."""
    logging.basicConfig(level=os.environ.get("SQUALL_AGENT_LOG", "INFO"),
                        format="%(asctime)s node-agent %(levelname)s %(message)s", stream=sys.stderr)
    import docker

    config = Config.from_env(dict(os.environ))
    prepare_dirs(config)
    agent = Agent(config, docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=60))
    server = _Server(("0.0.0.0", config.port), agent)  # the token guards it

    def stop(signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logger.info("node agent of run %s on %s listening on port %d", config.run_id, agent.node, config.port)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        agent.close()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
