"""Client of the daemon's control socket (JSON lines over a Unix stream socket).

Commands (request -> answer; every answer has ``"ok"``, failures carry ``"error"``):

``{"cmd": "ping"}``
    -> ``{"ok": true, "pid": 123, "queues": 6, "namespaces": ["a", "b"]}``
``{"cmd": "set_links", "links": [{"namespace": "b", "queue": 1, "link": {...}, "seed": 7?}]}``
    Validates every entry first, then applies all; packets read after the answer use the new
    parameters, packets already held keep their release time (like ``tc qdisc change``). With
    ``seed`` the link's RNG restarts from it. -> ``{"ok": true, "applied": 1, "monotonic_us": ...}``
``{"cmd": "stats", "reset": false}``
    -> per queue: seen, accepted, dropped, reordered, held, lateness {count, mean_us, p50_us,
    p90_us, p99_us, p999_us, max_us}, kernel {queue_total, queue_dropped, user_dropped,
    id_sequence}; daemon: cpu_user_s, cpu_system_s, wakeups, sends, verdict_errors, lateness.
    ``reset`` clears the lateness histograms after answering.
``{"cmd": "add_namespace", "namespace": {"name": ..., "netns": ..., "queues": [...]}}``
``{"cmd": "remove_namespace", "name": ...}``
    Releases what it holds, unbinds its queues.
``{"cmd": "schedule", "file": PATH}``
    Reads a run's scheduled changes (:class:`squall.shaping.clock.sender.Schedule`) from the file the
    harness wrote and opens netlink sockets in the containers' namespaces for them.
    -> ``{"ok": true, "entries": 12}``
``{"cmd": "schedule_go", "start_ns": N}``
    Starts it: each change is applied at ``N`` plus its time, from the event loop (link parameters,
    then the HTB changes). -> ``{"ok": true}``
``{"cmd": "schedule_stop"}``
    Drops the changes not yet due. -> ``{"ok": true, "applied": [{index, due_ns, done_ns, errors}]}``
``{"cmd": "shutdown"}``
    Answers first, then releases everything, unbinds and exits 0; wait for the process (or
    ``stopped`` on the lifeline, see :mod:`.launcher`) to know it is done.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from .config import LinkParams, NamespaceSpec, to_jsonable
from .errors import ControlError


class ControlClient:
    """One connection to a daemon; usable as a context manager."""

    def __init__(self, path: str, *, timeout_s: float = 5.0):
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(path)
        except OSError as exc:
            self._sock.close()
            raise ControlError(f"cannot connect to the daemon at {path}: {exc}") from exc
        self._rfile = self._sock.makefile("rb")

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection."""
        self._rfile.close()
        self._sock.close()

    def request(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Send one command and return its answer; raise :class:`ControlError` unless ``ok``."""
        try:
            self._sock.sendall(json.dumps(request).encode() + b"\n")
            line = self._rfile.readline()
        except OSError as exc:
            raise ControlError(f"control socket {self.path}: {exc}") from exc
        if not line:
            raise ControlError(f"the daemon closed the control connection ({self.path})")
        reply = json.loads(line)
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error") if isinstance(reply, dict) else reply
            raise ControlError(f"{request.get('cmd')}: {error}")
        return reply

    def ping(self) -> dict[str, Any]:
        """Liveness check; answers with the daemon's pid and what it serves."""
        return self.request({"cmd": "ping"})

    def set_links(
        self, links: Sequence[tuple[str, int, LinkParams]], *, seed: int | None = None
    ) -> dict[str, Any]:
        """Change the parameters of ``(namespace, queue, params)`` links at once."""
        items = []
        for namespace, queue, params in links:
            item: dict[str, Any] = {"namespace": namespace, "queue": queue, "link": to_jsonable(params)}
            if seed is not None:
                item["seed"] = seed
            items.append(item)
        return self.request({"cmd": "set_links", "links": items})

    def stats(self, *, reset: bool = False) -> dict[str, Any]:
        """Counters, lateness percentiles and CPU time."""
        return self.request({"cmd": "stats", "reset": reset})

    def add_namespace(self, spec: NamespaceSpec) -> dict[str, Any]:
        """Start serving another namespace (e.g. a restarted container)."""
        return self.request({"cmd": "add_namespace", "namespace": to_jsonable(spec)})

    def remove_namespace(self, name: str) -> dict[str, Any]:
        """Stop serving a namespace; what it held is released first."""
        return self.request({"cmd": "remove_namespace", "name": name})

    def schedule(self, path: str) -> dict[str, Any]:
        """Hand the daemon a run's scheduled changes (a file written by the harness)."""
        return self.request({"cmd": "schedule", "file": path})

    def schedule_go(self, start_ns: int) -> dict[str, Any]:
        """Start the loaded schedule: its times count from ``start_ns`` (``CLOCK_MONOTONIC``)."""
        return self.request({"cmd": "schedule_go", "start_ns": start_ns})

    def schedule_stop(self) -> list[dict[str, Any]]:
        """Stop the schedule; every change it did."""
        applied = self.request({"cmd": "schedule_stop"}).get("applied", [])
        return list(applied) if isinstance(applied, list) else []

    def shutdown(self) -> dict[str, Any]:
        """Ask the daemon to release everything and exit 0."""
        return self.request({"cmd": "shutdown"})
