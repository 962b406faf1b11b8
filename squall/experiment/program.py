"""One cell with a user's program instead of a protocol: ranks started, watched, stopped, counted.

:func:`run_program` runs a :class:`~squall.programs.spec.ProgramSpec` on a started
:class:`~squall.experiment.lab.Lab` whose containers mount the program's folder (``Lab(workdir=...)``):

* starts the ``command`` job (:mod:`squall.worker.command`) on every node, one job per node running
  ``nproc_per_node`` ranks (:mod:`squall.worker.local_ranks`; one unless the spec says more), each with
  torchrun's environment; a node's K ranks become K runs, global ranks ``node * K + local``
  (:mod:`squall.programs.node_runs`);
* waits for the ranks; the first rank that *fails* (a non-zero exit) has the others stopped at
  once (:class:`_Supervisor`; they are cancelled through their agents, well under 2 s);
* the driver (:mod:`squall.experiment.driver`) shapes the links and applies the profile's timeline,
  as for a protocol; a node that churn killed is restarted by the timeline and its
  command started again with the same rank and environment, ``TORCHELASTIC_RESTART_COUNT`` one
  higher and what is left of the budget (as torchelastic would restart it);
* each figure record gets the bytes its rank's node had sent to other nodes when the line was read (the
  driver's readings of the kernel's per-link counters; the ranks of one node share their node's count,
  since their traffic to one another stays inside the container), so bytes to target work as for a
  protocol; each node's loopback bytes (its ranks' traffic to one another) are read at the start, before
  churn kills it and at the end (:mod:`squall.cluster.netdev`);
* copies each rank's ``stdout.txt``, ``stderr.txt``, ``program.json`` and ``out/`` into ``logs``
  (``rank<r>`` or ``rank<r>-restart<k>``) before the containers go away.

The result is a :class:`~squall.run_trace.RunTrace` (its ``meta["program"]`` holds what only a program
has, :mod:`squall.programs.result`) and every rank's runs, for :func:`squall.programs.verdict.judge`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squall.cluster.backend import ClusterBackend
from squall.cluster.cluster import JobHandle
from squall.cluster.jobs import JobResult
from squall.cluster.netdev import LoopbackMeter, loopback_reader
from squall.cluster.spec import SWARM, default_engine
from squall.experiment.driver import CounterSampler, Ended, ExperimentError, drive
from squall.experiment.hangs import BUDGET_DUMP_BEFORE_S, Running
from squall.experiment.job_mirror import JobMirror, sync_of
from squall.experiment.lab import Lab
from squall.experiment.timeline import Action
from squall.programs.node_runs import split_node_run
from squall.programs.spec import ProgramSpec
from squall.programs.verdict import RankRun
from squall.run_meta import ProgramMeta, RunMeta
from squall.run_trace import RunTrace, load_jsonl
from squall.shaping.base import LinkCounters

logger = logging.getLogger(__name__)

COMMAND_JOB = "command"  # squall.worker.registry's name of the command runner
GRACE_S = 30.0  # the host's deadline past the budget (the runner itself stops the program at its budget)
MIN_LEFT_S = 1.0  # the least budget a restarted rank is given
LOG_FILES = ("stdout.txt", "stderr.txt", "program.json", "metrics.jsonl")
LOCAL_DIR = "local{}"  # a local rank's folder in a node's job folder (squall.worker.local_ranks.LOCAL_DIR)


@dataclass(frozen=True)
class ProgramRun:
    """What one run of a program left: its trace and every rank's runs."""

    trace: RunTrace  # figures, kernel bytes per record, meta["program"]
    runs: tuple[RankRun, ...]  # every rank's runs, restarts included
    counters: LinkCounters  # every directed link over the whole run


