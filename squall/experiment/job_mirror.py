"""Running ranks' lines copied here from workers on other machines, every few seconds.

On one machine the hang watch and the live display read each rank's ``stdout.txt``, ``stderr.txt`` and
``metrics.jsonl`` in its job folder as they grow. On the swarm engine a worker on another machine
writes them on its node; :class:`JobMirror` asks the cluster (``sync_job(node, job_id)``, which the
swarm engine has and which copies them through the node's agent, only when the worker is elsewhere)
every :data:`INTERVAL_S` seconds for each running job, so a rank's line reaches the watchers at most
that much later. An engine without ``sync_job`` (the local one) needs no mirror.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

INTERVAL_S = 2.0  # seconds between two copies; the hang watch's threshold is a minute or more

Sync = Callable[[int, str], None]  # (node, job id) -> its files copied here


def sync_of(cluster: Any) -> Sync | None:
    """The cluster's ``sync_job`` (None: its workers' files are here already)."""
    sync = getattr(cluster, "sync_job", None)
    return sync if callable(sync) else None


class JobMirror:
    """In a thread: ``sync(node, job)`` for each running job that ``current()`` names, every ``interval`` s."""

    def __init__(self, sync: Sync, current: Callable[[], Sequence[tuple[int, str]]],
                 interval: float = INTERVAL_S) -> None:
        self.sync = sync
        self.current = current
        self.interval = interval
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="squall-job-mirror", daemon=True)

    def start(self) -> JobMirror:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for node, job in self.current():
                if self._stop.is_set():
                    return
                try:
                    self.sync(node, job)
                except Exception as exc:  # a copy that failed is a late line, never a failed run
                    logger.debug("copying node %d's job %s: %s", node, job, exc)
                    self.errors.append(f"node {node}: {exc}")
