"""Applies node plans to namespaces: tc steps and iptables chains, in parallel, all or nothing.

Both backends use one :class:`Applier`; the nfqueue backend adds the daemon around it. Per node it
remembers the namespace (pinned by identity, :mod:`squall.shaping.kernel.netns`), the tc operations in force and the
installed rules, so a new plan becomes a diff (:mod:`squall.shaping.planning.tc_diff`) plus at most one
``iptables-restore`` (:mod:`squall.shaping.kernel.iptables`).

All or nothing: every node is tried (one thread per node); if any fails, the nodes that succeeded
are taken back to their previous plan and the failed ones are reset, then :class:`ShapingError` is
raised with every reason. Resetting tears down only what this run may hold there (what it held
before, plus what the failed call added before failing; never an object someone else created, such
as a foreign root qdisc that made the call fail) and rebuilds the previous plan. A node whose
rollback fails too is *broken*: :meth:`Applier.check` raises until it is cleared or replaced.

A node whose namespace is gone (its container was killed) is skipped, not failed: it sends and
receives nothing. Its wanted plan is kept; :meth:`Applier.replace` applies it in the new
namespace after a restart.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from squall.shaping.base import Endpoint, ShapingError
from squall.shaping.kernel import iptables, tc
from squall.shaping.kernel.netns import Namespace, NamespaceGone
from squall.shaping.planning import tc_diff
from squall.shaping.planning.ops import NodePlan, TcOp

logger = logging.getLogger(__name__)
MAX_THREADS = 16


@dataclass
class NodeState:
    """What one node's namespace holds, as far as this run knows."""

    endpoint: Endpoint  # where it is
    namespace: Namespace | None  # None: gone (container killed) until replaced
    tc: tuple[TcOp, ...] = ()  # tc operations in force
    rules: iptables.Installed | None = None  # the run's chains, if any
    broken: str | None = None  # why a rollback failed, if it did
    wanted: NodePlan | None = field(default=None)  # the plan it should hold


F = TypeVar("F", bound=Callable[..., Any])


def endpoint_of(endpoints: Mapping[int, Endpoint], index: int) -> Endpoint:
    """The shaper's endpoint ``index``; :class:`ShapingError` when it has none."""
    endpoint = endpoints.get(index)
    if endpoint is None:
        raise ShapingError(f"node {index} is not one of this shaper's endpoints")
    return endpoint


def locked(method: F) -> F:
    """Run a shaper method under the shaper's ``_lock`` (one change at a time)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def parallel(calls: Sequence[Callable[[], None]]) -> list[BaseException | None]:
    """Run ``calls`` on threads; return each one's exception (or None), in order."""

    def guarded(call: Callable[[], None]) -> BaseException | None:
        try:
            call()
        except Exception as exc:
            logger.debug("shaping call failed", exc_info=True)
            return exc
        return None

    if len(calls) <= 1:
        return [guarded(call) for call in calls]
    with ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(calls)), thread_name_prefix="squall-shape") as pool:
        return list(pool.map(guarded, calls))


