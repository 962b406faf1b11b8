"""One cell of a matrix: a protocol trained on a shaped cluster, turned into a :class:`RunTrace`.

A :class:`Lab` owns one cluster and one shaper and runs cells one after another on them: between
cells it only reshapes links (and brings back nodes that churn took down), so a matrix pays for
containers once. ``with Lab(workers=4) as lab: trace = lab.run(RunSpec("ring", "wan-5ms"))``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from squall.checks.agreement import PROTOCOL_FIGURES, Agree, check_names
from squall.cluster import ClusterError, ClusterSpec, Mount
from squall.cluster.backend import ClusterBackend, open_cluster
from squall.cluster.cluster import SRC_MOUNT, JobHandle
from squall.cluster.code_stage import is_site_dir
from squall.cluster.code_stage import stage as stage_code
from squall.cluster.image import REPO_ROOT as SQUALL_ROOT
from squall.cluster.jobs import JobResult
from squall.cluster.spec import default_engine
from squall.experiment.driver import Cell, CounterSampler, Ended, ExperimentError, act, drive, recover
from squall.experiment.hangs import BUDGET_LATE_S, Running
from squall.experiment.timeline import Action
from squall.profiles import load_profile
from squall.progress import Observer, Quiet
from squall.protocols.catalog import lookup, third_party_code
from squall.run_meta import RunMeta
from squall.run_trace import RunTrace
from squall.shaping import Shaper, TimedState
from squall.target import Target

__all__ = ["GRACE_S", "ExperimentError", "Lab", "ProtocolWorkload", "RunSpec", "code_dir_of", "device_config"]

logger = logging.getLogger(__name__)

BASE_PORT = 29500
EXT_MOUNT = "/squall/ext"  # where third-party protocol code is mounted
PROGRAM_MOUNT = "/squall/program"  # where a user's program folder is mounted (read-only)
#: Seconds a job may run past its budget (start-up, final evaluation, goodbyes) before it is cancelled.
GRACE_S = 60.0


@dataclass(frozen=True)
class RunSpec:
    """One cell: which protocol, on which profile, trained how."""

    protocol: str  # catalog name (squall/protocols/catalog.py) or "package.module:function"
    profile: str  # profile name or path
    seed: int = 0  # run seed (data order, init, churn draws)
    task: str = "logreg_digits"  # training task
    steps: int | None = None  # step budget (None: only the time budget)
    seconds: float | None = 30.0  # time budget of the training
    target: Target | None = None  # stop early once reached (also given as "accuracy>=0.9" or {"accuracy": 0.9})
    lr: float = 0.5  # learning rate
    batch_size: int = 32  # per-worker batch
    config: Mapping[str, Any] = field(default_factory=dict)  # further job config (e.g. ballast_mb, eval_every)
    replay: Mapping[str, Any] | None = None  # a recorded timeline (meta["timeline"]) to run instead of the profile's
    hang_after: float | None = None  # stop as hung after this long without progress (None: hangs.default_after)
    agree: tuple[Agree, ...] = ()  # record fields every surviving node must end with (also given as "NAME~TOL")

    def __post_init__(self) -> None:
        if self.steps is None and self.seconds is None:
            raise ValueError("a run needs a budget: steps, seconds or both")
        if self.steps is not None and self.steps <= 0:
            raise ValueError(f"steps must be > 0, got {self.steps}")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds}")
        lookup(self.protocol)  # unknown protocol: KeyError naming the known ones
        object.__setattr__(self, "target", Target.of(self.target))  # a malformed one: TargetError
        if self.hang_after is not None and (isinstance(self.hang_after, bool) or self.hang_after <= 0):
            raise ValueError(f"hang_after must be a number of seconds > 0, got {self.hang_after!r}")
        agree = tuple(a if isinstance(a, Agree) else Agree.parse(a) for a in self.agree)
        check_names(agree, PROTOCOL_FIGURES, flag="agree", what="a protocol's records")  # AgreeError (ValueError)
        object.__setattr__(self, "agree", agree)


def device_config(profile_device: Mapping[str, Any], spec: RunSpec) -> dict[str, Any]:
    """A node's emulated device: the profile's settings, the run's ``device`` keys over them, the run's seed.

    The run's keys win (a matrix can hold every cell to one ``step_time_s`` whatever its profile says);
    the profile's other keys (per-node slow-downs, stragglers) stay.
    """
    run = spec.config.get("device") or {}
    if not isinstance(run, Mapping):
        raise ExperimentError(f"{spec.protocol}: config.device must be a mapping of device settings, got {run!r}")
    return {**profile_device, "seed": spec.seed, **{k: v for k, v in run.items() if k != "node"}}


class Lab:
    """A cluster and a shaper, reused across cells."""

    def __init__(self, *, workers: int, backend: str | None = None, cpus: float = 1.0, memory: str = "1g",
                 cluster: ClusterBackend | None = None, code: tuple[str, ...] = (), progress: Observer | None = None,
                 engine: str | None = None, image: str | None = None, workdir: str | None = None,
                 workdirs: tuple[str, ...] = (), preload: tuple[str, ...] | None = None) -> None:
        """:param code: host directories holding third-party protocol packages, mounted read-only
            into every container and put on its PYTHONPATH.
        :param progress: told each stage (starting cluster, shaping, training, collecting,
            teardown) and given the workers' metrics files while they train (:mod:`squall.progress`).
        :param engine: "local" (this machine's Docker) or "swarm" (:mod:`squall.cluster.backend`); None:
            the process's default (``--engine``, ``$SQUALL_ENGINE``, else local).
        :param image: the worker image (None: the one built for the current inputs), e.g. one with a
            program's requirements.
        :param workdir: a user's program folder, mounted read-only at :data:`PROGRAM_MOUNT`.
        :param workdirs: or several (a comparison's two sides): the first at :data:`PROGRAM_MOUNT`, the next
            at ``PROGRAM_MOUNT-1``, ... (:meth:`mount_of` says where each went).
        :param preload: modules the agents import before they answer (None: torch, for the protocols' jobs)."""
        self.workers = workers
        self.progress: Observer = progress if progress is not None else Quiet()
        self.backend_wanted = backend
        mounts = tuple(Mount(path, f"{EXT_MOUNT}/{k}") for k, path in enumerate(code))
        pythonpath = ":".join([SRC_MOUNT, *(m.target for m in mounts)])
        folders = ((workdir,) if workdir is not None else ()) + tuple(w for w in workdirs if w != workdir)
        self.program_mounts = {folder: PROGRAM_MOUNT if k == 0 else f"{PROGRAM_MOUNT}-{k}"
                               for k, folder in enumerate(folders)}  # host folder -> where the containers see it
        mounts += tuple(Mount(folder, target) for folder, target in self.program_mounts.items())
        self.spec = ClusterSpec(workers=workers, cpus=cpus, memory=memory, mounts=mounts,
                                env=(("PYTHONPATH", pythonpath),), engine=engine or default_engine(), image=image)
        if preload is not None:
            self.spec = dataclasses.replace(self.spec, preload=preload)
        self.cluster = cluster
        self._own_cluster = cluster is None
        self.shaper: Shaper | None = None
        self._ports = itertools.count()

    def __enter__(self) -> Lab:
        if self.cluster is None:
            self.progress.stage("starting cluster", f"{self.workers} workers")
            self.cluster = open_cluster(self.spec).start()
        try:
            self.progress.stage("shaping", "choosing the backend")
            self.shaper = self.cluster.open_shaper(self.backend_wanted)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def backend(self) -> str:
        """The shaping backend in use."""
        return self.shaper.backend if self.shaper else "none"

    def close(self) -> None:
        """Stop shaping and (if this lab made it) remove the cluster."""
        if self.shaper is not None or (self._own_cluster and self.cluster is not None):
            self.progress.stage("teardown")
        try:
            if self.shaper is not None:
                self.shaper.close()
                self.shaper = None
        finally:
            if self._own_cluster and self.cluster is not None:
                self.cluster.close()
                self.cluster = None

    # -- one cell ---------------------------------------------------------------------------------
    def cell(self, profile_name: str, *, seconds: float, seed: int, budget_steps: int | None = None,
             replay: Mapping[str, Any] | None = None) -> Cell:
        """What the driver needs to run one workload on this lab, shaped as ``profile_name``."""
        cluster, shaper = self._require()
        profile = load_profile(profile_name)
        profile.runnable_for(self.workers, engine=cluster.engine)
        return Cell(cluster, shaper, self.progress, profile, seconds, seed, budget_steps, replay)

    def run(self, spec: RunSpec) -> RunTrace:
        """Shape the links for ``spec.profile``, train, apply the profile's timeline, return the trace."""
        proto = lookup(spec.protocol)
        cell = self.cell(spec.profile, seconds=spec.seconds if spec.seconds is not None else 600.0, seed=spec.seed,
                         budget_steps=spec.steps, replay=spec.replay)
        per_node = {i: {"device": device_config(cell.profile.device(i, self.workers).to_dict(), spec)}
                    for i in range(self.workers)}
        workload = ProtocolWorkload(spec, proto.entry, self._config(spec, proto.config), per_node,
                                    rejoins=proto.rejoins, duration=cell.seconds)
        cell = dataclasses.replace(cell, hang_after_s=spec.hang_after, agree=spec.agree)
        return drive(cell, workload).trace

    def mount_of(self, folder: str) -> str:
        """Where the containers see a program folder this lab mounts; :class:`ExperimentError` if it does not."""
        try:
            return self.program_mounts[folder]
        except KeyError:
            raise ExperimentError(f"the lab does not mount the program folder {folder} (it mounts "
                                  f"{sorted(self.program_mounts) or 'none'}): Lab(workdir=...)") from None

    def next_port(self) -> int:
        """A rendezvous port no earlier cell of this lab used (a port in TIME_WAIT cannot be bound again)."""
        return BASE_PORT + next(self._ports) % 400

    def act(self, action: Action, states: Sequence[TimedState], restarted: Callable[[int], None] | None = None) -> None:
        """Do one timeline action: a reshape to ``states[action.change]``, or node churn (``restarted`` is told
        of each node churn restarted, to start its job again)."""
        cluster, shaper = self._require()
        act(action, states, cluster, shaper, restarted)

    def recover(self) -> None:
        """Bring every node back for the next cell."""
        cluster, shaper = self._require()
        recover(cluster, shaper)

    def _config(self, spec: RunSpec, base: Mapping[str, Any]) -> dict[str, Any]:
        config: dict[str, Any] = {**base, "task": spec.task, "lr": spec.lr, "batch_size": spec.batch_size,
                                  "seed": spec.seed, "port": self.next_port()}
        if spec.steps is not None:
            config["steps"] = spec.steps
        if spec.seconds is not None:
            config["seconds"] = spec.seconds
        if spec.target is not None:
            config["target"] = spec.target.to_mapping()
        config.update(spec.config)
        return config

    def _require(self) -> tuple[ClusterBackend, Shaper]:
        if self.cluster is None or self.shaper is None:
            raise ExperimentError("the lab is not started: use 'with Lab(...) as lab'")
        return self.cluster, self.shaper


class ProtocolWorkload:
    """A protocol's job on every node, for :func:`~squall.experiment.driver.drive`.

    A node that churn restarted gets the job again when the protocol can join a run under way
    (``Declaration.rejoins``), with the run's config (the same ``seconds``): the others' budgets count
    from their start barrier, which the lab does not see, so a protocol that rejoins counts the budget
    on the run's clock itself (Moshpit takes its peers' heartbeat ages). The job's deadline is the
    run's (its budget plus :data:`GRACE_S`), since a job caps its budget by its deadline on its own clock.
    """

    def __init__(self, spec: RunSpec, entry: str, config: Mapping[str, Any], per_node: Mapping[int, Mapping[str, Any]],
                 *, rejoins: bool, duration: float) -> None:
        self.label = spec.protocol
        self.spec = spec
        self.entry = entry
        self.config = dict(config)
        self.per_node = per_node
        self.rejoins = rejoins
        self.duration = duration
        self.start_time = 0.0  # time.monotonic() of the run's start
        self._cluster: ClusterBackend | None = None
        self._first: JobHandle | None = None
        self._results: list[JobResult] = []
        self._later: list[JobHandle] = []
        self._lock = threading.Lock()
        self.stopped = False  # stopped as hung (hangs.HangWatch): an end without survivors is still a result

    depth = 1  # a rank is the job process the agent forked

    @property
    def budget_dump_at_s(self) -> float:
        """A protocol ends at its budget by itself: the nodes still running shortly after it are dumped."""
        return self.duration + BUDGET_LATE_S

    def _handles(self) -> list[JobHandle]:
        with self._lock:
            return [h for h in [self._first, *self._later] if h is not None]

    def lines(self) -> list[tuple[int, Path]]:
        """Each node's metrics file of its latest job (a record per step)."""
        if self._cluster is None:
            return []
        latest = {node: h.job_id for h in self._handles() for node in h.nodes}
        return [(node, self._cluster.nodes[node].run_dir / "jobs" / job / "metrics.jsonl")
                for node, job in sorted(latest.items())]

    def running(self) -> list[Running]:
        """Every node (a node whose job ended has no process to dump: it says so)."""
        return [Running(node, 0, None) for node in range(len(self._cluster.nodes))] if self._cluster else []

    def stop(self) -> None:
        """Cancel the job on every node."""
        self.stopped = True
        for handle in self._handles():
            handle.cancel()

    def begin(self, cluster: ClusterBackend, start: float) -> list[Path]:
        self._cluster, self.start_time = cluster, start
        handle = cluster.start_job(self.entry, self.config, per_node=self.per_node, seed=self.spec.seed,
                                   timeout=self.duration + GRACE_S)
        self._first = handle
        return [cluster.nodes[i].run_dir / "jobs" / handle.job_id / "metrics.jsonl" for i in handle.nodes]

    def before(self, action: Action) -> None:
        """Nothing to do: a killed node's job ends with its container."""

    def restarted(self, node: int) -> None:
        """Start the job on ``node`` again, with the run's config and what is left of its deadline."""
        if not self.rejoins or self._cluster is None:
            return
        left = max(0.0, self.duration - (time.monotonic() - self.start_time))
        handle = self._cluster.start_job(self.entry, self.config, nodes=[node],
                                         per_node={node: self.per_node.get(node, {})}, seed=self.spec.seed,
                                         timeout=self.duration + GRACE_S)
        logger.info("node %d restarted: its job %s rejoins the run (%.1f s of the timeline left)",
                    node, handle.job_id, left)
        with self._lock:
            self._later.append(handle)

    def wait(self) -> None:
        if self._first is not None:
            self._results = self._first.wait(raise_on_failure=False)

    def end(self, counters: CounterSampler) -> Ended:
        """Every node's runs; :class:`ExperimentError` when the job failed on every node."""
        with self._lock:
            handles = list(self._later)
        later = [r for h in handles for r in h.wait(raise_on_failure=False)]
        lives = incarnations(self._results, later)
        results = [runs[-1] for runs in lives]  # each node's last run says whether it survived
        survivors = [r.node for r in results if r.ok]
        spec = self.spec
        if not survivors and not self.stopped:
            down = _all_down(self._cluster) if self._cluster is not None else ""
            raise ExperimentError(f"{spec.protocol} on {spec.profile} failed on every node{down}:\n  "
                                  + "\n  ".join(r.describe() for r in results))
        meta = RunMeta(task=spec.task, lr=spec.lr, batch_size=spec.batch_size, budget_s=spec.seconds,
                       budget_steps=spec.steps, summaries=tuple(r.value for r in results))
        return Ended(per_worker=[[rec for r in runs for rec in r.metrics()] for runs in lives], survivors=survivors,
                     failures=[r.describe() for runs in lives for r in runs if not r.ok],
                     rejoined=sorted({r.node for r in later}), meta=meta)


def _all_down(cluster: ClusterBackend) -> str:
    """Why every node may have failed at once, as a parenthesis: no engine, or no container running."""
    try:
        down = [node.index for node in cluster.nodes if not cluster.state(node.index).running]
    except ClusterError as exc:
        return f" (the Docker engine does not answer: {exc})"
    if down:
        return f" (the containers of nodes {down} are not running: stopped with the Docker engine, or killed)"
    return ""


def incarnations(first: Sequence[JobResult], later: Sequence[JobResult]) -> list[list[JobResult]]:
    """Each node's runs of a job in order: its first run, then those it was given after restarts."""
    lives = [[r] for r in sorted(first, key=lambda r: r.node)]
    by_node = {runs[0].node: runs for runs in lives}
    for r in later:
        by_node[r.node].append(r)
    return lives


def code_dir_of(protocol: str) -> str | None:
    """The host directory to mount for a third party's protocol (None for Squall's own).

    A ``package.module:function`` name: the directory that holds the top-level package, found with
    the host's import system, so the package is importable inside the containers exactly as on the
    host; where that directory is a site-packages folder, a staged copy of the package instead
    (:mod:`squall.cluster.code_stage`). A short name an installed distribution declared under the
    ``squall.protocols`` entry point: a staged copy of its packages and its metadata folder
    (:func:`squall.protocols.catalog.third_party_code`), so the containers' catalog knows it too.
    """
    if ":" not in protocol:
        try:
            code = third_party_code(protocol)
        except ValueError as exc:  # DeclarationError: its package is not importable here
            raise ExperimentError(str(exc)) from exc
        if code is None:
            return None  # one of Squall's protocols: already mounted
        return str(stage_code([*code.modules, *([code.metadata] if code.metadata is not None else [])]))
    top = protocol.split(":", 1)[0].split(".", 1)[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ExperimentError(f"protocol {protocol!r}: package {top!r} is not importable on this host")
    if spec.submodule_search_locations:  # a package: mount the directory that contains it
        source = Path(next(iter(spec.submodule_search_locations)))
    elif spec.origin:  # a single module file
        source = Path(spec.origin)
    else:
        raise ExperimentError(f"protocol {protocol!r}: cannot tell where {top!r} lives")
    root = source.parent
    if root == Path(SQUALL_ROOT):
        return None  # part of Squall: already mounted
    if is_site_dir(root):  # installed: its copy, not every package of the environment
        return str(stage_code([source]))
    return str(root)
