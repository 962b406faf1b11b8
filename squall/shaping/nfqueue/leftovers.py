"""What the nfqueue backend keeps on the host, outside the containers, and how ``squall gc`` finds it.

Everything else a shaper creates (tc objects, IFB devices, the run's iptables chains) lives in the
containers' network namespaces and goes with them; the netem backend keeps nothing on the host.
The nfqueue backend has its *work directory*, its *delay daemon* and its *hold chain*:

* the work directory ``<tmp>/squall-nfq-<run id>-<random>/`` holds the daemon's config
  (``config.json``, named on the daemon's command line), its control socket and ``owner.json``:
  the run id and the pid and start time of the process that owns the shaper;
* the daemon (``python -m squall.shaping.nfqueue.cli --config <work dir>/config.json``) exits
  by itself when its owner dies (its stdin closes), but a daemon that outlived it would keep the
  dead containers' namespaces alive through its sockets;
* the hold chain ``SQUALL-<run id>-nq`` in the host's ``mangle`` table and its jump from
  ``PREROUTING`` (:mod:`.hold_plan`), where packets between the containers wait. The
  backend deletes the work directory only after the chain is gone, so a chain left behind always
  has a work directory that names its run.

:func:`find` lists them by run id; :meth:`Leftover.remove` stops the daemons (SIGTERM, so held
packets are released, then SIGKILL), removes the chains and deletes the directory. ``squall gc``
gets them through :func:`squall.shaping.select.host_leftovers` as
:class:`~squall.shaping.base.HostLeftover`; which runs are dead is its decision
(:mod:`squall.cluster.gc`): this module never judges ownership.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from squall.shaping.base import ShapingError

from . import hold, hold_plan
from .launcher import DAEMON_MODULE

logger = logging.getLogger(__name__)

WORKDIR_PREFIX = "squall-nfq-"
OWNER_FILE = "owner.json"
CONFIG_FILE = "config.json"
STOP_TIMEOUT_S = 5.0  # how long a daemon gets to release its packets after SIGTERM


@dataclass(frozen=True)
class Leftover:
    """One shaper's host-side objects (a :class:`~squall.shaping.base.HostLeftover`)."""

    run_id: str  # the run the shaper belonged to
    workdir: Path  # its work directory (may be gone while a daemon still runs)
    owner_pid: int | None  # pid of the process that owned the shaper, None when unrecorded
    owner_start: float | None  # that process's start time (psutil create_time)
    daemons: tuple[int, ...]  # pids of delay daemons started from this work directory
    chains: tuple[str, ...] = ()  # the run's hold chains in this process's network namespace
    backend: str = "nfqueue"  # the backend that left it

    def remove(self, *, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
        """Stop the daemons, remove the chains, delete the work directory; return what could not go, with why."""
        errors = _stop(self.daemons, timeout_s)
        for chain in self.chains:
            try:
                with hold.host_lock():
                    hold.remove_chain(chain)
            except ShapingError as exc:
                errors.append(f"hold chain {chain}: {exc}")
        if any(chain in hold.leftover_chains() for chain in self.chains):
            return errors  # keep the work directory: it is how the next gc finds the chain
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.workdir.exists():
            errors.append(f"nfqueue work directory {self.workdir} could not be deleted")
        return errors


def make_workdir(run_id: str) -> str:
    """Create the work directory of run ``run_id``'s shaper and record its owner (this process)."""
    path = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{run_id}-")
    owner = {"run": run_id, "pid": os.getpid(), "start": psutil.Process().create_time()}
    (Path(path) / OWNER_FILE).write_text(json.dumps(owner))
    return path


def run_of_workdir(name: str) -> str | None:
    """The run id in a work directory's name (``squall-nfq-<run id>-<random>``), or None."""
    if not name.startswith(WORKDIR_PREFIX):
        return None
    run, sep, rand = name[len(WORKDIR_PREFIX):].rpartition("-")
    return run if sep and run and rand else None


def daemon_workdir(cmdline: Sequence[str]) -> str | None:
    """The work directory a delay daemon was started from, given its command line, or None."""
    if DAEMON_MODULE not in cmdline or "--config" not in cmdline:
        return None
    at = list(cmdline).index("--config") + 1
    if at >= len(cmdline):
        return None
    workdir = os.path.dirname(cmdline[at])
    return workdir if run_of_workdir(os.path.basename(workdir)) is not None else None


def find(root: Path | None = None) -> list[Leftover]:
    """Every tagged work directory under ``root`` (default: the temp directory) and its daemons.

    A daemon whose work directory (under ``root``) is gone is listed too, with no owner recorded.
    """
    root = Path(root or tempfile.gettempdir())
    daemons: dict[str, list[int]] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        workdir = daemon_workdir(proc.info.get("cmdline") or [])
        if workdir is not None and Path(workdir).parent == root:
            daemons.setdefault(workdir, []).append(proc.info["pid"])
    dirs = {str(p) for p in root.glob(f"{WORKDIR_PREFIX}*") if p.is_dir() and run_of_workdir(p.name)}
    chains: dict[str, list[str]] = {}
    for chain in hold.leftover_chains():
        chains.setdefault(hold_plan.run_of_chain(chain) or "", []).append(chain)
    found = []
    for workdir in sorted(dirs | set(daemons)):
        run = run_of_workdir(os.path.basename(workdir))
        assert run is not None
        pid, start = _owner(Path(workdir))
        found.append(Leftover(run, Path(workdir), pid, start, tuple(daemons.get(workdir, ())),
                              tuple(chains.get(run, ()))))
    return found


def _owner(workdir: Path) -> tuple[int | None, float | None]:
    try:
        record = json.loads((workdir / OWNER_FILE).read_text())
        return int(record["pid"]), float(record["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def remove(leftover: Leftover, *, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
    """:meth:`Leftover.remove`."""
    return leftover.remove(timeout_s=timeout_s)


def _stop(pids: Iterable[int], timeout_s: float) -> list[str]:
    errors: list[str] = []
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if DAEMON_MODULE in proc.cmdline():  # still the daemon, not a recycled pid
                proc.terminate()
                procs.append(proc)
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied as exc:
            errors.append(f"nfqueue daemon {pid}: {exc}")
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        logger.warning("nfqueue daemon %d ignored SIGTERM for %.0f s: killing it", proc.pid, timeout_s)
        proc.kill()
    deadline = time.monotonic() + timeout_s
    _, alive = psutil.wait_procs(alive, timeout=max(0.0, deadline - time.monotonic()))
    return errors + [f"nfqueue daemon {p.pid} survived SIGKILL" for p in alive]
