"""The NFQUEUE delay daemon: one process, one epoll loop, queues in many namespaces.

Start::

    python -m squall.shaping.nfqueue.cli --config FILE [--ready-fd N] [--exit-on-stdin-eof]

Timing design. Every wake-up of the loop does, in order:

1. ``epoll.poll()`` without timeout. The set holds one netlink socket per namespace, a timerfd
   armed (absolute, nanosecond resolution) at the earliest release time of all queues, the
   control socket and a signal wake-up pipe.
2. For each readable namespace socket: stamp ``now`` once, read up to ``drain_batch`` datagrams
   (one packet each) until ``EAGAIN``, and schedule them with their queue's :class:`LinkModel`.
   A constant-delay queue turns the whole batch into one held entry; losses and reorders get their
   verdict at once. Arrival time is therefore "when the daemon read the socket": under overload
   it is late by the socket backlog, which shows up as a larger delay, not as lateness.
3. Release every packet due before ``now + release_slack_us`` (the slack merges near-simultaneous
   releases into one pass; such packets leave at most that much early and count as 0 lateness).
   Lateness = the time verdicts are built minus the scheduled time, kept per queue in a histogram.
4. Send each namespace's verdicts as one datagram, then re-arm the timer.

Nothing in the loop blocks except ``epoll.poll``. Lateness then comes from the CPU: run the
daemon as SCHED_FIFO (``--realtime``, the launcher's default) so busy workers cannot delay it.

Readiness and death. With ``--ready-fd N`` the daemon writes ``ready\\n`` to fd ``N`` once every
configured queue is bound and the control socket listens, keeps the fd open while it runs and
writes ``stopped\\n`` after a clean shutdown. The reader (the harness, see :mod:`.launcher`) sees
end-of-file without ``stopped`` exactly when the daemon died. With ``--exit-on-stdin-eof`` the
daemon shuts down cleanly when its standard input reaches end-of-file (the harness died).

On SIGTERM, SIGINT, the ``shutdown`` command or stdin EOF, the daemon accepts every held packet
(and those queued but not read yet), unbinds, closes and exits 0. If it is killed instead, the
kernel unbinds its queues; the ``--queue-bypass`` rules then let packets through unshaped.

Known limits. Packets that reach a queue between the final batch ACCEPT and the unbind are
dropped by the kernel's unbind flush (a window of microseconds). With ``NFQA_CFG_F_GSO`` a
GRO/GSO super-packet is one queue entry, so a DROP verdict loses all of its segments: loss rates
are exact per *entry*; use UDP or small TCP segments where per-segment loss matters. A socket
keeps its namespace alive: send ``remove_namespace`` when a container goes away.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import select
import time
from collections.abc import Callable, Sequence
from typing import Any

from squall.shaping.clock.sender import Agenda, Applied, NetlinkSenders, Schedule, apply_entry

from .config import DaemonConfig, LinkParams, NamespaceSpec, link_from_dict, namespace_from_dict
from .engine import LinkModel
from .errors import ConfigError
from .histogram import Histogram
from .scheduler import NEVER, Timeline
from .server import ControlServer
from .state import NamespaceState, QueueState, read_kernel_stats
from .timer import TimerFd

logger = logging.getLogger(__name__)


def now_us() -> int:
    """The daemon's clock: ``CLOCK_MONOTONIC`` in integer microseconds."""
    return time.monotonic_ns() // 1000


