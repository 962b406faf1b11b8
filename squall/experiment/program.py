"""One cell with a user's program instead of a protocol: ranks started, watched, stopped, counted.

:func:`run_program` runs a :class:`~squall.programs.spec.ProgramSpec` on a started
:class:`~squall.experiment.lab.Lab` whose containers mount the program's folder (``Lab(workdir=...)``):

* shapes the links for the profile, then starts the ``command`` job (:mod:`squall.worker.command`)
  on every node, one job per rank, each with torchrun's environment;
* waits for the ranks; the first rank that *fails* (a non-zero exit) has the others stopped at
  once (:class:`_Supervisor`; they are cancelled through their agents, well under 2 s);
* applies the profile's timeline; a node that churn killed is restarted by the timeline and its
  command started again with the same rank and environment, ``TORCHELASTIC_RESTART_COUNT`` one
  higher and what is left of the budget (as torchelastic would restart it);
* reads the shaper's kernel counters every :data:`SAMPLE_S` seconds (:class:`_Sampler`): each figure
  record gets the bytes its rank had sent when the line was read, so bytes to target work as for a
  protocol, and the run ends with every directed link's bytes, packets and drops;
* copies each rank's ``stdout.txt``, ``stderr.txt``, ``program.json`` and ``out/`` into ``logs``
  (``rank<r>`` or ``rank<r>-restart<k>``) before the containers go away.

The result is a :class:`~squall.trace.RunTrace` (its ``meta["program"]`` holds what only a program
has, :mod:`squall.programs.result`) and every rank's runs, for :func:`squall.programs.verdict.judge`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import shutil
import threading
import time
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squall.cluster.backend import ClusterBackend
from squall.cluster.cluster import JobHandle
from squall.cluster.errors import ClusterError, JobError
from squall.cluster.jobs import JobResult
from squall.cluster.spec import LOCAL
from squall.experiment.lab import PROGRAM_MOUNT, ExperimentError, Lab, realised_timeline, schedule_links
from squall.experiment.timeline import Action, TimelineRunner, plan_timeline
from squall.profiles import Profile, load_profile
from squall.programs.result import META_KEY, runs_to_json
from squall.programs.spec import ProgramSpec
from squall.programs.verdict import RankRun
from squall.shaping import Shaper, TimedState, link_timeline
from squall.shaping.base import LinkCounters
from squall.shaping.timed import ChangeRun
from squall.trace import RunTrace, build_trace, load_jsonl

logger = logging.getLogger(__name__)

COMMAND_JOB = "command"  # squall.worker.registry's name of the command runner
SAMPLE_S = 1.0  # seconds between two readings of the kernel counters
GRACE_S = 30.0  # the host's deadline past the budget (the runner itself stops the program at its budget)
SETTLE_S = 0.3  # pause before the last reading: packets the emulated links still hold get counted
MIN_LEFT_S = 1.0  # the least budget a restarted rank is given
LOG_FILES = ("stdout.txt", "stderr.txt", "program.json", "metrics.jsonl")


@dataclass(frozen=True)
class ProgramRun:
    """What one run of a program left: its trace and every rank's runs."""

    trace: RunTrace  # figures, kernel bytes per record, meta["program"]
    runs: tuple[RankRun, ...]  # every rank's runs, restarts included
    counters: LinkCounters  # every directed link over the whole run


