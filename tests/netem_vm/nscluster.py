"""A cluster without Docker: hosts in plain network namespaces on a bridge, one job agent each.

The netem VM (``scripts/netem-vm/``) has a netem kernel but no Docker, so the conformance suite and
the calibration run there on this stand-in. It offers what they use of
:class:`squall.cluster.Cluster` (``run_id``, ``nodes``, ``engine``, ``endpoints()``,
``open_shaper()``, ``placement()``, ``clock_offsets()``, ``start_job``, ``run_job``) and nothing
else. The namespaces are :class:`squall.shaping.testnet.bridged_lan.BridgedLan`'s (``h<i>`` with ``eth0`` a veth
port of a bridge, as a container's); each runs the same agent the containers run
(:mod:`squall.worker.agent`, probe jobs preloaded, so a job costs a fork rather than a Python start,
which is several seconds under TCG), reached through a Unix socket in a temporary directory, and
the jobs' results are read by the harness's own :class:`~squall.cluster.jobs.JobResult`.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squall.cluster.agent_client import AgentClient
from squall.cluster.errors import JobError
from squall.cluster.jobs import JobResult
from squall.shaping import Shaper, open_shaper
from squall.shaping.base import Endpoint
from squall.shaping.testnet.bridged_lan import BridgedLan

logger = logging.getLogger(__name__)

PRELOAD = "squall.calibration.probes"  # what the agents import before serving: the probe jobs
AGENT_PRIORITY = 5  # SCHED_FIFO of the agents and their jobs (the probes); see tests/timing.py
READY_TIMEOUT_S = 180.0  # four agents starting Python at once under TCG on a loaded host


@dataclass(frozen=True)
class NsNode:
    """One host: its index, address, agent and directory."""

    index: int
    address: str
    agent: AgentClient
    run_dir: Path


class NsJobHandle:
    """A job started on some hosts; :meth:`wait` collects the results (as :class:`squall.cluster.JobHandle`)."""

    def __init__(self, cluster: NamespaceCluster, job_id: str, nodes: list[int], timeout: float) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.nodes = nodes
        self.deadline = time.monotonic() + timeout

    def wait(self, *, raise_on_failure: bool = True) -> list[JobResult]:
        """Block until every host finished or the deadline passed (then cancel); return the results."""
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            results = list(pool.map(self._wait_one, self.nodes))
        bad = [r for r in results if not r.ok]
        if bad and raise_on_failure:
            raise JobError(f"job {self.job_id} failed on {len(bad)} of {len(results)} hosts:\n  "
                           + "\n  ".join(r.describe() for r in bad))
        return results

    def _wait_one(self, index: int) -> JobResult:
        node = self.cluster.nodes[index]
        out_dir = node.run_dir / "jobs" / self.job_id
        try:
            while True:
                left = self.deadline - time.monotonic()
                answer = node.agent.checked({"cmd": "wait", "job_id": self.job_id, "timeout": max(0.0, min(left, 5))},
                                            timeout=max(left, 0) + 10)
                if answer["state"] == "done":
                    return JobResult(index, self.job_id, "done", answer["exit_code"], answer["duration_s"], out_dir)
                if left <= 0:
                    answer = node.agent.checked({"cmd": "cancel", "job_id": self.job_id})
                    return JobResult(index, self.job_id, "timeout", answer.get("exit_code"),
                                     answer.get("duration_s"), out_dir)
        except JobError as exc:
            logger.warning("host %d lost job %s: %s", index, self.job_id, exc)
            return JobResult(index, self.job_id, "lost", None, None, out_dir)


class NamespaceCluster:
    """``workers`` namespaces on a bridge with an agent in each; a context manager that removes them."""

    engine = "local"  # (what the cluster backend interface records; the guest is one machine)
    #: UDP probes run by the (real-time) agents, not by processes the guest starts per probe: starting
    #: Python costs seconds under TCG, a fork of the preloaded agent does not
    host_probes = False

    def __init__(self, workers: int, *, prefix: str = "sqvm") -> None:
        if workers < 2:
            raise ValueError(f"workers must be >= 2 (the probes measure links between hosts), got {workers}")
        self.run_id = f"v{secrets.token_hex(3)}"
        self._dir = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        self._lan = BridgedLan(workers, prefix=prefix)
        self._job_ids = 0
        self.nodes: list[NsNode] = []
        try:
            for ep in self._lan.endpoints:
                run_dir = self._dir / f"n{ep.index}"
                run_dir.mkdir()
                log = (run_dir / "agent.log").open("wb")
                # SCHED_FIFO, inherited by every job the agent forks: inside the guest nothing else
                # (pytest, the shaper's tc calls) can then delay a probe's send or echo
                argv = ["chrt", "-f", str(AGENT_PRIORITY), sys.executable, "-m", "squall.worker.agent",
                        "--socket", str(run_dir / "agent.sock"),
                        "--preload", PRELOAD]
                self._lan.bed.spawn(self._lan.key(ep.index), argv, stdout=log, stderr=subprocess.STDOUT)
                log.close()
                self.nodes.append(NsNode(ep.index, ep.address, AgentClient(run_dir / "agent.sock"), run_dir))
            deadline = time.monotonic() + READY_TIMEOUT_S
            for node in self.nodes:
                if node.agent.wait_ready(deadline) is None:
                    tail = (node.run_dir / "agent.log").read_text(errors="replace")[-400:]
                    raise JobError(f"the agent of host {node.index} did not answer in {READY_TIMEOUT_S:g} s: {tail}")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> NamespaceCluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def endpoints(self) -> list[Endpoint]:
        """Index, address and namespace of each host, as the shaping layer wants them."""
        return list(self._lan.endpoints)

    def open_shaper(self, backend: str | None = None) -> Shaper:
        """A shaper for :meth:`endpoints`, in this process (as the local cluster's): what calibrate() asks for."""
        return open_shaper(self.endpoints(), run_id=self.run_id, backend=backend)

    def placement(self) -> dict[int, str]:
        """Every host runs in this guest."""
        return {n.index: "local" for n in self.nodes}

    def clock_offsets(self) -> dict[str, float]:
        """One machine, one clock."""
        return {"local": 0.0}

    def start_job(self, entry: str, config: dict[str, Any] | None = None, *, nodes: Sequence[int] | None = None,
                  timeout: float = 120.0, seed: int = 0,
                  per_node: Mapping[int, Mapping[str, Any]] | None = None) -> NsJobHandle:
        """Start ``entry`` on ``nodes`` (default all) and return at once."""
        chosen = list(range(len(self.nodes))) if nodes is None else list(nodes)
        self._job_ids += 1
        job_id = f"j{self._job_ids:04d}"
        peers = [n.address for n in self.nodes]
        for i in chosen:
            node = self.nodes[i]
            spec = {"job_id": job_id, "entry": entry, "rank": i, "world_size": len(self.nodes), "peers": peers,
                    "out_dir": str(node.run_dir / "jobs" / job_id),
                    "config": {**(config or {}), **dict((per_node or {}).get(i, {}))}, "seed": seed,
                    "deadline_s": timeout}
            node.agent.checked({"cmd": "run", "job": spec})
        return NsJobHandle(self, job_id, chosen, timeout)

    def run_job(self, entry: str, config: dict[str, Any] | None = None, *, nodes: Sequence[int] | None = None,
                timeout: float = 120.0, seed: int = 0, raise_on_failure: bool = True,
                per_node: Mapping[int, Mapping[str, Any]] | None = None) -> list[JobResult]:
        """Run ``entry`` on ``nodes`` (default all) and wait for every result."""
        return self.start_job(entry, config, nodes=nodes, timeout=timeout, seed=seed, per_node=per_node).wait(
            raise_on_failure=raise_on_failure)

    def close(self) -> None:
        """Stop the agents, delete the namespaces and the directory."""
        for node in self.nodes:
            with contextlib.suppress(JobError, ValueError):
                node.agent.request({"cmd": "shutdown"}, timeout=5.0)
        self._lan.close()  # kills what is left of the agents
        shutil.rmtree(self._dir, ignore_errors=True)
