"""Host side of the agent's control socket (see :mod:`squall.worker.agent` for the protocol)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from squall.cluster.errors import JobError
from squall.worker.commands import AgentCommand
from squall.worker.jsonline import LineError, read_line, write_line

MAX_ANSWER = 1 << 20  # bytes in one answer line


class AgentRequests:
    """What every way of reaching a job agent offers on top of its one ``request``: checked requests,
    ping and waiting until it answers (:class:`AgentClient` here; the swarm engine's relay through a
    node agent)."""

    #: seconds between two pings while waiting for the agent
    ready_poll_s = 0.05

    def request(self, obj: dict[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
        """Send one request and return the answer; :class:`JobError` when the agent does not answer."""
        raise NotImplementedError

    def reachable(self) -> bool:
        """False when the agent certainly cannot answer yet (no need to ask)."""
        return True

    def checked(self, obj: dict[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
        """Like :meth:`request`, raising :class:`JobError` when the answer is not ``ok``."""
        answer = self.request(obj, timeout=timeout)
        if not answer.get("ok"):
            raise JobError(f"agent refused {obj.get('cmd')!r}: {answer.get('error')}")
        return answer

    def ping(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The agent's ping answer, or None when it does not answer (yet)."""
        if not self.reachable():
            return None
        try:
            return self.checked(AgentCommand.PING.request(), timeout=timeout)
        except (JobError, ValueError):
            return None

    def wait_ready(self, deadline: float) -> dict[str, Any] | None:
        """Poll until the agent answers or ``deadline`` (time.monotonic) passes."""
        while time.monotonic() < deadline:
            answer = self.ping()
            if answer is not None:
                return answer
            time.sleep(self.ready_poll_s)
        return None


class AgentClient(AgentRequests):
    """Talks to one agent through its Unix socket; one short connection per request."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path

    def reachable(self) -> bool:
        """The agent's socket exists (the container created it)."""
        return self.socket_path.exists()

    def request(self, obj: dict[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
        """Send one request and return the answer; :class:`JobError` when the agent does not answer."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(str(self.socket_path))
                write_line(sock, obj)
                return read_line(sock, limit=MAX_ANSWER)
        except LineError as exc:
            raise JobError(f"agent at {self.socket_path} answered {obj.get('cmd')!r} badly: {exc}") from exc
        except OSError as exc:
            raise JobError(f"agent at {self.socket_path} did not answer {obj.get('cmd')!r}: {exc}") from exc
