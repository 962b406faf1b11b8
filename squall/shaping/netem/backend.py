"""The netem backend: everything in the kernel, the preferred backend where ``sch_netem`` exists.

Plan: :func:`.plan.plan_netem` (HTB classes per destination with netem leaves on each sender; cut
links as iptables DROP in the receiver; IFB for downlink caps). Execution:
:class:`squall.shaping.kernel.applier.Applier` (pyroute2 in each container's namespace). A change of
link settings becomes ``change`` requests on the existing classes and netem qdiscs, which keep the
packets they hold; only structural changes rebuild a device's tree. Nothing runs in user space, so
there is nothing that can die: :meth:`check` only reports nodes left in an unknown state by a failed
rollback.

Duplication goes to iptables ``TEE`` in the sender (as the nfqueue backend does it), not to netem:
current kernels (Debian's 6.1.192 among them, measured in the netem VM of ``scripts/netem-vm``)
refuse a duplicating netem in a tree that holds another netem (``tc add qdisc netem``: EINVAL), and
every node with two shaped destinations has such a tree. The clone leaves through the same HTB class
and netem leaf, so it is delayed like the original. A *correlated* duplication stays with netem
(iptables draws independently); the kernel then accepts it only on a node with one netem leaf.

Counting. Every directed link has its class, also one the profile leaves alone (``keep`` every
pair: a netem leaf with no setting), so the classes' statistics are every link's bytes, packets and
drops (:meth:`NetemShaper.counters`, :mod:`.counting`).

This kernel has no ``sch_netem``; :func:`squall.shaping.select.open_shaper` refuses the backend there (with the
probe's reason) and the integration test is skipped only for that reason.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from squall.shaping.base import Endpoint, LinkCounters, LinkState, ShapingError
from squall.shaping.clock.change_run import ChangeRun, netlink_batches
from squall.shaping.clock.sender import Applied, Schedule, ScheduleProcess
from squall.shaping.kernel.applier import Applier, endpoint_of, locked
from squall.shaping.kernel.netns import NamespaceGone, identity_of
from squall.shaping.planning.changes import Keep, TimedState, pairs_ever, plan_in_place
from squall.shaping.planning.ops import NodePlan, QdiscOp, RuleOp, TcOp
from squall.shaping.planning.shared_plan import tee_rule, validated

from .counting import Accumulator, link_count, read_counts
from .leaf import Netem
from .plan import needs_netem, plan_netem

logger = logging.getLogger(__name__)


class NetemShaper:
    """Shapes a cluster's links with HTB + netem (and iptables DROP for cut links)."""

    backend = "netem"

    def __init__(self, endpoints: Sequence[Endpoint], *, run_id: str):
        validated(endpoints, LinkState({}))
        self.run_id = run_id
        self._endpoints = {ep.index: ep for ep in endpoints}
        self._applier = Applier(endpoints, run_id)
        self._state: LinkState | None = None
        self._closed = False
        self._lock = threading.RLock()  # one change at a time (e.g. a churn thread and a phase change)
        self._counts = Accumulator()  # every link's class statistics, carried across rebuilt classes

    @property
    def _every_link(self) -> frozenset[tuple[int, int]]:
        """Every directed pair: each keeps its class, so each is counted."""
        return frozenset((s, d) for s in self._endpoints for d in self._endpoints if s != d)

    @locked
    def apply(self, state: LinkState) -> None:
        """Make the links behave as ``state`` says; all or nothing."""
        self._require_open()
        t0 = time.monotonic()
        plans = duplication_by_tee(plan_netem(list(self._endpoints.values()), state, self._every_link),
                                   self._endpoints, state)
        # Not read here (apply is on the clock of a link change): a class rebuilt by a structural change
        # starts again from zero, and the next reading sees it lower and carries what it had counted.
        self._applier.apply(plans)
        self._state = state
        logger.info("netem: applied %d links on %d nodes in %.1f ms", len(state.links), len(plans),
                    (time.monotonic() - t0) * 1e3)

    @locked
    def clear(self) -> None:
        """Remove every qdisc, class, filter, device and rule this shaper added (what they counted is kept)."""
        self._observe()
        self._counts.forget(list(self._counts.last))
        self._applier.clear()
        self._state = None

    @locked
    def counters(self) -> LinkCounters:
        """Every directed link's bytes, packets and drops: its HTB class's statistics (see :mod:`.counting`)."""
        if not self._closed:
            self._observe()
        return LinkCounters(self._counts.totals())

    def _observe(self) -> None:
        """Read the classes of every live sender into the accumulator."""
        readings = {}
        for index in self._applier.live():
            node = self._applier.nodes[index]
            if node.namespace is None:
                continue
            others = {d: None for d in self._endpoints if d != index}
            try:
                found = read_counts(node.namespace, node.endpoint.device, others)
            except (NamespaceGone, ShapingError, OSError) as exc:
                logger.debug("netem counters of node %d unreadable: %s", index, exc)
                continue
            readings.update({(index, dst): link_count(tc) for dst, tc in found.items()})
        self._counts.observe(readings)

    @locked
    def replace_endpoint(self, endpoint: Endpoint) -> None:
        """Node restarted: apply its part of the current state in its new namespace."""
        self._require_open()
        old = endpoint_of(self._endpoints, endpoint.index)
        self._endpoints[endpoint.index] = endpoint
        validated(list(self._endpoints.values()), LinkState({}))
        self._observe()
        held = self._applier.nodes[endpoint.index].namespace
        if held is None or held.identity != identity_of(endpoint.netns):  # a fresh namespace: its classes start at 0
            self._counts.forget([k for k in self._counts.last if k[0] == endpoint.index])
        self._applier.replace(endpoint)
        if self._state is not None and old.address != endpoint.address:
            self.apply(self._state)

    @locked
    def place(self, elsewhere: Collection[int]) -> None:
        """The endpoints ``elsewhere`` run on other hosts (see :class:`~squall.shaping.base.MultiHostShaper`).

        Netem shapes in the sender's namespace, so nothing else changes: a link to an endpoint
        elsewhere is shaped here by its address, a link from one by that host's shaper.
        """
        self._require_open()
        for index in elsewhere:
            self._applier.elsewhere(endpoint_of(self._endpoints, index))

    @locked
    def replace_elsewhere(self, endpoint: Endpoint) -> None:
        """An endpoint on another host restarted: re-plan this host's links to it if its address changed."""
        self._require_open()
        old = endpoint_of(self._endpoints, endpoint.index)
        self._endpoints[endpoint.index] = endpoint
        validated(list(self._endpoints.values()), LinkState({}))
        self._applier.elsewhere(endpoint)
        if self._state is not None and old.address != endpoint.address:
            self.apply(self._state)

    @locked
    def schedule(self, timeline: Sequence[TimedState]) -> ChangeRun:
        """Plan every change of a run in place, apply the first state now; the rest go out, once
        :meth:`ChangeRun.go` is called, from the real-time change executor (:mod:`squall.shaping.clock.sender`).

        :raises NotInPlace: when the timeline would change the shape of the tree (the caller then
            applies it the old way).
        """
        self._require_open()
        eps = list(self._endpoints.values())
        keep = Keep(leaves=pairs_ever(timeline, needs_netem) | self._every_link)  # every link counted

        def planner(state: LinkState, kept: Keep) -> dict[int, NodePlan]:
            return duplication_by_tee(plan_netem(eps, state, kept.leaves), self._endpoints, state)

        planned = plan_in_place(timeline, planner, keep)
        self._applier.apply(planned[0].plans)
        self._state = timeline[0].state
        namespaces, batches = netlink_batches(planned, self._applier)

        def launch(schedule: Schedule) -> _Executor:
            return _Executor(schedule, self.run_id)

        def settle(last: int) -> None:
            with self._lock:
                self._applier.settle(planned[last].plans)
                self._state = planned[last].state

        return ChangeRun(planned, namespaces, batches=batches, links=[()] * len(planned), launch=launch,
                         settle=settle)

    def check(self) -> None:
        """Raise if a node was left in an unknown state; netem itself cannot die."""
        if not self._closed:
            self._applier.check()

    @locked
    def close(self) -> None:
        """Clear; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.clear()

    def _require_open(self) -> None:
        if self._closed:
            raise ShapingError(f"the netem shaper of run {self.run_id} is closed")


class _Executor:
    """The change executor process of one run and its work directory (the schedule file)."""

    def __init__(self, schedule: Schedule, run_id: str) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"squall-changes-{run_id}-"))
        try:
            self.process = ScheduleProcess(schedule, self.workdir)
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise

    def go(self, start_ns: int) -> None:
        self.process.go(start_ns)

    def stop(self) -> list[Applied]:
        try:
            return self.process.stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


def duplication_by_tee(plans: Mapping[int, NodePlan], endpoints: Mapping[int, Endpoint],
                       state: LinkState) -> dict[int, NodePlan]:
    """``plans`` with every uncorrelated duplication moved from the netem leaves to TEE rules in the sender.

    Why: a kernel refuses a duplicating netem in a tree with another netem (see the module docstring).
    """
    out: dict[int, NodePlan] = {}
    for node, plan in plans.items():
        tees: list[RuleOp] = []
        for dst, ep in endpoints.items():
            spec = state.links.get((node, dst))
            if dst == node or spec is None or spec.duplicate.probability == 0 or spec.duplicate.correlation > 0:
                continue
            tees.append(tee_rule(ep.address, spec))
        if not tees:
            out[node] = plan
            continue
        tc = tuple(_without_duplication(op) for op in plan.tc)
        out[node] = dataclasses.replace(plan, tc=tc, rules=(*plan.rules, *tees))
    return out


def _without_duplication(op: TcOp) -> TcOp:
    if isinstance(op, QdiscOp) and isinstance(op.qdisc, Netem) and op.qdisc.duplicate_corr == 0:
        return dataclasses.replace(op, qdisc=dataclasses.replace(op.qdisc, duplicate=0.0))
    return op