# -- counters ----------------------------------------------------------------------------------------
class _Sampler:
    """Reads the shaper's counters every :data:`SAMPLE_S` seconds in a thread, relative to a base."""

    def __init__(self, shaper: Shaper, base: LinkCounters, interval: float = SAMPLE_S) -> None:
        self.shaper = shaper
        self.base = base
        self.interval = interval
        self.samples: list[tuple[float, LinkCounters]] = [(time.time(), LinkCounters())]
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="squall-counters", daemon=True)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def read(self) -> LinkCounters:
        """One reading now, appended to :attr:`samples`."""
        now = self.shaper.counters() - self.base
        self.samples.append((time.time(), now))
        return now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.read()
            except Exception as exc:  # a reading that failed is a gap in the series, not a failed run
                logger.debug("reading the link counters failed: %s", exc)
                self.errors.append(str(exc))

    def sent_at(self, rank: int) -> Any:
        """A function ``wall -> bytes rank had sent`` interpolated between the readings."""
        walls = [w for w, _ in self.samples]
        sent = [c.sent(rank) for _, c in self.samples]

        def at(wall: float) -> int:
            k = bisect_right(walls, wall)
            if k == 0:
                return 0
            if k >= len(walls):
                return sent[-1]
            w0, w1, s0, s1 = walls[k - 1], walls[k], sent[k - 1], sent[k]
            return int(s0 + (s1 - s0) * (wall - w0) / (w1 - w0)) if w1 > w0 else s1

        return at


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
        self.start_time = time.monotonic()
        self.runs: list[RankRun] = []
        self.records: dict[int, list[list[dict[str, Any]]]] = {}  # rank -> each run's metrics records
        self.current: dict[int, tuple[int, JobHandle]] = {}  # rank -> (restart number, handle) running now
        self.killed: set[tuple[int, int]] = set()  # (rank, restart) runs churn killed: their loss is no failure
        self.stopping = False  # a rank failed: the others are being stopped, no restart any more
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
                run = self._classify(rank, restart, result)
                with self._lock:
                    self.runs.append(run)
                    if self.current.get(rank, (None,))[0] == restart:
                        del self.current[rank]
                logger.info("%s", run.describe())
                if run.failed and not self.stopping:
                    self.failed_at = time.monotonic()
                    t0 = time.monotonic()
                    self.stop_all(but=rank)
                    logger.info("the other ranks were stopped in %.2f s", time.monotonic() - t0)
        except BaseException:
            self.stop_all()  # interrupted (Ctrl-C): no rank keeps running
            raise

    def _classify(self, rank: int, restart: int, result: JobResult | BaseException) -> RankRun:
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
        if self.stopping:  # cancelled by the run: another rank failed, or the run was interrupted
            return RankRun(rank, restart, "stopped", result.exit_code, duration, tail, logs, ended)
        if (rank, restart) in self.killed:
            return RankRun(rank, restart, "killed", None, duration, tail, logs, ended)
        if result.state == "done":  # the runner died before it wrote its summary
            return RankRun(rank, restart, "error", result.exit_code, result.duration_s,
                           tail or (result.describe(),), logs, ended)
        if result.state == "timeout":
            return RankRun(rank, restart, "budget", info.get("exit_code"), duration, tail, logs, ended)
        return RankRun(rank, restart, "lost", None, duration, tail or (result.describe(),), logs, ended)

    def _keep(self, rank: int, restart: int, out_dir: Path) -> str:
        """Copy the run's files out of the cluster's directory (removed at teardown); the copy's folder."""
        dest = self.logs / (f"rank{rank}" if restart == 0 else f"rank{rank}-restart{restart}")
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
    """The image with ``program``'s requirements (built when missing), or None for the worker image.

    :raises RequirementsError: a requirement cannot be installed (before any container starts).
    """
    if not program.requirements:
        return None
    from squall.cluster.engine import docker_client
    from squall.cluster.program_image import ensure_program_image

    return ensure_program_image(docker_client(), program.requirements, source=program.requirements_source)


def run_program(lab: Lab, program: ProgramSpec, profile_name: str, *, seconds: float, seed: int = 0,
                logs: Path) -> ProgramRun:
    """Run ``program`` on ``lab``'s cluster shaped as ``profile_name`` for at most ``seconds`` (see the module)."""
    cluster, shaper = _ready(lab)
    n = lab.workers
    profile = load_profile(profile_name)
    profile.validate_for(n)
    lab.progress.stage("shaping", f"{program.name} on {profile.name}")
    states, changes, actions = _timeline(shaper, profile, n, seconds)
    config = {"argv": list(program.argv), "workdir": PROGRAM_MOUNT, "master_port": lab.next_port(),
              "metrics": {p.name: p.regex for p in program.metrics}, "env": dict(program.env)}
    logs.mkdir(parents=True, exist_ok=True)
    supervisor = _Supervisor(cluster, config, seed=seed, seconds=seconds, logs=logs)

    def act(action: Action) -> None:
        if action.kind == "kill":
            for node in action.nodes:
                supervisor.kill(node)
        lab.act(action, states, rejoin=supervisor)

    base = shaper.counters()
    start_wall, start = time.time(), time.monotonic()
    supervisor.start_time = start
    try:
        with _Sampler(shaper, base) as sampler:
            if changes is not None:
                changes.go(start)
            for rank in range(n):
                supervisor.start(rank)
            lab.progress.stage("training", f"{program.name} on {profile.name}")
            files = [cluster.nodes[r].run_dir / "jobs" / h.job_id / "metrics.jsonl" for r, (_, h) in
                     sorted(supervisor.current.items())]
            with lab.progress.watching(files, budget_s=seconds, budget_steps=None), \
                    TimelineRunner(actions, act, start=start) as timeline:
                supervisor.wait()
            time.sleep(SETTLE_S)
            final = sampler.read()
    finally:
        applied = changes.finish() if changes is not None else []
    realised = realised_timeline(states, applied, timeline.done, start=start, in_place=changes is not None)
    lab.progress.stage("collecting", f"{program.name} on {profile.name}")
    try:
        shaper.check()
    except Exception as exc:
        raise ExperimentError(f"{program.name} on {profile.name}: shaping stopped during the run: {exc}") from exc
    if timeline.errors:
        raise ExperimentError(f"{program.name} on {profile.name}: churn failed: {'; '.join(timeline.errors)}")
    duration = time.monotonic() - start
    runs = tuple(sorted(supervisor.runs, key=lambda r: (r.rank, r.restart)))
    with contextlib.suppress(ClusterError, JobError):
        lab.recover()
    realised.update({"duration_s": seconds, "replayed": False})
    lateness = [c["lateness_s"] for c in realised["changes"][1:]] + [t - a.at_s for a, t in timeline.done
                                                                     if a.kind != "reshape"]
    trace = _trace(program, profile, seed=seed, backend=shaper.backend, n=n, supervisor=supervisor,
                   sampler=sampler, final=final, runs=runs, start_wall=start_wall, duration=duration, seconds=seconds,
                   cluster=cluster, realised=realised, lateness=lateness, churn=timeline.marks)
    return ProgramRun(trace, runs, final)


