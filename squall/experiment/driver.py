"""The one driver of a cell: a workload (a protocol's job, or a user's program) run on a shaped cluster.

Whatever a cell runs, the same steps happen in the same order, here and nowhere else:

1. the link timeline: the profile's phases, traces and link churn (or a recorded timeline, for a
   replay) planned ahead and sent in place where the shaper can, else reshaped by the timeline thread;
2. the workload starts on every node (:meth:`Workload.begin`), the kernel's per-link counters are read
   every :data:`SAMPLE_S` seconds, the live display watches the metrics files, node churn (kill,
   pause, restart) runs on the run's clock, telling the workload before a kill and after a restart,
   and the hang watch (:mod:`.hangs`) stops a run in which no rank printed a line and the links carried
   only a trickle for the cell's ``hang_after_s``, every rank's stack taken first;
3. the workload's ranks end (:meth:`Workload.wait`); the links' last counts are read;
4. the shaper is checked (a daemon that died means no shaping: :class:`ExperimentError`), so is the
   churn; the workload's records are collected (:meth:`Workload.end`); every node is brought back for
   the next cell;
5. one :class:`~squall.run_trace.RunTrace` with the metadata every cell carries (timeline as realised,
   lateness, placement, engine, failures, the hang and the stacks, every fault with the recovery after it,
   each ``--agree`` figure's outcome) and what only this workload has.

:class:`Workload` is the only thing a protocol and a program do differently.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from squall.checks.agreement import Agree, agreements
from squall.checks.recovery import fault_events
from squall.cluster.backend import ClusterBackend
from squall.cluster.errors import ClusterError, JobError
from squall.cluster.spec import LOCAL
from squall.experiment.hangs import HangWatch, Running, default_after
from squall.experiment.realised import change_records, churn_records, replayed
from squall.experiment.timeline import Action, TimelineRunner, plan_timeline
from squall.profiles import Profile
from squall.progress import Observer
from squall.run_meta import LinkCount, RunMeta
from squall.run_trace import RunTrace, build_trace
from squall.shaping import NotInPlace, Shaper, TimedState, link_timeline
from squall.shaping.base import LinkCounters, SchedulingShaper
from squall.shaping.clock.change_run import ChangeRun
from squall.shaping.clock.sender import Applied

logger = logging.getLogger(__name__)

SAMPLE_S = 1.0  # seconds between two readings of the kernel counters
SETTLE_S = 0.3  # pause before the last reading: packets the emulated links still hold get counted


class ExperimentError(RuntimeError):
    """A cell could not run, or its run broke the emulation (e.g. shaping stopped); says why."""


# -- what differs between a protocol and a program ------------------------------------------------------
@dataclass(frozen=True)
class Ended:
    """What a workload left once its ranks ended."""

    per_worker: list[list[dict[str, Any]]]  # each node's metrics records, in order (index = node)
    survivors: list[int]  # nodes whose last run survived
    failures: list[str]  # one line per failed run of a rank
    rejoined: list[int]  # nodes whose job was started again after a restart
    meta: RunMeta = field(default_factory=RunMeta)  # what only this workload records (the driver adds the rest)
    finished: tuple[int, ...] | None = None  # ranks that finished their work (--agree compares them); None: survivors
    at_budget: tuple[int, ...] | None = None  # ranks still running at the budget (their stacks kept); None: all


class Workload(Protocol):
    """A cell's work on every node: started, told of churn, waited for, collected."""

    label: str  # in messages: the protocol's or the program's name
    depth: int  # where a rank's process is below its container's agent: 1 the job, 2 the job's child (a program)

    @property
    def budget_dump_at_s(self) -> float | None:
        """Seconds after the start to take the stacks of the ranks still running; None: never."""

    def begin(self, cluster: ClusterBackend, start: float) -> list[Path]:
        """Start every rank (``start`` is the run's ``time.monotonic()`` t = 0); the metrics files to watch."""

    def before(self, action: Action) -> None:
        """Churn is about to act on ``action.nodes`` (a kill takes the rank's run with it)."""

    def restarted(self, node: int) -> None:
        """``node``'s container was restarted and reshaped: start its rank again if the workload rejoins."""

    def wait(self) -> None:
        """Until every rank has ended (or was stopped)."""

    def end(self, counters: CounterSampler) -> Ended:
        """Collect the ranks' records and runs; :class:`ExperimentError` when the cell has nothing to show."""

    def lines(self) -> list[tuple[int, Path]]:
        """(rank, file) of every running rank: a file that grows means the rank printed a line."""

    def running(self) -> list[Running]:
        """The ranks running now (their stacks are taken at a hang)."""

    def stop(self) -> None:
        """Stop every rank now: the run is hung (the runs end as ``hung``)."""


