"""What happens during a run, and when: link changes (phases, traces, link churn) and node churn.

:func:`plan_timeline` is pure: profile + cluster size + duration -> sorted :class:`Action` list.
Link changes are planned ahead and sent by the shaper's real-time executor
(:meth:`squall.shaping.base.SchedulingShaper.schedule`); what is left for :class:`TimelineRunner`
is node churn (docker kill, pause, restart), and link changes only when a timeline cannot be
applied in place. It executes its actions in a thread on the run's clock and records what it did
(with the time it did it) for the trace and the report.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from squall.profiles import ChurnKind, Profile
from squall.run_trace import ChurnMark

logger = logging.getLogger(__name__)

LINK_KINDS = {ChurnKind.LINK_DOWN, ChurnKind.LINK_UP, ChurnKind.PARTITION, ChurnKind.HEAL}


@dataclass(frozen=True)
class Action:
    """One thing to do at one time."""

    at_s: float  # seconds from the start of the run
    kind: str  # "reshape" (apply the profile's link state at at_s) or a node churn kind
    nodes: tuple[int, ...] = ()  # nodes of a node churn action
    label: str = ""  # what caused it (phase, churn kind) for the trace
    change: int = -1  # a reshape: the index of the state it applies in the run's link timeline


def plan_timeline(profile: Profile, n: int, duration: float) -> list[Action]:
    """Every action of a run of ``duration`` seconds; link changes become a reshape at their time."""
    actions = [Action(t, "reshape", label="phase") for t in profile.change_times() if 0 < t < duration]
    for ev in profile.churn_events(n, duration):
        if ev.at_s <= 0 or ev.at_s >= duration:
            continue
        if ev.kind in LINK_KINDS:
            actions.append(Action(ev.at_s, "reshape", label=str(ev.kind)))
        else:
            actions.append(Action(ev.at_s, str(ev.kind), tuple(ev.nodes), label=str(ev.kind)))
    return sorted(actions, key=lambda a: (a.at_s, a.kind != "reshape"))


class TimelineRunner:
    """Runs actions at their times in a thread; ``do`` performs one action (reshape or node churn)."""

    def __init__(self, actions: list[Action], do: Callable[[Action], None], *, start: float) -> None:
        self.actions = actions
        self.do = do
        self.start = start  # time.monotonic() of the run's t = 0
        self.marks: list[ChurnMark] = []
        self.errors: list[str] = []
        self.lateness: list[float] = []  # seconds each action ran after its time
        self.done: list[tuple[Action, float]] = []  # each action run, with the time it ran (from the start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="squall-timeline", daemon=True)

    def __enter__(self) -> TimelineRunner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        for action in self.actions:
            if self._stop.wait(max(0.0, self.start + action.at_s - time.monotonic())):
                return
            t = time.monotonic() - self.start
            try:
                self.do(action)
            except Exception as exc:
                logger.exception("timeline action %s failed", action)
                self.errors.append(f"{action.kind} {list(action.nodes)} at {action.at_s:.1f} s: {exc}")
            self.lateness.append(t - action.at_s)
            self.done.append((action, t))
            self.marks.append(ChurnMark(t, action.label or action.kind, action.nodes))
