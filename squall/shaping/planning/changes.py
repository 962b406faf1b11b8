"""Every link change of a run, planned before it starts, as in-place changes (pure).

Why ahead of time: a change computed at its due time (resolve the profile, plan, diff, enter each
namespace, talk to the kernel) waits for the host process, its scheduling class, its interpreter
lock and whatever else it runs, and came hundreds of milliseconds late beside one busy process.
Planned here, a change is bytes to send (:mod:`squall.shaping.planning.tc_messages`) and parameters to
set, which an executor at a real-time priority (:mod:`squall.shaping.clock.sender`, or the nfqueue
delay daemon) sends at the due time.

Why in place: deleting and re-adding a qdisc drops the packets it holds and resets every TCP
connection through it. So the whole run uses one tree: every link that is shaped at any time of
the run (:class:`Keep`) keeps its class, its leaf and its daemon queue for the whole run, perfect
while it has nothing to do, and a cut link (``blocked``: link churn, partitions) is a link that
loses every packet (:func:`cuts_as_loss`) rather than a DROP rule that comes and goes. Between
two consecutive states only ``change`` steps remain; anything else (an uplink cap that appears, a
duplication that moves TEE rules) raises :class:`NotInPlace`, naming the change, and the caller
falls back to applying that timeline the old way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from squall.profiles import LinkSpec, Loss
from squall.shaping.base import LinkState, ShapingError
from squall.shaping.planning import tc_diff
from squall.shaping.planning.ops import NodePlan
from squall.shaping.planning.tc_messages import change_message

Pair = tuple[int, int]
#: A backend's node plan (:class:`NodePlan` or its own subclass): what a planned change carries, so the
#: backend gets back the plans its planner made, typed as they are.
Plan_co = TypeVar("Plan_co", bound=NodePlan, covariant=True)
#: The same, where a planner's plans go in and come back out (:func:`plan_in_place`).
PlanOf = TypeVar("PlanOf", bound=NodePlan)


class NotInPlace(ShapingError):
    """A timeline that cannot be applied by changes alone (the tree would have to change shape)."""


@dataclass(frozen=True)
class TimedState:
    """The link state from ``at_s`` on, and what brought it (``phase slow``, ``trace links.default``)."""

    at_s: float  # seconds from the start of the run
    label: str  # what changed, for the realised timeline
    state: LinkState  # everything that holds from then on


@dataclass(frozen=True)
class Keep:
    """What exists for the whole run: links with a tc class and leaf, links with a daemon queue."""

    leaves: frozenset[Pair] = frozenset()  # (src, dst): a class and a leaf on the sender, always
    queues: frozenset[Pair] = frozenset()  # (src, dst): a delay-daemon queue (and its hold rule), always


@dataclass(frozen=True)
class PlannedChange(Generic[Plan_co]):
    """One change of the run: its state, each node's plan (of the backend's plan type) and the steps
    from the previous plan."""

    at_s: float  # due time, seconds from the start of the run
    label: str  # what brought it
    state: LinkState  # as the profile says it (cuts as cuts), for the record
    plans: Mapping[int, Plan_co]  # each node's plan for it (cuts as loss)
    steps: Mapping[int, tuple[tc_diff.TcStep, ...]]  # node -> the change steps from the previous plan
    changed: tuple[Pair, ...]  # the links whose settings differ from the previous state's

    def messages(self, ifindex: Mapping[int, Mapping[str, int]]) -> dict[int, bytes]:
        """Node -> its change steps as one batch of netlink requests (:mod:`.tc_messages`); nodes
        missing from ``ifindex`` (their namespace is gone) are left out."""
        return {node: b"".join(change_message(step, ifindex[node][tc_diff.device_of(step.op)]) for step in steps)
                for node, steps in self.steps.items() if steps and node in ifindex}


#: A backend's planner: a state and what the run keeps to each node's plan of the backend's type.
Planner = Callable[[LinkState, Keep], Mapping[int, PlanOf]]


def cuts_as_loss(state: LinkState) -> LinkState:
    """The state with every cut link losing every packet, and nothing cut."""
    if not state.blocked:
        return state
    links = dict(state.links)
    for pair in state.blocked:
        links[pair] = dataclasses.replace(links.get(pair, LinkSpec()), loss=Loss(probability=1.0))
    return dataclasses.replace(state, links=links, blocked=frozenset())


def changed_links(before: LinkState | None, after: LinkState) -> tuple[Pair, ...]:
    """Links whose settings (or cut) differ between two states, sorted; every link when there is no before."""
    pairs = set(after.links) | set(after.blocked)
    if before is not None:
        pairs |= set(before.links) | set(before.blocked)
        pairs = {p for p in pairs if before.links.get(p) != after.links.get(p)
                 or (p in before.blocked) != (p in after.blocked)}
    return tuple(sorted(pairs))


def plan_in_place(timeline: Sequence[TimedState], plan: Planner[PlanOf], keep: Keep) -> list[PlannedChange[PlanOf]]:
    """Plan every state of ``timeline`` (the first at 0, applied as usual) on one tree; each change
    carries the plans of ``plan``'s own type.

    :raises NotInPlace: when two consecutive plans differ by more than changes of existing objects.
    """
    if not timeline:
        return []
    planned: list[PlannedChange[PlanOf]] = []
    previous: Mapping[int, PlanOf] | None = None
    before: LinkState | None = None
    for timed in timeline:
        plans = plan(cuts_as_loss(timed.state), keep)
        steps: dict[int, tuple[tc_diff.TcStep, ...]] = {}
        if previous is not None:
            for node, now in plans.items():
                was = previous[node]
                where = f"the change at {timed.at_s:g}s ({timed.label}) on node {node}"
                if was.rules != now.rules:
                    raise NotInPlace(f"{where} changes iptables rules (duplication?)")
                if getattr(was, "queues", None) is not None and _sources(was) != _sources(now):
                    raise NotInPlace(f"{where} changes which links the delay daemon holds")
                node_steps = tuple(tc_diff.diff(was.tc, now.tc))
                odd = [step for step in node_steps if step.verb != "change"]
                if odd:
                    raise NotInPlace(f"{where} needs {odd[0].verb} of {odd[0].op} (the tree changes shape)")
                steps[node] = node_steps
        planned.append(PlannedChange(timed.at_s, timed.label, timed.state, plans, steps,
                                     changed_links(before, timed.state)))
        previous, before = plans, timed.state
    return planned


def _sources(plan: NodePlan) -> tuple[int, ...]:
    return tuple(q.source for q in getattr(plan, "queues", ()))


def pairs_ever(timeline: Sequence[TimedState], wanted: Callable[[LinkSpec], bool]) -> frozenset[Pair]:
    """Links for which ``wanted`` holds in some state (cuts counted as total loss)."""
    found: set[Pair] = set()
    for timed in timeline:
        for pair, spec in cuts_as_loss(timed.state).links.items():
            if pair not in found and wanted(spec):
                found.add(pair)
    return frozenset(found)
