"""Run ids, the labels that mark what a run created, and whether the run that owns them is alive.

Every container and network a run creates carries ``squall.run=<run id>`` plus the owner's host,
pid and process start time. ``squall gc`` removes what belongs to runs whose owner process is gone
(checked with the start time, so a recycled pid is not mistaken for the owner).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

LABEL_RUN = "squall.run"
LABEL_HOST = "squall.owner.host"
LABEL_PID = "squall.owner.pid"
LABEL_START = "squall.owner.start"
LABEL_STATE = "squall.state_dir"
LABEL_NODE = "squall.node"


def new_run_id() -> str:
    """A short random run id (10 hex digits): short, because it ends up in socket paths."""
    return secrets.token_hex(5)


def state_root() -> Path:
    """Where runs keep their files: ``SQUALL_STATE_DIR``, else /var/tmp/squall (root) or ~/.cache/squall."""
    env = os.environ.get("SQUALL_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/tmp/squall")
    return Path.home() / ".cache" / "squall"


@dataclass(frozen=True)
class Owner:
    """The process that owns a run."""

    host: str  # hostname of the machine the owner runs on
    pid: int  # its pid
    start: float  # its start time (psutil create_time), to tell a recycled pid apart

    @classmethod
    def me(cls) -> Owner:
        """The current process."""
        return cls(socket.gethostname(), os.getpid(), psutil.Process().create_time())

    def labels(self, run_id: str, state_dir: Path) -> dict[str, str]:
        """The labels every object of the run carries."""
        return {LABEL_RUN: run_id, LABEL_HOST: self.host, LABEL_PID: str(self.pid),
                LABEL_START: f"{self.start:.3f}", LABEL_STATE: str(state_dir)}

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> Owner | None:
        """The owner recorded in ``labels``, or None when they are incomplete."""
        try:
            return cls(labels[LABEL_HOST], int(labels[LABEL_PID]), float(labels[LABEL_START]))
        except (KeyError, ValueError):
            return None

    def alive(self) -> bool:
        """True when this owner still runs on this host (same pid and start time)."""
        if self.host != socket.gethostname():
            return True  # not ours to judge: another machine sharing the engine
        try:
            return abs(psutil.Process(self.pid).create_time() - self.start) < 0.01
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False


OWNER_FILE = "owner.json"


def write_owner(state_dir: Path, owner: Owner, run_id: str) -> None:
    """Record the owner in the run's state directory (gc reads it when no container is left)."""
    (state_dir / OWNER_FILE).write_text(json.dumps({"run": run_id, **owner.labels(run_id, state_dir)}))


def read_owner(state_dir: Path) -> Owner | None:
    """The owner recorded in ``state_dir``, or None."""
    try:
        return Owner.from_labels(json.loads((state_dir / OWNER_FILE).read_text()))
    except (OSError, ValueError, AttributeError):
        return None
