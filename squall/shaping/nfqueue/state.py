"""Per-namespace and per-queue state of the daemon: sockets, link models, held packets, counters.

A :class:`NamespaceState` owns one netlink socket created inside its namespace and bound to all of
its queues, plus an output buffer: every verdict produced in one pass of the event loop for that
namespace is appended there and sent as one datagram (or a few 64 KiB ones) by :meth:`flush`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from squall.shaping.kernel.netns import entered

from .config import NamespaceSpec, QueueSpec
from .engine import DROP, LinkModel
from .netlink import NF_ACCEPT, NF_DROP, QueueSocket, pack_verdict_body, verdict_prefix
from .scheduler import HeldQueue, Release

logger = logging.getLogger(__name__)

ID_MASK = 0xFFFFFFFF
FLUSH_AHEAD = 1 << 30  # shutdown batch id: last id seen + this covers packets not yet read


def read_kernel_stats(netns: str) -> dict[int, dict[str, int]]:
    """Kernel counters of every bound queue in ``netns`` (``/proc/net/netfilter/nfnetlink_queue``).

    ``queue_dropped`` counts packets dropped because the queue was full (``queue_maxlen``);
    ``user_dropped`` those the kernel could not hand to the socket (receive buffer full).
    """
    with entered(netns), open("/proc/thread-self/net/netfilter/nfnetlink_queue") as fh:
        text = fh.read()
    return parse_kernel_stats(text)


def parse_kernel_stats(text: str) -> dict[int, dict[str, int]]:
    """Parse the ``nfnetlink_queue`` proc file: one line per queue, whitespace separated."""
    out: dict[int, dict[str, int]] = {}
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 8:
            continue
        queue, portid, total, _mode, _range, dropped, user_dropped, id_seq = (int(c) for c in cols[:8])
        out[queue] = {
            "portid": portid,
            "queue_total": total,
            "queue_dropped": dropped,
            "user_dropped": user_dropped,
            "id_sequence": id_seq,
        }
    return out


@dataclass
class QueueState:
    """One bound queue: its link model, held packets and counters."""

    index: int  # unique across the daemon, the key in the timeline
    namespace: NamespaceState
    spec: QueueSpec
    model: LinkModel
    held: HeldQueue = field(default_factory=HeldQueue)
    seen: int = 0  # packets read from the kernel
    accepted: int = 0  # ACCEPT verdicts after the delay
    dropped: int = 0  # DROP verdicts (loss model)
    reordered: int = 0  # released at once (reorder model or zero delay)
    last_id: int = 0  # highest packet id read
    _single: bytes = b""
    _batch: bytes = b""

    def __post_init__(self) -> None:
        self._single = verdict_prefix(self.spec.queue, batch=False)
        self._batch = verdict_prefix(self.spec.queue, batch=True)

    def admit(self, ids: list[int], now_us: int) -> None:
        """Schedule packets read at ``now_us``; lost and undelayed ones get their verdict now."""
        self.seen += len(ids)
        self.last_id = ids[-1]
        model = self.model
        if model.is_constant:
            self.held.hold_many(now_us + model.params.delay_us, ids)
            return
        out = self.namespace.out
        schedule, hold = model.schedule, self.held.hold
        for pid in ids:
            release = schedule(now_us)
            if release == DROP:
                out += self._single
                out += pack_verdict_body(NF_DROP, pid)
                self.dropped += 1
            elif release <= now_us:
                out += self._single
                out += pack_verdict_body(NF_ACCEPT, pid)
                self.reordered += 1
            else:
                hold(release, pid)

    def emit(self, release: Release) -> None:
        """Append the ACCEPT verdicts of ``release`` (singles first, then the batch)."""
        out = self.namespace.out
        single = self._single
        for pid in release.single_ids:
            out += single
            out += pack_verdict_body(NF_ACCEPT, pid)
        if release.batch_max_id is not None:
            out += self._batch
            out += pack_verdict_body(NF_ACCEPT, release.batch_max_id)
        self.accepted += release.count

    def release_everything(self) -> None:
        """Accept all held packets and those queued in the kernel but not read yet."""
        self.accepted += self.held.pop_all().count
        out = self.namespace.out
        out += self._batch
        out += pack_verdict_body(NF_ACCEPT, (self.last_id + FLUSH_AHEAD) & ID_MASK)

    def stats(self) -> dict[str, Any]:
        """Counters and lateness percentiles for the ``stats`` command."""
        return {
            "namespace": self.namespace.spec.name,
            "queue": self.spec.queue,
            "source": self.spec.source,
            "seen": self.seen,
            "accepted": self.accepted,
            "dropped": self.dropped,
            "reordered": self.reordered,
            "held": self.held.held,
            "lateness": self.held.lateness.summary(),
        }


class NamespaceState:
    """One receiving namespace: its socket, its queues and its pending verdicts."""

    def __init__(self, spec: NamespaceSpec, sock: QueueSocket):
        self.spec = spec
        self.sock = sock
        self.queues: dict[int, QueueState] = {}
        self.out = bytearray()
        self.verdict_errors = 0  # NLMSG_ERROR answers, e.g. verdicts on unknown ids
        self.unknown_packets = 0  # packets of a queue this daemon does not know (accepted)

    @classmethod
    def open(cls, spec: NamespaceSpec, *, rcvbuf: int) -> NamespaceState:
        """Create the socket inside ``spec.netns`` (binding happens in :meth:`bind`)."""
        with entered(spec.netns):
            sock = QueueSocket.open(rcvbuf=rcvbuf)
        return cls(spec, sock)

    def bind(self, state: QueueState, *, maxlen: int, fail_open: bool) -> None:
        """Bind one queue number on this namespace's socket."""
        self.sock.bind_queue(state.spec.queue, maxlen=maxlen, fail_open=fail_open)
        self.queues[state.spec.queue] = state

    def accept_unknown(self, queue: int, ids: list[int]) -> None:
        """Pass packets of a queue without state (cannot happen unless bound elsewhere)."""
        prefix = verdict_prefix(queue, batch=False)
        for pid in ids:
            self.out += prefix
            self.out += pack_verdict_body(NF_ACCEPT, pid)
        self.unknown_packets += len(ids)

    def flush(self) -> None:
        """Send every verdict appended since the last flush."""
        if self.out:
            self.sock.send(self.out)
            self.out.clear()

    def close(self) -> None:
        """Unbind every queue (after :meth:`QueueState.release_everything`) and close the socket."""
        for queue in list(self.queues):
            try:
                self.sock.unbind_queue(queue)
            except OSError as exc:
                logger.warning("unbinding queue %d in %s: %s", queue, self.spec.name, exc)
        self.queues.clear()
        self.sock.close()
