"""Held packets and release timing, without sockets.

:class:`HeldQueue` keeps the packets of one kernel queue that the daemon has read but not yet
given a verdict, in two structures:

* ``fifo``: entries ``(release_us, [ids])`` whose release times never decrease. Packet ids are
  assigned by the kernel in arrival order, so the fifo also holds ids in increasing order. A
  constant-delay link puts a whole drained batch into one entry.
* ``heap``: ``(release_us, id)`` of packets whose release time is earlier than the fifo's last
  entry (jitter, or a delay that was lowered at run time).

Kernel rule: ``VERDICT_BATCH(id=M)`` applies to *every* packet still queued with an id ``<= M``.
Lost and reordered packets get their verdict at once, so what is still queued in the kernel is
exactly what is held here. A due prefix of the fifo may therefore be released with one batch
verdict if the heap is empty (no held packet with a smaller id can be overtaken); otherwise each
due packet gets its own verdict (see :class:`Release`).

:class:`Timeline` is a lazy min-heap of "queue ``i`` wants a wake-up at ``t``" entries across all
queues of all namespaces, so a wake-up costs O(log queues), not a scan of every queue.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from .histogram import Histogram

NEVER = 1 << 62  # a release time later than any real one


@dataclass
class Release:
    """Verdicts due for one queue: a batch up to ``batch_max_id`` and/or single ids."""

    batch_max_id: int | None = None  # one VERDICT_BATCH(ACCEPT) covering ids <= this
    batch_count: int = 0  # how many held packets the batch releases
    single_ids: list[int] = field(default_factory=list)  # one VERDICT(ACCEPT) each

    @property
    def count(self) -> int:
        """Number of packets released."""
        return self.batch_count + len(self.single_ids)


class HeldQueue:
    """Packets of one queue waiting for their release time."""

    def __init__(self) -> None:
        self.fifo: deque[tuple[int, list[int]]] = deque()
        self.heap: list[tuple[int, int]] = []
        self._tail = 0  # release time of the fifo's last entry
        self.held = 0  # packets held (fifo + heap)
        self.lateness = Histogram()  # actual release - scheduled release, us

    def hold_many(self, release_us: int, ids: list[int]) -> None:
        """Hold packets (in arrival order) that all share one release time."""
        self.held += len(ids)
        if release_us >= self._tail:
            fifo = self.fifo
            if fifo and fifo[-1][0] == release_us:
                fifo[-1][1].extend(ids)
            else:
                fifo.append((release_us, ids))
            self._tail = release_us
        else:
            for pid in ids:
                heapq.heappush(self.heap, (release_us, pid))

    def hold(self, release_us: int, pid: int) -> None:
        """Hold one packet."""
        self.held += 1
        if release_us >= self._tail:
            fifo = self.fifo
            if fifo and fifo[-1][0] == release_us:
                fifo[-1][1].append(pid)
            else:
                fifo.append((release_us, [pid]))
            self._tail = release_us
        else:
            heapq.heappush(self.heap, (release_us, pid))

    def next_release(self) -> int:
        """Earliest release time held, or :data:`NEVER`."""
        first = self.fifo[0][0] if self.fifo else NEVER
        if self.heap and self.heap[0][0] < first:
            return self.heap[0][0]
        return first

    def pop_due(self, horizon_us: int, now_us: int) -> Release:
        """Remove every packet due at or before ``horizon_us``; lateness is measured at ``now_us``."""
        out = Release()
        late = self.lateness
        heap = self.heap
        while heap and heap[0][0] <= horizon_us:
            release, pid = heapq.heappop(heap)
            out.single_ids.append(pid)
            late.record(now_us - release)
        fifo = self.fifo
        batchable = not heap
        while fifo and fifo[0][0] <= horizon_us:
            release, ids = fifo.popleft()
            late.record(now_us - release, len(ids))
            if batchable:
                out.batch_max_id = ids[-1]
                out.batch_count += len(ids)
            else:
                out.single_ids.extend(ids)
        if not fifo:
            self._tail = 0
        self.held -= out.count
        return out

    def pop_all(self) -> Release:
        """Remove everything (shutdown): one batch up to the highest id held, if any."""
        ids = [pid for _, pid in self.heap]
        for _, group in self.fifo:
            ids.extend(group)
        self.heap.clear()
        self.fifo.clear()
        self._tail = 0
        self.held = 0
        if not ids:
            return Release()
        return Release(batch_max_id=max(ids), batch_count=len(ids))


class Timeline:
    """When each queue next needs the daemon's attention, across all queues."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int]] = []
        self._armed: dict[int, int] = {}  # queue index -> time of its valid heap entry

    def note(self, index: int, when_us: int) -> None:
        """Queue ``index`` has a packet due at ``when_us`` (earlier notes win)."""
        if when_us < self._armed.get(index, NEVER):
            self._armed[index] = when_us
            heapq.heappush(self._heap, (when_us, index))

    def forget(self, index: int) -> None:
        """Queue ``index`` was removed or emptied; its heap entries become stale."""
        self._armed.pop(index, None)

    def pop_due(self, horizon_us: int) -> list[int]:
        """Queues with an entry at or before ``horizon_us``; they are un-noted until noted again."""
        due: list[int] = []
        heap, armed = self._heap, self._armed
        while heap and heap[0][0] <= horizon_us:
            when, index = heapq.heappop(heap)
            if armed.get(index) == when:
                del armed[index]
                due.append(index)
        return due

    def next_time(self) -> int:
        """Earliest valid entry, or :data:`NEVER`; drops stale entries on the way."""
        heap, armed = self._heap, self._armed
        while heap:
            when, index = heap[0]
            if armed.get(index) == when:
                return when
            heapq.heappop(heap)
        return NEVER