def _ready(lab: Lab) -> tuple[ClusterBackend, Shaper]:
    """The lab's cluster and shaper, when it can run a program."""
    cluster, shaper = lab.cluster, lab.shaper
    if cluster is None or shaper is None:
        raise ExperimentError("the lab is not started: use 'with Lab(...) as lab'")
    if cluster.engine != LOCAL:
        raise ExperimentError(f"a program runs on the local engine only for now, not {cluster.engine!r}: its folder "
                              "is mounted from this machine")
    if PROGRAM_MOUNT not in {m.target for m in lab.spec.mounts}:
        raise ExperimentError(f"the lab does not mount a program folder at {PROGRAM_MOUNT}: Lab(workdir=...)")
    return cluster, shaper


def _timeline(shaper: Shaper, profile: Profile, n: int, seconds: float) -> tuple[list[TimedState], ChangeRun | None,
                                                                                  list[Action]]:
    """The link timeline as :meth:`Lab.run` has it: planned ahead and sent in place where the shaper can
    (else reshapes done by the timeline thread); node churn always by the timeline thread. The first
    state is applied."""
    states = link_timeline(profile, n, seconds)
    changes = schedule_links(shaper, states)
    actions = sorted([*(a for a in plan_timeline(profile, n, seconds) if a.kind != "reshape"),
                      *([] if changes else [Action(t.at_s, "reshape", label=t.label, change=i)
                                            for i, t in enumerate(states) if i > 0])],
                     key=lambda a: (a.at_s, a.kind != "reshape"))
    return list(states), changes, actions


def _trace(program: ProgramSpec, profile: Profile, *, seed: int, backend: str, n: int, supervisor: _Supervisor,
           sampler: _Sampler, final: LinkCounters, runs: Sequence[RankRun], start_wall: float, duration: float,
           seconds: float, cluster: ClusterBackend, realised: dict[str, Any], lateness: list[float],
           churn: Sequence[Any]) -> RunTrace:
    per_rank: list[list[dict[str, Any]]] = []
    for rank in range(n):
        sent_at = sampler.sent_at(rank)
        records = [rec for life in supervisor.records.get(rank, []) for rec in life]
        per_rank.append([{**rec, "bytes_sent": sent_at(float(rec.get("wall", start_wall)))} for rec in records])
    last = {r.rank: r for r in runs}
    survivors = [r for r in range(n) if r in last and last[r].state not in ("killed", "lost")]
    links = [[s, d, c.bytes, c.packets, c.dropped] for (s, d), c in sorted(final.links.items())]
    samples = [[round(w - start_wall, 3), [c.sent(r) for r in range(n)]] for w, c in sampler.samples]
    meta = {
        META_KEY: {"spec": program.to_json(), "runs": runs_to_json(runs), "links": links, "samples": samples,
                   "duration_s": round(duration, 3), "budget_s": seconds,
                   "stopped_after_failure_s": None if supervisor.failed_at is None
                   else round(supervisor.failed_at - supervisor.start_time, 3),
                   "counter_errors": sampler.errors[:5]},
        "bytes_source": "kernel (the shaping backend's per-link counters)",
        "budget_s": seconds, "engine": cluster.engine,
        "placement": [cluster.placement().get(i, "?") for i in range(n)],
        "failures": [r.describe() for r in runs if r.failed],
        "rejoined": sorted({r.rank for r in runs if r.restart}),
        "timeline_lateness_s": lateness,
        "timeline": realised, "profile_source": profile.source,
    }
    return build_trace(protocol=program.name, profile=profile.name, seed=seed, backend=backend, per_worker=per_rank,
                       start_wall=start_wall, churn=churn, survivors=survivors, meta=meta)