class Daemon:
    """Holds packets of many queues in many namespaces and releases them on time."""

    def __init__(self, config: DaemonConfig):
        self.config = config
        self._epoll = select.epoll()
        self._timer = TimerFd()
        self._timeline = Timeline()
        self._namespaces: dict[str, NamespaceState] = {}
        self._by_fd: dict[int, NamespaceState] = {}
        self._queues: dict[int, QueueState] = {}
        self._next_index = 0
        self._stopping = False
        self._started = time.monotonic()
        self.wakeups = 0
        self.sends = 0
        self._extra_fds: dict[int, Callable[[], None]] = {}
        self._schedule: Schedule | None = None  # a run's changes, loaded (the ``schedule`` command)
        self._agenda: Agenda | None = None  # the same, started (``schedule_go``)
        self._senders: NetlinkSenders | None = None  # their netlink sockets, one per namespace
        self._applied: list[Applied] = []  # what the schedule did, and when
        self._epoll.register(self._timer.fileno(), select.EPOLLIN)
        self._server: ControlServer | None = None
        self._commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "ping": self._cmd_ping,
            "set_links": self._cmd_set_links,
            "stats": self._cmd_stats,
            "add_namespace": self._cmd_add_namespace,
            "remove_namespace": self._cmd_remove_namespace,
            "shutdown": self._cmd_shutdown,
            "schedule": self._cmd_schedule,
            "schedule_go": self._cmd_schedule_go,
            "schedule_stop": self._cmd_schedule_stop,
        }

    # ------------------------------------------------------------------ setup

    def start(self) -> None:
        """Bind every configured queue, then open the control socket."""
        for spec in self.config.namespaces:
            self.add_namespace(spec)
        self._server = ControlServer(self.config.control_socket, self.handle, self._epoll)
        logger.info(
            "bound %d queues in %d namespaces; control socket %s",
            len(self._queues),
            len(self._namespaces),
            self.config.control_socket,
        )

    def add_namespace(self, spec: NamespaceSpec) -> None:
        """Open a socket in ``spec.netns`` and bind its queues (all or nothing)."""
        if spec.name in self._namespaces:
            raise ConfigError(f"namespace {spec.name!r} is already served")
        ns = NamespaceState.open(spec, rcvbuf=self.config.rcvbuf_bytes)
        try:
            for qspec in spec.queues:
                state = QueueState(self._next_index, ns, qspec, LinkModel(qspec.link, qspec.seed))
                ns.bind(state, maxlen=self.config.queue_maxlen, fail_open=self.config.fail_open)
                self._queues[state.index] = state
                self._next_index += 1
        except BaseException:
            for state in ns.queues.values():
                self._queues.pop(state.index, None)
            ns.close()
            raise
        self._namespaces[spec.name] = ns
        self._by_fd[ns.sock.fileno()] = ns
        self._epoll.register(ns.sock.fileno(), select.EPOLLIN)

    def remove_namespace(self, name: str) -> None:
        """Release everything the namespace holds, unbind its queues and close its socket."""
        ns = self._namespaces.pop(name)
        self._epoll.unregister(ns.sock.fileno())
        del self._by_fd[ns.sock.fileno()]
        for state in ns.queues.values():
            state.release_everything()
            self._timeline.forget(state.index)
            del self._queues[state.index]
        ns.flush()
        ns.close()

    def watch(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` from the loop whenever ``fd`` is readable."""
        self._extra_fds[fd] = callback
        self._epoll.register(fd, select.EPOLLIN)

    def stop(self) -> None:
        """Ask the loop to finish its pass and shut down (safe from signal handlers)."""
        self._stopping = True

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Serve until :meth:`stop`; then release everything and unbind."""
        try:
            while not self._stopping:
                self._pass()
        finally:
            self._shutdown()

    def _pass(self) -> None:
        nxt = self._timeline.next_time()
        change = self._agenda.next_due_ns() if self._agenda is not None else None
        if change is not None:
            nxt = min(nxt, change // 1000)
        if nxt == NEVER:
            self._timer.disarm()
        else:
            self._timer.arm(nxt)
        events = self._epoll.poll()
        self.wakeups += 1
        for fd, _ in events:
            ns = self._by_fd.get(fd)
            if ns is not None:
                self._drain(ns)
            elif fd == self._timer.fd:
                self._timer.fired()
            elif self._server is not None and self._server.owns(fd):
                self._server.on_readable(fd)
            elif fd in self._extra_fds:
                self._extra_fds[fd]()
        if self._agenda is not None:
            self._run_agenda()
        self._release_due()
        self._flush()

    def _drain(self, ns: NamespaceState) -> None:
        packets: list[tuple[int, int]] = []
        stamp = now_us()
        _, errors, _ = ns.sock.read_packets(packets, self.config.drain_batch)
        ns.verdict_errors += errors
        if not packets:
            return
        groups: dict[int, list[int]] = {}
        for queue, pid in packets:
            ids = groups.get(queue)
            if ids is None:
                groups[queue] = [pid]
            else:
                ids.append(pid)
        note = self._timeline.note
        for queue, ids in groups.items():
            state = ns.queues.get(queue)
            if state is None:
                ns.accept_unknown(queue, ids)
                continue
            state.admit(ids, stamp)
            nxt = state.held.next_release()
            if nxt != NEVER:
                note(state.index, nxt)

    def _run_agenda(self) -> None:
        """Apply the scheduled changes that are due: link parameters, then the HTB changes."""
        assert self._agenda is not None and self._senders is not None
        for entry in self._agenda.due(time.monotonic_ns()):
            self._applied.append(apply_entry(entry, self._senders, self._set_links))

    def _release_due(self) -> None:
        now = now_us()
        horizon = now + self.config.release_slack_us
        timeline, queues = self._timeline, self._queues
        for index in timeline.pop_due(horizon):
            state = queues.get(index)
            if state is None:
                continue
            state.emit(state.held.pop_due(horizon, now))
            nxt = state.held.next_release()
            if nxt != NEVER:
                timeline.note(index, nxt)

    def _flush(self) -> None:
        for ns in self._namespaces.values():
            if ns.out:
                ns.flush()
                self.sends += 1

    def _shutdown(self) -> None:
        for ns in self._namespaces.values():
            while True:  # read what is queued so the flush batch id covers it
                packets: list[tuple[int, int]] = []
                _, _, empty = ns.sock.read_packets(packets, 4096)
                for queue, pid in packets:
                    if queue in ns.queues:
                        ns.queues[queue].last_id = pid
                if empty:
                    break
        for name in list(self._namespaces):
            self.remove_namespace(name)
        if self._senders is not None:
            self._senders.close()
        if self._server is not None:
            self._server.close()
        self._timer.close()
        self._epoll.close()
        logger.info("released everything and unbound; exiting")

    # ------------------------------------------------------------------ control

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one control request (see :mod:`.control` for the commands)."""
        cmd = request.get("cmd")
        handler = self._commands.get(cmd) if isinstance(cmd, str) else None
        if handler is None:
            return {"ok": False, "error": f"unknown cmd {cmd!r}; known: {sorted(self._commands)}"}
        return handler(request)

    def _cmd_ping(self, _: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "pid": os.getpid(),
            "queues": len(self._queues),
            "namespaces": sorted(self._namespaces),
        }

    def _cmd_set_links(self, request: dict[str, Any]) -> dict[str, Any]:
        items = request.get("links")
        if not isinstance(items, list):
            raise ConfigError("set_links needs a list 'links'")
        return {"ok": True, "applied": self._set_links(items), "monotonic_us": now_us()}

    def _set_links(self, items: Sequence[Any]) -> int:
        """Validate every item, then change every link (all or nothing); the number changed."""
        updates: list[tuple[QueueState, LinkParams, int | None]] = []
        for i, item in enumerate(items):  # validate everything before changing anything
            if not isinstance(item, dict):
                raise ConfigError(f"links[{i}] must be an object")
            ns = self._namespaces.get(item.get("namespace", ""))
            state = ns.queues.get(item.get("queue", -1)) if ns is not None else None
            if state is None:
                raise ConfigError(f"links[{i}]: no queue {item.get('queue')!r} in {item.get('namespace')!r}")
            seed = item.get("seed")
            if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
                raise ConfigError(f"links[{i}].seed must be an integer")
            updates.append((state, link_from_dict(item.get("link", {}), f"links[{i}].link"), seed))
        for state, params, seed in updates:
            if seed is None:
                state.model.set_params(params)
            else:
                state.model = LinkModel(params, seed)
            state.spec = dataclasses.replace(
                state.spec, link=params, seed=state.spec.seed if seed is None else seed
            )
        return len(updates)

    def _cmd_schedule(self, request: dict[str, Any]) -> dict[str, Any]:
        """Take a run's scheduled changes (:mod:`squall.shaping.clock.sender`) from the file the harness wrote."""
        if self._schedule is not None:
            raise ConfigError("a schedule is already loaded; send schedule_stop first")
        path = request.get("file")
        if not isinstance(path, str):
            raise ConfigError("schedule needs 'file', the schedule's path")
        with open(path, "rb") as handle:
            schedule = Schedule.from_json(handle.read())
        self._senders = NetlinkSenders(schedule.namespaces)
        self._schedule = schedule
        self._applied = []
        return {"ok": True, "entries": len(schedule.entries)}

    def _cmd_schedule_go(self, request: dict[str, Any]) -> dict[str, Any]:
        """Start the loaded schedule from ``start_ns`` (``CLOCK_MONOTONIC``)."""
        start = request.get("start_ns")
        if self._schedule is None or self._agenda is not None:
            raise ConfigError("schedule_go needs a loaded schedule that has not started")
        if not isinstance(start, int) or isinstance(start, bool):
            raise ConfigError("schedule_go needs an integer start_ns")
        self._agenda = Agenda(self._schedule.entries, start)
        return {"ok": True}

    def _cmd_schedule_stop(self, _: dict[str, Any]) -> dict[str, Any]:
        """Drop what is not due yet; answer with every change done."""
        applied = [a.to_dict() for a in self._applied]
        if self._senders is not None:
            self._senders.close()
        self._schedule, self._agenda, self._senders, self._applied = None, None, None, []
        return {"ok": True, "applied": applied}

    def _cmd_stats(self, request: dict[str, Any]) -> dict[str, Any]:
        total = Histogram()
        queues = []
        for ns in self._namespaces.values():
            try:
                kernel = read_kernel_stats(ns.spec.netns)
            except OSError as exc:
                logger.info("kernel stats of %s unavailable: %s", ns.spec.name, exc)
                kernel = {}
            for state in ns.queues.values():
                entry = state.stats()
                entry["kernel"] = kernel.get(state.spec.queue, {})
                queues.append(entry)
                total.merge(state.held.lateness)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        if request.get("reset"):
            for state in self._queues.values():
                state.held.lateness = Histogram()
        return {
            "ok": True,
            "uptime_s": round(time.monotonic() - self._started, 3),
            "cpu_user_s": usage.ru_utime,
            "cpu_system_s": usage.ru_stime,
            "wakeups": self.wakeups,
            "sends": self.sends,
            "verdict_errors": sum(ns.verdict_errors for ns in self._namespaces.values()),
            "lateness": total.summary(),
            "queues": queues,
        }

    def _cmd_add_namespace(self, request: dict[str, Any]) -> dict[str, Any]:
        spec = namespace_from_dict(request.get("namespace"), "namespace")
        self.add_namespace(spec)
        return {"ok": True, "queues": len(spec.queues)}

    def _cmd_remove_namespace(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("name")
        if name not in self._namespaces:
            raise ConfigError(f"no namespace {name!r}")
        self.remove_namespace(str(name))
        return {"ok": True}

    def _cmd_shutdown(self, _: dict[str, Any]) -> dict[str, Any]:
        self.stop()
        return {"ok": True}