# -- ranks -------------------------------------------------------------------------------------------
class _Supervisor:
    """Starts the ranks, restarts them after churn, stops them all when one fails, collects their runs."""

    def __init__(self, cluster: ClusterBackend, config: Mapping[str, Any], *, seed: int, seconds: float,
                 logs: Path) -> None:
        self.cluster = cluster
        self.config = dict(config)
        self.seed = seed
        self.seconds = seconds
        self.logs = logs
        self.nproc = int(config.get("nproc_per_node", 1))  # ranks per node
        self.start_time = time.monotonic()
        self.runs: list[RankRun] = []
        self.records: dict[int, list[list[dict[str, Any]]]] = {}  # node -> each run's records (local_rank: K > 1)
        self.current: dict[int, tuple[int, JobHandle]] = {}  # rank -> (restart number, handle) running now
        self.killed: set[tuple[int, int]] = set()  # (rank, restart) runs churn killed: their loss is no failure
        self.stopping = False  # a rank failed: the others are being stopped, no restart any more
        self.hung = False  # the run was stopped as hung: the stopped runs end as "hung"
        self.failed_at: float | None = None
        self._done: queue.Queue[tuple[int, int, JobResult | BaseException]] = queue.Queue()
        self._lock = threading.Lock()

    # called by the run and by the timeline thread
    def start(self, node: int) -> None:
        """Start (or restart) rank ``node``'s command with what is left of the budget."""
        with self._lock:
            if self.stopping:
                logger.info("rank %d: not restarted, the run is stopping", node)
                return
            restart = 0 if node not in self.records else len(self.records[node])
            left = max(MIN_LEFT_S, self.seconds - (time.monotonic() - self.start_time))
            config = {**self.config, "restart": restart, "seconds": round(left, 3)}
            handle = self.cluster.start_job(COMMAND_JOB, config, nodes=[node], timeout=left + GRACE_S,
                                            seed=self.seed)
            self.records.setdefault(node, []).append([])
            self.current[node] = (restart, handle)
        threading.Thread(target=self._wait, args=(node, restart, handle), name=f"squall-rank{node}",
                         daemon=True).start()
        if restart:
            logger.info("rank %d restarted (restart %d, %.1f s of budget left)", node, restart, left)

    def kill(self, node: int) -> None:
        """Churn is about to kill ``node``'s container (and the rank's run there)."""
        with self._lock:
            if node in self.current:
                self.killed.add((node, self.current[node][0]))

    def _wait(self, rank: int, restart: int, handle: JobHandle) -> None:
        try:
            result: JobResult | BaseException = handle.wait(raise_on_failure=False)[0]
        except BaseException as exc:  # reported to the main thread, which decides
            result = exc
        self._done.put((rank, restart, result))

    def stop_all(self, but: int | None = None) -> None:
        """Cancel every running rank except ``but`` (in parallel: each agent SIGKILLs its job)."""
        with self._lock:
            self.stopping = True
            handles = [h for r, (_, h) in self.current.items() if r != but]
        threads = [threading.Thread(target=h.cancel, daemon=True) for h in handles]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=5)

    def wait(self) -> None:
        """Until every rank that is up has ended (a rank down for churn is not waited for)."""
        try:
            while True:
                with self._lock:
                    if not self.current:
                        self.stopping = True  # a pending restart would start a rank alone
                        return
                try:
                    rank, restart, result = self._done.get(timeout=0.5)
                except queue.Empty:
                    continue
                runs = self._classify(rank, restart, result)
                with self._lock:
                    self.runs.extend(runs)
                    if self.current.get(rank, (None,))[0] == restart:
                        del self.current[rank]
                for run in runs:
                    logger.info("%s", run.describe())
                if any(run.failed for run in runs) and not self.stopping:
                    self.failed_at = time.monotonic()
                    t0 = time.monotonic()
                    self.stop_all(but=rank)
                    logger.info("the other ranks were stopped in %.2f s", time.monotonic() - t0)
        except BaseException:
            self.stop_all()  # interrupted (Ctrl-C): no rank keeps running
            raise

    def _classify(self, node: int, restart: int, result: JobResult | BaseException) -> tuple[RankRun, ...]:
        """The runs of ``node``'s ranks that just ended: one, or each local rank's (their records tagged)."""
        run = self._classify_node(node, restart, result)
        if self.nproc == 1:
            return (run,)
        out_dir = None if isinstance(result, BaseException) else result.out_dir
        rows: list[dict[str, Any]] = []
        lives: list[dict[str, Any]] = []
        for local in range(self.nproc):
            folder = out_dir / LOCAL_DIR.format(local) if out_dir is not None else None
            if folder is None or not folder.is_dir():
                continue
            rows.append(_program_json(folder))
            if (folder / "metrics.jsonl").exists():
                lives += [{**rec, "local_rank": local} for rec in load_jsonl(folder / "metrics.jsonl")]
        if out_dir is not None:
            self.records[node][restart] = sorted(lives, key=lambda rec: float(rec.get("wall", 0.0)))
        logs = [str(self.folder(node * self.nproc + local, restart)) for local in range(self.nproc)]
        return split_node_run(run, self.nproc, rows, logs)

    def _classify_node(self, rank: int, restart: int, result: JobResult | BaseException) -> RankRun:
        ended = round(time.monotonic() - self.start_time, 3)
        if isinstance(result, BaseException):
            return RankRun(rank, restart, "lost", None, None, (f"{type(result).__name__}: {result}",), "", ended)
        logs = self._keep(rank, restart, result.out_dir)
        self.records[rank][restart] = load_jsonl(result.out_dir / "metrics.jsonl") \
            if (result.out_dir / "metrics.jsonl").exists() else []
        info = _program_json(result.out_dir)
        tail = tuple(info.get("stderr_tail") or ())
        duration = info.get("duration_s", result.duration_s)
        if result.state == "done" and info.get("state") in ("exited", "budget", "error"):
            return RankRun(rank, restart, str(info["state"]), info.get("exit_code"), duration, tail, logs, ended)
        if self.stopping:  # cancelled by the run: another rank failed, the run hung, or it was interrupted
            return RankRun(rank, restart, "hung" if self.hung else "stopped", result.exit_code, duration, tail, logs,
                           ended)
        if (rank, restart) in self.killed:
            return RankRun(rank, restart, "killed", None, duration, tail, logs, ended)
        if result.state == "done":  # the runner died before it wrote its summary
            return RankRun(rank, restart, "error", result.exit_code, result.duration_s,
                           tail or (result.describe(),), logs, ended)
        if result.state == "timeout":
            return RankRun(rank, restart, "budget", info.get("exit_code"), duration, tail, logs, ended)
        return RankRun(rank, restart, "lost", None, duration, tail or (result.describe(),), logs, ended)

    def folder(self, rank: int, restart: int) -> Path:
        """The results folder of one run of a rank (``rank2``, ``rank2-restart1``)."""
        return self.logs / (f"rank{rank}" if restart == 0 else f"rank{rank}-restart{restart}")

    def _keep(self, rank: int, restart: int, out_dir: Path) -> str:
        """Copy the run's files out of the cluster's directory (removed at teardown); the copy's folder (with
        several ranks per node, ``rank`` is the node and each local rank's files go to its global rank's)."""
        if self.nproc > 1:
            for local in range(self.nproc):
                self._copy(out_dir / LOCAL_DIR.format(local), self.folder(rank * self.nproc + local, restart))
            return ""
        return self._copy(out_dir, self.folder(rank, restart))

    @staticmethod
    def _copy(out_dir: Path, dest: Path) -> str:
        dest.mkdir(parents=True, exist_ok=True)
        for name in LOG_FILES:
            with contextlib.suppress(OSError):
                shutil.copy(out_dir / name, dest / name)
        if (out_dir / "out").is_dir():
            with contextlib.suppress(OSError, shutil.Error):
                shutil.copytree(out_dir / "out", dest / "out", dirs_exist_ok=True, symlinks=True)
        return str(dest)