# -- counters -----------------------------------------------------------------------------------------
class CounterSampler:
    """Reads the shaper's per-link counters every ``interval`` seconds in a thread, relative to a base."""

    def __init__(self, shaper: Shaper, interval: float = SAMPLE_S) -> None:
        self.shaper = shaper
        self.base = shaper.counters()
        self.interval = interval
        self.samples: list[tuple[float, LinkCounters]] = [(time.time(), LinkCounters())]
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="squall-counters", daemon=True)

    def __enter__(self) -> CounterSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def last(self) -> LinkCounters:
        """The latest reading."""
        return self.samples[-1][1]

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

    def totals(self) -> list[tuple[float, int]]:
        """(wall, bytes over every link) of each reading so far."""
        return [(w, sum(c.bytes for c in counts.links.values())) for w, counts in list(self.samples)]

    def sent_at(self, rank: int) -> Callable[[float], int]:
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


# -- the links' timeline --------------------------------------------------------------------------------
def schedule_links(shaper: Shaper, states: Sequence[TimedState]) -> ChangeRun | None:
    """Apply the first state and prepare the others as in-place changes sent at real-time priority;
    None (the first state applied the old way) when the shaper cannot or the timeline is not in place."""
    if len(states) > 1 and isinstance(shaper, SchedulingShaper):
        try:
            return shaper.schedule(states)
        except NotInPlace as exc:
            logger.warning("link changes applied one by one by the harness, not in place: %s", exc)
    shaper.apply(states[0].state)
    return None


def realised_timeline(states: Sequence[TimedState], applied: Sequence[Applied], done: Sequence[tuple[Action, float]],
                      *, start: float, in_place: bool) -> dict[str, Any]:
    """The run's realised timeline (:mod:`.realised`): each link change done and each churn action run."""
    done_at: dict[int, tuple[float, Sequence[str]]] = {0: (0.0, ())}
    done_at.update({a.index: (a.done_ns / 1e9 - start, a.errors) for a in applied})
    done_at.update({a.change: (t, ()) for a, t in done if a.kind == "reshape"})
    for a in applied:
        if a.errors:
            logger.warning("link change %d (%s) at %.3f s: %s", a.index, states[a.index].label,
                           states[a.index].at_s, "; ".join(a.errors))
    return {"in_place": in_place, "changes": change_records(states, done_at), "churn": churn_records(done)}


@dataclass(frozen=True)
class Plan:
    """A run's link states and the actions left for the timeline thread."""

    states: list[TimedState]  # the link timeline; the first is applied before the run starts
    node_actions: list[Action]  # node churn (kill, pause, resume, restart)

    @classmethod
    def of(cls, profile: Profile, n: int, duration: float, replay: Mapping[str, Any] | None = None) -> Plan:
        """The profile's timeline over ``duration`` seconds, or a recorded one."""
        if replay is not None:
            states, actions = replayed(replay, n)
            return cls(list(states), actions)
        return cls(list(link_timeline(profile, n, duration)),
                   [a for a in plan_timeline(profile, n, duration) if a.kind != "reshape"])

    def actions(self, in_place: bool) -> list[Action]:
        """Node churn, plus each link change when they are not sent in place."""
        reshapes = [] if in_place else [Action(t.at_s, "reshape", label=t.label, change=i)
                                        for i, t in enumerate(self.states) if i > 0]
        return sorted([*self.node_actions, *reshapes], key=lambda a: (a.at_s, a.kind != "reshape"))


# -- churn ----------------------------------------------------------------------------------------------
def act(action: Action, states: Sequence[TimedState], cluster: ClusterBackend, shaper: Shaper,
        restarted: Callable[[int], None] | None = None) -> None:
    """Do one timeline action: a reshape to ``states[action.change]``, or node churn (``restarted`` is
    told of each node restarted and reshaped)."""
    if action.kind == "reshape":
        shaper.apply(states[action.change].state)
        return
    for node in action.nodes:
        if action.kind == "kill":
            cluster.kill(node)
        elif action.kind == "pause":
            cluster.pause(node)
        elif action.kind == "resume":
            cluster.unpause(node)
        elif action.kind == "restart":
            shaper.replace_endpoint(cluster.restart(node).endpoint)
            if restarted is not None:
                restarted(node)
        else:
            raise ExperimentError(f"unknown churn action {action.kind!r}")


def recover(cluster: ClusterBackend, shaper: Shaper) -> None:
    """Bring every node back for the next cell: unpause, restart the dead, re-shape the new."""
    for node in list(cluster.nodes):
        state = cluster.state(node.index)
        if state.paused:
            cluster.unpause(node.index)
        elif not state.running or node.agent.ping(timeout=2) is None:
            logger.info("bringing node %d back after churn", node.index)
            shaper.replace_endpoint(cluster.restart(node.index).endpoint)


# -- the run --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """Where and how long a workload runs: the pieces of a started lab the driver needs."""

    cluster: ClusterBackend
    shaper: Shaper
    progress: Observer
    profile: Profile  # loaded and validated for the cluster's size
    seconds: float  # the run's time budget (its timeline's length)
    seed: int
    budget_steps: int | None = None  # shown by the live display
    replay: Mapping[str, Any] | None = None  # a recorded timeline to run instead of the profile's
    hang_after_s: float | None = None  # stop the run as hung after this long without progress; None: the default
    agree: tuple[Agree, ...] = ()  # figures every finished rank must end with (--agree)


