"""Probe jobs run by the host as real-time processes inside the nodes' network namespaces.

Why: a probe is a measurement of the link, and a probe that a CPU-bound neighbour can keep off the
CPU measures the scheduler instead (issue 14: two busy processes moved calibration's delays by
0.65 ms). The containers' agents run jobs as ordinary processes without the right to raise their
priority; the host (root) can. So for the UDP echo probe every node gets a process started here
that enters the node's network namespace (``nsenter --net``), becomes ``SCHED_FIFO``
:data:`PROBE_PRIORITY` (``chrt``; below the nfqueue daemon's 10, so the shaper still releases
packets first) and runs the very worker the agents run (``python -m squall.worker.process``): its
sockets are the node's, its packets cross the node's ``eth0`` and every rule and qdisc there
exactly as the agent's would, and the clock is the one the containers share.

Results come back as files in a temporary directory, are read into memory by
:meth:`HostJobHandle.wait` (:class:`HeldJobResult`) and the directory is removed: nothing is left
on disk and no process outlives ``wait`` (it kills what passed its deadline).

Used when :func:`unavailable` returns None: root, ``nsenter`` and ``chrt`` (util-linux), and every
node's namespace path can be opened. ``SQUALL_HOST_PROBES=0`` turns it off (the agents then run the
probes, as before).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from squall.cluster.errors import JobError
from squall.cluster.jobs import JobResult
from squall.shaping.base import Endpoint

logger = logging.getLogger(__name__)

PROBE_PRIORITY = 5  # SCHED_FIFO: above every ordinary process, below the nfqueue daemon (10)
ENV_SWITCH = "SQUALL_HOST_PROBES"


def unavailable(endpoints: Sequence[Endpoint]) -> str | None:
    """Why the host cannot run the probes itself (None when it can)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"turned off by {ENV_SWITCH}=0"
    if os.geteuid() != 0:
        return "not root (entering a namespace and SCHED_FIFO need it)"
    missing = [tool for tool in ("nsenter", "chrt") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (util-linux)"
    for ep in endpoints:
        try:
            os.close(os.open(ep.netns, os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            return f"node {ep.index}'s namespace {ep.netns} cannot be opened: {exc}"
    return None


@dataclasses.dataclass(frozen=True)
class HeldJobResult(JobResult):
    """A :class:`JobResult` whose files were read into memory before their directory was removed."""

    held_result: Mapping[str, Any] | None = None
    held_metrics: tuple[Mapping[str, Any], ...] = ()
    held_log: str = ""

    def result(self) -> dict[str, Any] | None:
        """The worker's result.json as it was."""
        return dict(self.held_result) if self.held_result is not None else None

    def metrics(self) -> list[dict[str, Any]]:
        """The worker's metrics.jsonl records."""
        return [dict(m) for m in self.held_metrics]

    def log(self) -> str:
        """The worker's output."""
        return self.held_log


class HostJobHandle:
    """Probe processes under way; :meth:`wait` collects them (as :class:`squall.cluster.JobHandle` does)."""

    def __init__(self, job_id: str, procs: list[subprocess.Popen[bytes]], out_dirs: list[Path], root: Path, *,
                 deadline: float) -> None:
        self.job_id = job_id
        self.procs = procs
        self.out_dirs = out_dirs
        self.root = root
        self.deadline = deadline  # time.monotonic()
        # a handle dropped without wait() (its caller raised) still kills and removes, at the latest at exit
        self._finalizer = weakref.finalize(self, _remove, procs, root)

    def wait(self, *, raise_on_failure: bool = True) -> list[JobResult]:
        """Block until every process ended or the deadline passed (then kill it); read and remove the files."""
        results: list[JobResult] = []
        try:
            for node, (proc, out_dir) in enumerate(zip(self.procs, self.out_dirs, strict=True)):
                state = "done"
                try:
                    proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    state = "timeout"
                    proc.kill()
                    proc.wait()
                results.append(_held(node, self.job_id, state, proc.returncode if state == "done" else None,
                                     out_dir))
        finally:
            self.kill()
        bad = [r for r in results if not r.ok]
        if bad and raise_on_failure:
            raise JobError(f"host probe {self.job_id} failed on {len(bad)} of {len(results)} nodes:\n  "
                           + "\n  ".join(r.describe() for r in bad))
        return results

    def kill(self) -> None:
        """Kill what still runs and remove the directory (idempotent)."""
        self._finalizer()


def _remove(procs: list[subprocess.Popen[bytes]], root: Path) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shutil.rmtree(root, ignore_errors=True)


def _held(node: int, job_id: str, state: str, code: int | None, out_dir: Path) -> HeldJobResult:
    plain = JobResult(node, job_id, state, code, None, out_dir)
    try:
        res = plain.result()
    except ValueError:  # a half-written result.json: the job did not finish
        res = None
    duration = res.get("duration_s") if res else None
    return HeldJobResult(node, job_id, state, code, float(duration) if duration is not None else None, out_dir,
                         held_result=res, held_metrics=tuple(plain.metrics()), held_log=plain.log())


def start(endpoints: Sequence[Endpoint], entry: str, config: Mapping[str, Any], *, start_wall: float,
          timeout_s: float) -> HostJobHandle:
    """Start ``entry`` on every node as a real-time process in its namespace, all starting at ``start_wall``.

    Each process is ``nsenter --net=NETNS -- chrt -f PRIORITY python -m squall.worker.process SPEC`` (the
    worker the containers' agents run, so the job's code and files are the same); killed by
    :meth:`HostJobHandle.wait` past ``timeout_s``.
    """
    root = Path(tempfile.mkdtemp(prefix="squall-hostprobe-"))
    job_id = f"h{secrets.token_hex(4)}"
    procs: list[subprocess.Popen[bytes]] = []
    out_dirs: list[Path] = []
    handle = HostJobHandle(job_id, procs, out_dirs, root, deadline=time.monotonic() + timeout_s)
    peers = [ep.address for ep in endpoints]
    try:
        for ep in endpoints:
            out_dir = root / f"n{ep.index}"
            out_dir.mkdir()
            out_dirs.append(out_dir)
            spec = {"job_id": job_id, "entry": entry, "rank": ep.index, "world_size": len(endpoints),
                    "peers": peers, "out_dir": str(out_dir), "config": {**config, "start_wall": start_wall},
                    "seed": 0, "deadline_s": timeout_s}
            (out_dir / "spec.json").write_text(json.dumps(spec))
            with (out_dir / "log.txt").open("wb") as log:
                procs.append(subprocess.Popen(
                    ["nsenter", f"--net={ep.netns}", "--", "chrt", "-f", str(PROBE_PRIORITY),
                     sys.executable, "-m", "squall.worker.process", str(out_dir / "spec.json")],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=_env()))
    except BaseException:
        handle.kill()
        raise
    return handle


def _env() -> dict[str, str]:
    """The host's environment, with this checkout importable from any working directory."""
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