def _program_json(out_dir: Path) -> dict[str, Any]:
    import json

    try:
        obj = json.loads((out_dir / "program.json").read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


# -- the run -----------------------------------------------------------------------------------------
def program_image(program: ProgramSpec) -> str | None:
    """The image with ``program``'s requirements (built when missing), or None for the worker image; on the
    swarm engine its build context is kept too, for the nodes that lack the image.

    :raises RequirementsError: a requirement cannot be installed (before any container starts).
    """
    if not program.requirements:
        return None
    from squall.cluster.engine import docker_client
    from squall.cluster.program_image import ensure_program_context, ensure_program_image

    client = docker_client()
    tag = ensure_program_image(client, program.requirements, source=program.requirements_source)
    if default_engine() == SWARM:  # a node without the image builds it from the same context
        ensure_program_context(client, program.requirements, source=program.requirements_source)
    return tag


class ProgramWorkload:
    """A user's program, ``nproc_per_node`` ranks per node, for :func:`~squall.experiment.driver.drive` (see the
    module)."""

    depth = 2  # the program is the child of the command job (its runner)

    def __init__(self, program: ProgramSpec, config: Mapping[str, Any], *, seed: int, seconds: float,
                 logs: Path) -> None:
        self.label = program.name
        # the runner stops a rank at its budget: the host takes the stacks of those still running just before
        self.budget_dump_at_s: float | None = seconds - BUDGET_DUMP_BEFORE_S if seconds > 2 * BUDGET_DUMP_BEFORE_S \
            else None
        self.program = program
        self.config = dict(config)
        self.seed = seed
        self.seconds = seconds
        self.logs = logs
        self.supervisor: _Supervisor | None = None
        self.runs: tuple[RankRun, ...] = ()  # every rank's runs, once ended
        self.nproc = int(self.config.get("nproc_per_node", 1))  # ranks per node
        self.loopback: LoopbackMeter | None = None  # each node's traffic inside it (None: the engine cannot say)
        self.mirror: JobMirror | None = None  # ranks' lines copied from other machines (swarm)

    def begin(self, cluster: ClusterBackend, start: float) -> list[Path]:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.supervisor = _Supervisor(cluster, self.config, seed=self.seed, seconds=self.seconds, logs=self.logs)
        self.supervisor.start_time = start
        read = loopback_reader(cluster)
        if read is not None:
            self.loopback = LoopbackMeter(read, len(cluster.nodes))
            self.loopback.start()
        for rank in range(len(cluster.nodes)):
            self.supervisor.start(rank)
        sync = sync_of(cluster)
        if sync is not None:
            self.mirror = JobMirror(sync, self._current_jobs).start()
        return [path for _, path in self._files(("metrics.jsonl",))]

    def _current_jobs(self) -> list[tuple[int, str]]:
        """(node, job id) of each rank's job running now."""
        supervisor = self.supervisor
        if supervisor is None:
            return []
        with supervisor._lock:
            return sorted((node, handle.job_id) for node, (_, handle) in supervisor.current.items())

    def _files(self, names: tuple[str, ...]) -> list[tuple[int, Path]]:
        """(rank, file) of each running rank's files ``names`` in its node's job folder (a local rank's own
        folder there when the node runs several)."""
        supervisor = self.supervisor
        if supervisor is None:
            return []
        with supervisor._lock:
            current = sorted((node, handle.job_id) for node, (_, handle) in supervisor.current.items())
        nodes, k = supervisor.cluster.nodes, self.nproc
        if k == 1:
            return [(node, nodes[node].run_dir / "jobs" / job / name) for node, job in current for name in names]
        return [(node * k + local, nodes[node].run_dir / "jobs" / job / LOCAL_DIR.format(local) / name)
                for node, job in current for local in range(k) for name in names]

    def before(self, action: Action) -> None:
        if action.kind == "kill" and self.supervisor is not None:
            for node in action.nodes:
                self.supervisor.kill(node)
                if self.loopback is not None:
                    self.loopback.before_kill(node)

    def restarted(self, node: int) -> None:
        if self.loopback is not None:
            self.loopback.restarted(node)
        if self.supervisor is not None:
            self.supervisor.start(node)

    def wait(self) -> None:
        try:
            if self.supervisor is not None:
                self.supervisor.wait()
        finally:
            if self.mirror is not None:
                self.mirror.stop()

    def lines(self) -> list[tuple[int, Path]]:
        """Each running rank's stdout and stderr files (in the node's job folder)."""
        return self._files(("stdout.txt", "stderr.txt"))

    def running(self) -> list[Running]:
        supervisor = self.supervisor
        if supervisor is None:
            return []
        with supervisor._lock:
            current = [(rank, restart) for rank, (restart, _) in supervisor.current.items()]
        k = self.nproc
        if k == 1:
            return [Running(rank, restart, supervisor.folder(rank, restart)) for rank, restart in sorted(current)]
        return [Running(node * k + local, restart, supervisor.folder(node * k + local, restart), node=node, local=local)
                for node, restart in sorted(current) for local in range(k)]

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.hung = True
            self.supervisor.stop_all()

    def end(self, counters: CounterSampler) -> Ended:
        """Each rank's figures with the kernel's bytes its node had sent when the line was read."""
        supervisor = self.supervisor
        assert supervisor is not None, "end() before begin()"
        n, k = len(supervisor.cluster.nodes), self.nproc
        runs = tuple(sorted(supervisor.runs, key=lambda r: (r.rank, r.restart)))
        per_rank: list[list[dict[str, Any]]] = [[] for _ in range(n * k)]
        for node in range(n):
            sent_at = counters.sent_at(node)
            for life in supervisor.records.get(node, []):
                for rec in life:
                    local = int(rec.get("local_rank", 0)) if k > 1 else 0
                    row = {key: v for key, v in rec.items() if key != "local_rank"}
                    per_rank[node * k + local].append({**row, "bytes_sent": sent_at(float(rec.get("wall", 0.0)))})
        last = {r.rank: r for r in runs}
        survivors = [r for r in range(n * k) if r in last and last[r].state not in ("killed", "lost")]
        start_wall = counters.samples[0][0]
        samples = tuple((round(w - start_wall, 3), tuple(c.sent(r) for r in range(n))) for w, c in counters.samples)
        program = ProgramMeta(spec=self.program.to_json(), runs=runs, samples=samples,
                              duration_s=round(time.monotonic() - supervisor.start_time, 3), budget_s=self.seconds,
                              stopped_after_failure_s=None if supervisor.failed_at is None
                              else round(supervisor.failed_at - supervisor.start_time, 3),
                              counter_errors=tuple(counters.errors[:5]))
        loopback = self.loopback.finish() if self.loopback is not None else ()
        meta = RunMeta(program=program, bytes_source="kernel (the shaping backend's per-link counters)",
                       nproc_per_node=k, loopback=loopback)
        self.runs = runs
        finished = tuple(r for r in range(n * k) if r in last and last[r].state == "exited" and last[r].exit_code == 0)
        at_budget = tuple(r for r in range(n * k) if r in last and last[r].state == "budget")
        return Ended(per_worker=per_rank, survivors=survivors, failures=[r.describe() for r in runs if r.failed],
                     rejoined=sorted({r.rank // k for r in runs if r.restart}), meta=meta, finished=finished,
                     at_budget=at_budget)


def run_program(lab: Lab, program: ProgramSpec, profile_name: str, *, seconds: float, seed: int = 0,
                logs: Path, replay: Mapping[str, Any] | None = None, folder: str | None = None,
                hang_after: float | None = None) -> ProgramRun:
    """Run ``program`` on ``lab``'s cluster shaped as ``profile_name`` for at most ``seconds`` (see the module).

    :param folder: the host folder the lab mounts for it (its snapshot); default ``program.workdir``.
    :param hang_after: stop it as hung after this many seconds without progress (None: the default).
    """
    _ready(lab)
    mount = lab.mount_of(folder or program.workdir)
    cell = dataclasses.replace(lab.cell(profile_name, seconds=seconds, seed=seed, replay=replay),
                               hang_after_s=hang_after, agree=program.agree)
    config = {"argv": list(program.argv), "workdir": mount, "master_port": lab.next_port(),
              "nproc_per_node": program.nproc_per_node,
              "metrics": {p.name: p.regex for p in program.metrics},
              "texts": [a.name for a in program.agree if a.name in program.metric_names],
              "env": {**dict(program.env), "SQUALL_SEED": str(seed)}}
    workload = ProgramWorkload(program, config, seed=seed, seconds=seconds, logs=logs)
    driven = drive(cell, workload)
    return ProgramRun(driven.trace, workload.runs, driven.counters)


def _ready(lab: Lab) -> None:
    """Whether the lab can run a program; :class:`ExperimentError` naming what is missing."""
    cluster = lab.cluster
    if cluster is None or lab.shaper is None:
        raise ExperimentError("the lab is not started: use 'with Lab(...) as lab'")