class Applier:
    """Node plans -> namespaces, for one run's endpoints."""

    def __init__(self, endpoints: Sequence[Endpoint], run_id: str):
        self.chains = iptables.Chains(run_id)
        self.nodes: dict[int, NodeState] = {}
        for ep in endpoints:
            self.nodes[ep.index] = NodeState(ep, Namespace(ep.netns))

    # -- apply ------------------------------------------------------------------------------------
    def apply(self, plans: Mapping[int, NodePlan]) -> None:
        """Make every live node hold its plan; on any failure roll every node back and raise."""
        old = {i: self._held(i) for i in plans}
        for i, plan in plans.items():
            self.nodes[i].wanted = plan
        todo = [i for i, plan in plans.items() if self._needs(i, plan)]
        errors = parallel([functools.partial(self._apply_node, i, plans[i]) for i in todo])
        failed = {i: e for i, e in zip(todo, errors, strict=True) if e is not None}
        if not failed:
            return
        done = [i for i in todo if i not in failed]
        for i in plans:
            self.nodes[i].wanted = old[i]
        rollback = [functools.partial(self._apply_node, i, old[i]) for i in done]
        rollback += [functools.partial(self._reset_node, i, old[i]) for i in failed]
        again = parallel(rollback)
        for i, exc in zip([*done, *failed], again, strict=True):
            if exc is not None:
                self.nodes[i].broken = f"rollback failed: {exc}"
        reasons = "; ".join(str(e) for e in failed.values())
        raise ShapingError(f"shaping not applied (rolled back {len(done) + len(failed)} nodes): {reasons}")

    def _held(self, index: int) -> NodePlan:
        node = self.nodes[index]
        rules = node.rules.rules if node.rules else ()
        plan = node.wanted or NodePlan(index, node.endpoint.device)
        return dataclasses.replace(plan, tc=node.tc, rules=rules)  # what a backend adds to a plan is kept

    def _needs(self, index: int, plan: NodePlan) -> bool:
        node = self.nodes[index]
        if node.namespace is None:
            return False
        held = node.rules.rules if node.rules else ()
        return node.tc != plan.tc or held != plan.rules or node.broken is not None

    def _apply_node(self, index: int, plan: NodePlan) -> None:
        node = self.nodes[index]
        if node.namespace is None:
            return
        try:
            if node.broken is not None:
                self._teardown(node, node.tc)
                node.broken = None
            steps = tc_diff.diff(node.tc, plan.tc)
            try:
                tc.run_steps(node.namespace, index, steps)
            except tc.TcStepError as exc:
                # what this run may now hold: what it held, plus what it added before the failure
                added = [s.op for s in steps[: exc.done] if s.verb == "add"]
                node.tc = tuple(dict.fromkeys((*node.tc, *added)))
                raise
            node.tc = plan.tc
            node.rules = iptables.sync(node.namespace, self.chains, node.rules, plan.rules, index)
        except NamespaceGone as exc:
            logger.warning("node %d: namespace gone, skipped until replace_endpoint: %s", index, exc)
            self._forget(node)

    def _reset_node(self, index: int, old: NodePlan) -> None:
        """After a failure half-way: tear down what this run may hold there (never more), rebuild ``old``."""
        node = self.nodes[index]
        if node.namespace is None:
            return
        try:
            self._teardown(node, node.tc)
            tc.run_steps(node.namespace, index, [tc_diff.TcStep("add", op) for op in old.tc])
            node.tc = old.tc
            node.rules = iptables.sync(node.namespace, self.chains, node.rules, old.rules, index)
        except NamespaceGone:
            self._forget(node)

    def _teardown(self, node: NodeState, ops: Sequence[TcOp]) -> None:
        assert node.namespace is not None
        unique = tuple(dict.fromkeys(ops))
        tc.run_steps(node.namespace, node.endpoint.index, tc_diff.teardown(unique), missing_ok=True)
        node.tc = ()

    def _forget(self, node: NodeState) -> None:
        node.namespace = None
        node.tc = ()
        node.rules = None

    # -- clear, replace, check --------------------------------------------------------------------
    def clear(self) -> None:
        """Remove every tc object and rule this run added; raise after trying every node."""
        errors = [e for e in parallel([functools.partial(self._clear_node, i) for i in self.nodes]) if e is not None]
        if errors:
            raise ShapingError("clear left things behind: " + "; ".join(map(str, errors)))

    def _clear_node(self, index: int) -> None:
        node = self.nodes[index]
        node.wanted = None
        if node.namespace is None:
            return
        try:
            self._teardown(node, node.tc)
            iptables.remove(node.namespace, self.chains, node.rules, index)
            node.rules = None
            node.broken = None
        except NamespaceGone:
            self._forget(node)

    def replace(self, endpoint: Endpoint) -> None:
        """A node restarted: forget its old namespace (best-effort cleanup) and apply its plan in the new one."""
        node = self.nodes.get(endpoint.index)
        if node is None:
            raise ShapingError(f"node {endpoint.index} is not one of this shaper's endpoints")
        fresh = Namespace(endpoint.netns)
        if node.namespace is not None and node.namespace.identity == fresh.identity:
            node.endpoint = endpoint  # same namespace: only re-apply below
        else:
            wanted = node.wanted
            if node.namespace is not None and node.namespace.alive():
                try:
                    self._clear_node(endpoint.index)
                except ShapingError as exc:
                    logger.warning("node %d: cleaning its old namespace: %s", endpoint.index, exc)
            self.nodes[endpoint.index] = node = NodeState(endpoint, fresh, wanted=wanted)
        if node.wanted is not None:
            self.apply({endpoint.index: node.wanted})

    def elsewhere(self, endpoint: Endpoint) -> None:
        """This node's namespace is on another host: keep its plan, never enter it (until :meth:`replace`).

        The same state as a namespace that is gone; ``endpoint`` records where it is now (its address
        is what the other nodes' plans use).
        """
        node = self.nodes.get(endpoint.index)
        if node is None:
            raise ShapingError(f"node {endpoint.index} is not one of this shaper's endpoints")
        node.endpoint = endpoint
        self._forget(node)

    def check(self) -> None:
        """Raise if a node is in an unknown state after a failed rollback."""
        broken = {i: n.broken for i, n in self.nodes.items() if n.broken}
        if broken:
            raise ShapingError(f"nodes in an unknown shaping state: {broken}")

    def ifindexes(self, index: int, devices: Sequence[str]) -> dict[str, int]:
        """Interface index of each of ``devices`` in node ``index``'s namespace (for pre-encoded changes)."""
        node = self.nodes[index]
        if node.namespace is None or not devices:
            return {}
        with tc.TcSession(node.namespace, index) as session:
            return {device: session.index(device) for device in devices}

    def settle(self, plans: Mapping[int, NodePlan]) -> None:
        """The kernel now holds ``plans`` (changed in place by someone else, e.g. the change executor)."""
        for i, plan in plans.items():
            node = self.nodes[i]
            node.wanted = plan
            if node.namespace is not None:
                node.tc = plan.tc

    def live(self) -> list[int]:
        """Nodes whose namespace is known and still there."""
        return [i for i, n in self.nodes.items() if n.namespace is not None]