@dataclass(frozen=True)
class Driven:
    """What the driver returns: the trace and the links' counts over the whole run."""

    trace: RunTrace
    counters: LinkCounters
    ended: Ended


def drive(cell: Cell, workload: Workload) -> Driven:
    """Run ``workload`` on ``cell`` (see the module docstring)."""
    cluster, shaper, profile = cell.cluster, cell.shaper, cell.profile
    what = f"{workload.label} on {profile.name}"
    cell.progress.stage("shaping", what)
    plan = Plan.of(profile, len(cluster.nodes), cell.seconds, cell.replay)
    changes = schedule_links(shaper, plan.states)

    def do(action: Action) -> None:
        workload.before(action)
        act(action, plan.states, cluster, shaper, workload.restarted)

    start_wall, start = time.time(), time.monotonic()
    timeline: TimelineRunner | None = None
    try:
        with CounterSampler(shaper) as counters:
            if changes is not None:
                changes.go(start)
            files = workload.begin(cluster, start)
            cell.progress.stage("training", what)
            with cell.progress.watching(files, budget_s=cell.seconds, budget_steps=cell.budget_steps), \
                    TimelineRunner(plan.actions(changes is not None), do, start=start) as timeline, \
                    _watch(cell, workload, counters, start_wall) as watch:
                workload.wait()
            time.sleep(SETTLE_S)
            final = counters.read()
    finally:
        applied = changes.finish() if changes is not None else []
    realised = realised_timeline(plan.states, applied, timeline.done, start=start, in_place=changes is not None)
    realised.update({"duration_s": cell.seconds, "replayed": cell.replay is not None})
    cell.progress.stage("collecting", what)
    try:
        shaper.check()
    except Exception as exc:
        raise ExperimentError(f"{what}: shaping stopped during the run: {exc}") from exc
    if timeline.errors:
        raise ExperimentError(f"{what}: churn failed: {'; '.join(timeline.errors)}")
    ended = workload.end(counters)
    try:
        recover(cluster, shaper)
    except (ClusterError, JobError) as exc:  # this run's results stand; the next cell will say what is wrong
        logger.warning("%s: bringing the nodes back failed: %s", what, exc)
    lateness = [c["lateness_s"] for c in realised["changes"][1:]] + [t - a.at_s for a, t in timeline.done
                                                                     if a.kind != "reshape"]
    n = len(cluster.nodes)
    stacks = tuple(s for s in watch.stacks if s.why != "budget" or ended.at_budget is None or s.rank in ended.at_budget)
    meta = dataclasses.replace(
        ended.meta, budget_s=ended.meta.budget_s if ended.meta.budget_s is not None else cell.seconds,
        failures=tuple(ended.failures), timeline_lateness_s=tuple(lateness), timeline=realised,
        profile_source=profile.source, seed=cell.seed, rejoined=tuple(ended.rejoined), engine=cluster.engine,
        placement=tuple(cluster.placement().get(i, "?") for i in range(n)), clock_offsets_s=cluster.clock_offsets(),
        links=tuple(LinkCount(s, d, c.bytes, c.packets, c.dropped) for (s, d), c in sorted(final.links.items())),
        hang=watch.hang, stacks=stacks)
    trace = build_trace(protocol=workload.label, profile=profile.name, seed=cell.seed, backend=shaper.backend,
                        per_worker=ended.per_worker, start_wall=start_wall, churn=timeline.marks,
                        survivors=ended.survivors, meta=meta)
    finished = ended.finished if ended.finished is not None else tuple(ended.survivors)
    trace = dataclasses.replace(trace, meta=dataclasses.replace(
        trace.meta, faults=fault_events(trace), agreement=agreements(trace, cell.agree, finished)))
    return Driven(trace, final, ended)


def _watch(cell: Cell, workload: Workload, counters: CounterSampler, start_wall: float) -> HangWatch:
    """The cell's hang watch (:mod:`.hangs`): its threshold, the workload's files and ranks, the counters."""
    cluster = cell.cluster

    def pid_of(rank: int) -> int:
        if cluster.engine != LOCAL:  # py-spy runs here; the rank's process is in another machine's /proc
            raise ExperimentError(f"not taken on the {cluster.engine} engine (py-spy runs on this machine, the rank "
                                  f"on node {cluster.placement().get(rank, '?')})")
        return cluster.nodes[rank].pid

    after = cell.hang_after_s if cell.hang_after_s is not None else default_after(cell.seconds)
    return HangWatch(after_s=after, start_wall=start_wall, lines=workload.lines, bytes_seen=counters.totals,
                     running=workload.running, pid_of=pid_of, depth=workload.depth, stop=workload.stop,
                     budget_dump_at_s=workload.budget_dump_at_s)

