"""A run's prepared changes, started at the run's t = 0: the part both backends share.

A backend's ``schedule(timeline)`` plans every change in place (:mod:`squall.shaping.planning.changes`),
applies the first state, encodes the others, and returns a :class:`ChangeRun`. :meth:`ChangeRun.go` turns the run's
start into due times and hands the :class:`~squall.shaping.clock.sender.Schedule` to the backend's real-time
executor; :meth:`ChangeRun.finish` stops it, returns what was done and when, and lets the backend
record the last state applied (so the next ``apply`` diffs from what the kernel holds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from squall.shaping.base import ShapingError
from squall.shaping.clock.sender import Applied, NamespaceRef, Schedule, ScheduleEntry
from squall.shaping.kernel.applier import Applier
from squall.shaping.planning import tc_diff
from squall.shaping.planning.changes import PlannedChange
from squall.shaping.planning.ops import NodePlan

Launch = Callable[[Schedule], "Started"]  # hand the schedule to the executor (before the run starts)


class Started(Protocol):
    """An executor holding a schedule: started with the run's clock, stopped at the end."""

    def go(self, start_ns: int) -> None:
        """The run's t = 0 on ``CLOCK_MONOTONIC``."""

    def stop(self) -> list[Applied]:
        """Drop what is not due yet; every change done."""


class ChangeRun:
    """Prepared changes of one run, handed to the executor when made: started once, finished once.

    Made by a backend's ``schedule`` (which must call :meth:`finish` itself if it fails after this)."""

    def __init__(self, planned: Sequence[PlannedChange[NodePlan]], namespaces: Mapping[str, NamespaceRef], *,
                 batches: Sequence[Mapping[str, bytes]], links: Sequence[Sequence[Mapping[str, Any]]],
                 launch: Launch, settle: Callable[[int], None]) -> None:
        """:param batches: per planned change, namespace key -> netlink batch.
        :param links: per planned change, the delay daemon's set_links items (empty for netem).
        :param settle: told the index of the last change done, when the run is finished."""
        if not (len(planned) == len(batches) == len(links)):
            raise ValueError("one batch and one set of link items per planned change")
        self.planned = list(planned)
        self._namespaces = dict(namespaces)
        self._batches = batches
        self._links = links
        self._settle = settle
        self._started = False
        self._finished = False
        self._executor: Started | None = launch(self.schedule()) if len(self.planned) > 1 else None

    def schedule(self) -> Schedule:
        """The schedule: each change after the first (applied already) at its time from the start."""
        entries = [ScheduleEntry(index, round(change.at_s * 1e9), change.label,
                                 tuple(sorted(self._batches[index].items())), tuple(self._links[index]))
                   for index, change in enumerate(self.planned) if index > 0]
        return Schedule(self._namespaces, tuple(entries))

    def go(self, start: float) -> None:
        """Start sending: ``start`` is the run's t = 0 in ``time.monotonic()`` seconds."""
        if self._started or self._finished:
            raise ShapingError("a change run starts once")
        self._started = True
        if self._executor is not None:
            self._executor.go(round(start * 1e9))

    def finish(self) -> list[Applied]:
        """Stop what is not due yet; every change done, in order. Safe to call twice."""
        if self._finished:
            return []
        self._finished = True
        applied = self._executor.stop() if self._executor is not None else []
        self._settle(max((a.index for a in applied), default=0))
        return sorted(applied, key=lambda a: a.index)


def namespace_key(index: int) -> str:
    """The schedule's name for node ``index``'s namespace."""
    return f"node{index}"


def netlink_batches(planned: Sequence[PlannedChange[NodePlan]], applier: Applier
                    ) -> tuple[dict[str, NamespaceRef], list[dict[str, bytes]]]:
    """The namespaces of the live nodes, and per planned change each one's netlink batch."""
    live = applier.live()
    ifindex: dict[int, dict[str, int]] = {}
    namespaces: dict[str, NamespaceRef] = {}
    for index in live:
        devices = sorted({tc_diff.device_of(step.op) for change in planned for step in change.steps.get(index, ())})
        namespace = applier.nodes[index].namespace
        if namespace is None:
            continue
        ifindex[index] = applier.ifindexes(index, devices)
        namespaces[namespace_key(index)] = NamespaceRef(namespace.path, *namespace.identity)
    batches = [{namespace_key(node): batch for node, batch in change.messages(ifindex).items()} for change in planned]
    used = {key for batch in batches for key in batch}
    return {key: ref for key, ref in namespaces.items() if key in used}, batches
