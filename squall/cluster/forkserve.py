"""Host side of the fork server: one container per run whose forks become the workers' agents.

:mod:`squall.worker.forkserver` says what it does inside. Here: the container that runs it (the
worker image, the host's pids and cgroup mount, ``CAP_SYS_ADMIN``, no network, the run's labels so
teardown and ``squall gc`` remove it with the workers), the commands a worker container gets in its
place (:func:`standin_command`), and :meth:`ForkServer.place`, which asks for an agent in one worker
container and, when that fails, tells the container's stand-in to start the agent itself
(``agent.fallback``): a host where the fork cannot be done (rootless Docker, user namespaces, another
cgroup layout) runs as before, slower to start, with one warning.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from squall.cluster.engine import ENGINE_ERRORS
from squall.cluster.errors import ClusterError
from squall.worker.commands import FALLBACK_FILE, PID_FILE
from squall.worker.jsonline import LineError, read_line, write_line

logger = logging.getLogger(__name__)

FORK_MOUNT = "/squall/fork"  # the fork server's directory: its socket
CGROUP_MOUNT = "/squall/host-cgroup"  # the host's /sys/fs/cgroup, where the forks join the workers' cgroups
HOST_CGROUP = "/sys/fs/cgroup"
SOCKET = "fork.sock"
FORK_TIMEOUT_S = 60.0  # one fork request, start to answer (the server serves them one at a time)
MAX_ANSWER = 1 << 16
CPU_SHARES = 8192  # 8x a worker's weight: its imports are what every worker waits for


def agent_command(socket_path: str, preload: Sequence[str]) -> list[str]:
    """The agent as a worker container's own command (no fork server)."""
    return ["python3", "-m", "squall.worker.agent", "--socket", socket_path, "--preload", ",".join(preload)]


def standin_command(run_mount: str, socket_path: str, preload: Sequence[str]) -> list[str]:
    """A worker container's command when its agent is forked in: the stand-in, the agent as fallback."""
    return ["python3", "-m", "squall.worker.standin", "--run-dir", run_mount, "--",
            *agent_command(socket_path, preload)]


def forked_agent_argv(run_mount: str, socket_path: str, preload: Sequence[str]) -> list[str]:
    """The agent's arguments in a fork (its modules are the fork server's already): it writes its pid where
    the stand-in waits for it."""
    return ["--socket", socket_path, "--preload", ",".join(preload), "--pid-file", f"{run_mount}/{PID_FILE}"]


class ForkServer:
    """The fork server container of one run."""

    def __init__(self, client: Any, *, name: str, image: str, directory: Path, labels: Mapping[str, str],
                 env: Mapping[str, str], preload: Sequence[str], code: Mapping[str, Mapping[str, str]]) -> None:
        self.client = client
        self.name = name
        self.image = image
        self.directory = directory
        self.labels = dict(labels)
        self.env = dict(env)
        self.preload = tuple(preload)
        # the workers' code mounts (the project, third-party protocols): what it imports must be found
        # at the same paths as in the workers, or a fork would hold a catalog without their protocols
        self.code = {k: dict(v) for k, v in code.items()}
        self.container_id: str | None = None
        self._failed: str | None = None  # why forks are not used (set once, logged once)
        self._lock = threading.Lock()
        self._ready_lock = threading.Lock()
        self._ready: bool | None = None  # the server answered (None: not asked yet)

    @property
    def socket_path(self) -> Path:
        """The server's socket on this host."""
        return self.directory / SOCKET

    def start(self) -> str:
        """Create and start the container (the server imports in the background); its id."""
        self.directory.mkdir(parents=True, exist_ok=True)
        api = self.client.api
        host_config = api.create_host_config(
            binds={**self.code, str(self.directory): {"bind": FORK_MOUNT, "mode": "rw"},
                   HOST_CGROUP: {"bind": CGROUP_MOUNT, "mode": "rw"}},
            pid_mode="host", cgroupns="host", cap_add=["SYS_ADMIN"], network_mode="none", init=True,
            cpu_shares=CPU_SHARES,
        )
        command = ["python3", "-m", "squall.worker.forkserver", "--socket", f"{FORK_MOUNT}/{SOCKET}",
                   "--preload", ",".join(self.preload), "--cgroup-root", CGROUP_MOUNT]
        container = api.create_container(self.image, command=command, name=self.name, detach=True,
                                         environment=self.env, labels=self.labels, host_config=host_config,
                                         user="0:0")
        self.container_id = container["Id"]
        api.start(self.container_id)
        return self.container_id

    def wait_ready(self, deadline: float, stop: threading.Event | None = None) -> bool:
        """Whether the server answered a ping before ``deadline``; if not, forks are off for this run.
        Safe from several threads: the first asks, the others wait for its answer. ``stop`` set: False
        at once (start-up was interrupted)."""
        with self._ready_lock:
            if self._ready is None:
                self._ready = self._poll_ready(deadline, stop or threading.Event())
            return self._ready

    def _poll_ready(self, deadline: float, stop: threading.Event) -> bool:
        while time.monotonic() < deadline:
            if stop.is_set():
                return False
            if self.socket_path.exists():
                try:
                    if self._request({"cmd": "ping"}, timeout=2.0).get("ok"):
                        return True
                except (OSError, LineError):
                    pass
            if not self._running():
                self._give_up("the fork server's container exited:\n" + self._logs())
                return False
            time.sleep(0.05)
        self._give_up("the fork server did not answer in time")
        return False

    def place(self, target_pid: int, run_dir: Path, env: Mapping[str, str], cwd: str, argv: Sequence[str]) -> bool:
        """Fork an agent into the container whose init is host pid ``target_pid``; on failure make its
        stand-in start the agent itself. Whether the fork did it."""
        if self._failed is None and self._ready:
            try:
                answer = self._request({"cmd": "fork", "target": target_pid, "env": dict(env), "cwd": cwd,
                                        "argv": list(argv)}, timeout=FORK_TIMEOUT_S)
            except (OSError, LineError) as exc:
                answer = {"ok": False, "error": f"no answer: {exc}"}
            if answer.get("ok"):
                return True
            self._give_up(str(answer.get("error")))
        (run_dir / FALLBACK_FILE).write_text("the fork server could not place the agent\n")
        return False

    def _give_up(self, why: str) -> None:
        with self._lock:
            if self._failed is None:
                self._failed = why
                logger.warning("agents are not forked in this run (each imports its own modules, slower): %s",
                               why)

    def _request(self, obj: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.socket_path))
            write_line(sock, obj)
            return read_line(sock, limit=MAX_ANSWER)

    def _running(self) -> bool:
        try:
            return bool(self.client.api.inspect_container(self.container_id)["State"].get("Running"))
        except ENGINE_ERRORS as exc:
            raise ClusterError(f"fork server {self.name}: {exc}") from exc

    def _logs(self) -> str:
        try:
            return str(self.client.api.logs(self.container_id, tail=20).decode(errors="replace"))
        except ENGINE_ERRORS:
            return "(no logs)"
