"""The nfqueue backend: for kernels without ``sch_netem`` (this one, WSL2, several clouds).

Who does what (plan: :func:`.plan.plan_nfqueue`):

* rates, uplink and downlink caps: HTB (kernel), like the netem backend;
* delay, jitter, loss, reordering: the delay daemon (:mod:`.daemon`), one process for the run;
* duplication: iptables TEE; cut links: iptables DROP (:mod:`squall.shaping.kernel.iptables`).

Where packets wait. Not in the receiver (its kernel would stamp a packet before the wait, so
``ping`` and receive timestamps would see one direction's delay only) but on the bridge between
the namespaces (:mod:`.hold_plan`): each queue of the plan (a directed link the daemon shapes)
becomes one NFQUEUE rule in the run's chain in the bridge's namespace, queue
``base + receiver * n + source`` of a block no one else has bound. DROP and TEE rules are in the
containers.

Life cycle. The daemon starts with the shaper and binds the run's whole queue block at once, under
the host lock that also guards the choice of block (:func:`.nfqueue.hold.host_lock`), so a missing
capability fails :func:`open_shaper`, not the first run. Binding a queue that no rule feeds costs
nothing, and it means a change never has to rebind: :meth:`apply` sends ``set_links`` for the
parameters that changed (one request for the whole cluster), then rewrites the hold chain and the
containers' rules. Parameters are set before the rules, so the first packet a new rule queues
already gets its delay. :meth:`clear` removes rules and tc objects; :meth:`close` also stops the
daemon (which unbinds the queues) and puts the bridge sysctl back if it changed it.

Failure. The rules carry ``--queue-bypass``, so a dead daemon means packets pass *unshaped*;
:meth:`check` (and every :meth:`apply`) raises :class:`ShapingError` as soon as the daemon's
lifeline closes, so a run is never reported as shaped when it was not.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from squall.shaping.base import Endpoint, LinkCount, LinkCounters, LinkState, ShapingError
from squall.shaping.clock.change_run import ChangeRun, netlink_batches
from squall.shaping.clock.sender import Applied, Schedule
from squall.shaping.kernel.applier import Applier, endpoint_of, locked
from squall.shaping.kernel.netns import same_namespace
from squall.shaping.planning.changes import Keep, TimedState, pairs_ever, plan_in_place
from squall.shaping.planning.shared_plan import validated

from . import hold, hold_plan
from .config import DaemonConfig, LinkParams, NamespaceSpec, QueueSpec, to_jsonable
from .errors import NfqueueError
from .hold_plan import HoldRule, QueueBlock
from .launcher import DaemonProcess
from .leftovers import make_workdir
from .plan import NfqueuePlan, delays_in_daemon, link_params, plan_nfqueue

logger = logging.getLogger(__name__)

LinkKey = tuple[int, int]  # (receiving node, sending node)


def namespace_name(index: int) -> str:
    """The daemon's name for the queues that deliver to node ``index``."""
    return f"node{index}"


def queue_seed(receiver: int, source: int) -> int:
    """Seed of one link's random draws: the same link gets the same decisions in every run."""
    return receiver << 16 | source


def hold_rules(plans: dict[int, NfqueuePlan], endpoints: dict[int, Endpoint], block: QueueBlock) -> list[HoldRule]:
    """The bridge rules: one per directed link, to its queue where the daemon shapes it, else counting only."""
    rules = []
    for index in sorted(endpoints):
        queued = {q.source for q in plans[index].queues} if index in plans else set()
        for source in sorted(endpoints):
            if source != index:
                queue = block.queue(index, source) if source in queued else None
                rules.append(HoldRule(endpoints[source].address, endpoints[index].address, queue))
    return rules


class NfqueueShaper:
    """Shapes a cluster's links with HTB, iptables and the NFQUEUE delay daemon."""

    backend = "nfqueue"

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        run_id: str,
        realtime: int = 10,
        cpu: int | None = None,
        log_level: str = "WARNING",
    ):
        """Find the bridge, start the daemon with the run's queues bound; raise :class:`ShapingError` if it cannot.

        :param realtime: SCHED_FIFO priority of the daemon (0: normal scheduling); see the launcher.
        :param cpu: pin the daemon to this CPU.
        """
        validated(endpoints, LinkState({}))
        self.run_id = run_id
        self._endpoints = {ep.index: ep for ep in endpoints}
        chain = hold_plan.chain_name(run_id) if _valid_run(run_id) else None
        if chain is None:
            raise ShapingError(f"run id {run_id!r}: allowed: [A-Za-z0-9_.-], at most "
                               f"{hold_plan.MAX_CHAIN - len(hold_plan.CHAIN_PREFIX) - len(hold_plan.CHAIN_SUFFIX)} "
                               "characters (iptables chain names)")
        self._netns = hold.bridge_namespace(endpoints)
        self._applier = Applier(endpoints, run_id)
        self._hold = hold.HoldRules(self._netns, run_id)
        self._sysctl = hold.BridgeNetfilter(self._netns)
        self._links: dict[LinkKey, LinkParams] = {}  # what the daemon was last told
        self._state: LinkState | None = None
        self._closed = False
        self._lock = threading.RLock()  # one change at a time (e.g. a churn thread and a phase change)
        self._workdir = make_workdir(run_id)  # named by run id, owner recorded: 'squall gc' finds it
        self._nodes = max(2, max(self._endpoints) + 1)
        self._block: QueueBlock | None = None  # while the run's queues are bound
        self._drops_carried: dict[tuple[int, int], int] = {}  # (src, dst) -> drops of queues since unbound
        try:
            with hold.host_lock():
                self._sysctl.ensure()
            config = DaemonConfig(control_socket=f"{self._workdir}/ctl.sock")
            self._daemon = DaemonProcess.start(config, realtime=realtime, cpu=cpu, log_level=log_level,
                                               workdir=self._workdir)
        except (NfqueueError, ShapingError) as exc:
            with hold.host_lock():
                self._sysctl.restore()
            shutil.rmtree(self._workdir, ignore_errors=True)
            raise ShapingError(f"cannot start the nfqueue delay daemon: {exc}") from exc
        logger.info("nfqueue backend for run %s: daemon pid %d, packets wait in %s", run_id,
                    self._daemon.popen.pid, self._netns)

    def _bind(self) -> QueueBlock:
        """Reserve a block of queue numbers nobody uses and bind it, perfect links (under the host lock)."""
        if self._block is not None:
            return self._block
        with hold.host_lock():
            block = QueueBlock(hold_plan.choose_base(self._nodes, hold.taken_queues(self._netns)), self._nodes)
            bound: list[int] = []
            try:
                with self._daemon.client() as client:
                    for index, spec in zip(sorted(self._endpoints), self._specs(block), strict=True):
                        client.add_namespace(spec)
                        bound.append(index)
            except NfqueueError as exc:
                self._unbind(bound)
                raise ShapingError(f"the daemon cannot bind queues {block.base}-{block.numbers()[-1]} in "
                                   f"{self._netns}: {exc}") from exc
        self._block = block
        self._links = {(i, s): LinkParams() for i in self._endpoints for s in self._endpoints if s != i}
        logger.info("nfqueue run %s: queues %d-%d bound", self.run_id, block.base, block.numbers()[-1])
        return block

    def _unbind(self, nodes: Sequence[int]) -> str | None:
        """Unbind the given receivers' queues; return what went wrong, if anything."""
        if not nodes or not self._daemon.is_alive():
            return None
        try:
            with self._daemon.client() as client:
                for index in nodes:
                    client.remove_namespace(namespace_name(index))
        except NfqueueError as exc:
            return f"unbinding queues: {exc}"
        return None

    def _specs(self, block: QueueBlock) -> list[NamespaceSpec]:
        """Per receiver, its queues (one per source peer) in the bridge's namespace, perfect links."""
        return [
            NamespaceSpec(
                name=namespace_name(index),
                netns=self._netns,
                queues=tuple(
                    QueueSpec(queue=block.queue(index, src.index), seed=queue_seed(index, src.index),
                              source=src.address)
                    for src in self._endpoints.values()
                    if src.index != index
                ),
            )
            for index in sorted(self._endpoints)
        ]

    # -- Shaper interface -------------------------------------------------------------------------
    @locked
    def apply(self, state: LinkState) -> None:
        """Make the links behave as ``state`` says; all or nothing."""
        self._require_open()
        self.check()
        self._apply_plans(state, plan_nfqueue(list(self._endpoints.values()), state))

    def _apply_plans(self, state: LinkState, plans: dict[int, NfqueuePlan]) -> None:
        t0 = time.monotonic()
        block = self._bind()
        before = dict(self._links)
        held = self._hold.rules
        self._set_links(self._wanted_links(plans))
        try:
            with hold.host_lock():
                self._hold.sync(hold_rules(plans, self._endpoints, block))
            self._applier.apply(plans)
        except ShapingError:
            with hold.host_lock():
                self._hold.sync(held)
            self._set_links(before)
            raise
        self._state = state
        logger.info("nfqueue: applied %d links on %d nodes in %.1f ms", len(state.links), len(plans),
                    (time.monotonic() - t0) * 1e3)

    @locked
    def schedule(self, timeline: Sequence[TimedState]) -> ChangeRun:
        """Plan every change of a run in place and apply the first state now; the rest are handed to
        the delay daemon (already SCHED_FIFO) once :meth:`ChangeRun.go` is called: at each due time
        it sets the links' parameters and sends the HTB changes it was given in advance.

        :raises NotInPlace: when the timeline would change the shape of the tree or the hold rules.
        """
        self._require_open()
        self.check()
        eps = list(self._endpoints.values())
        keep = Keep(leaves=pairs_ever(timeline, lambda spec: spec.rate_bps is not None),
                    queues=pairs_ever(timeline, lambda spec: delays_in_daemon(link_params(spec))))

        def planner(state: LinkState, kept: Keep) -> dict[int, NfqueuePlan]:
            return plan_nfqueue(eps, state, leaves=kept.leaves, queues=kept.queues)

        planned = plan_in_place(timeline, planner, keep)
        self._apply_plans(timeline[0].state, dict(planned[0].plans))
        block = self._bind()
        namespaces, batches = netlink_batches(planned, self._applier)
        wanted = [self._wanted_links(dict(change.plans)) for change in planned]
        links: list[list[dict[str, object]]] = [[]]
        for before, after in itertools.pairwise(wanted):
            links.append([{"namespace": namespace_name(rcv), "queue": block.queue(rcv, src),
                           "link": to_jsonable(params)}
                          for (rcv, src), params in sorted(after.items()) if before.get((rcv, src)) != params])

        def launch(schedule: Schedule) -> _DaemonSchedule:
            return _DaemonSchedule(self._daemon, Path(self._workdir), schedule)

        def settle(last: int) -> None:
            with self._lock:
                self._applier.settle(planned[last].plans)
                self._links.update(wanted[last])
                self._state = planned[last].state

        return ChangeRun(planned, namespaces, batches=batches, links=links, launch=launch, settle=settle)

    @locked
    def clear(self) -> None:
        """Remove the hold chain, the containers' rules and tc objects; the namespaces are as found."""
        errors: list[str] = []
        try:
            with hold.host_lock():
                self._hold.remove()
        except ShapingError as exc:
            errors.append(str(exc))
        try:
            self._applier.clear()
        except ShapingError as exc:
            errors.append(str(exc))
        if self._block is not None:
            for key, dropped in self._drops().items():
                self._drops_carried[key] = self._drops_carried.get(key, 0) + dropped
            problem = self._unbind(sorted(self._endpoints))
            errors += [problem] if problem else []
        self._block = None
        self._links.clear()
        self._state = None
        if errors:
            raise ShapingError("; ".join(errors))

    @locked
    def replace_endpoint(self, endpoint: Endpoint) -> None:
        """Node restarted: re-apply its rules and tc in the new namespace (its queues stay on the bridge)."""
        self._require_open()
        self.check()
        old = endpoint_of(self._endpoints, endpoint.index)
        where = hold.bridge_namespace([endpoint])
        if not same_namespace(where, self._netns):
            raise ShapingError(f"node {endpoint.index}: its new veth is on a bridge in {where}, not in {self._netns}")
        self._endpoints[endpoint.index] = endpoint
        validated(list(self._endpoints.values()), LinkState({}))
        if self._hold.receivers is not None:  # one host of several: the bridge here holds this receiver now
            self._hold.receivers = (self._hold.receivers - {old.address}) | {endpoint.address}
        self._applier.replace(endpoint)
        if self._state is not None and old.address != endpoint.address:
            self.apply(self._state)

    @locked
    def place(self, elsewhere: Collection[int]) -> None:
        """The endpoints ``elsewhere`` run on other hosts (see :class:`~squall.shaping.base.MultiHostShaper`).

        Besides leaving their namespaces alone, the bridge hold here keeps only the rules of this
        host's receivers: a packet between hosts crosses the sender's host's bridge and then the
        receiver's, and held on both it would wait twice. Takes effect at the next :meth:`apply`.
        """
        self._require_open()
        away = set(elsewhere)
        for index in away:
            self._applier.elsewhere(endpoint_of(self._endpoints, index))
        self._hold.receivers = frozenset(ep.address for i, ep in self._endpoints.items() if i not in away)

    @locked
    def replace_elsewhere(self, endpoint: Endpoint) -> None:
        """An endpoint on another host restarted: nothing changes here while its address stays.

        Its own host re-applies its namespace. A new address would change the hold plan of this
        host's receivers for an endpoint whose bridge is not here: refused rather than half-applied.
        """
        self._require_open()
        if endpoint_of(self._endpoints, endpoint.index).address != endpoint.address:
            raise ShapingError(f"worker {endpoint.index} on another host came back with a new address "
                               f"{endpoint.address}; the nfqueue shaper here cannot re-plan for it (reopen it)")

    def check(self) -> None:
        """Raise :class:`ShapingError` if the daemon died (links unshaped) or a node is in an unknown state."""
        if self._closed:
            return
        try:
            self._daemon.check()
        except NfqueueError as exc:
            raise ShapingError(str(exc)) from exc
        self._applier.check()

    @locked
    def counters(self) -> LinkCounters:
        """Every directed link's bytes and packets (the bridge rules' counters) and drops (the daemon's).

        The rules count a packet as it reaches the bridge, before the daemon holds or drops it: bytes
        from the IP header on, a segmentation-offload packet once. Links whose endpoints are on
        another host (a swarm run) are counted by that host's shaper.
        """
        by_address = {ep.address: i for i, ep in self._endpoints.items()}
        links: dict[tuple[int, int], LinkCount] = {}
        for (src, dst), (packets, size) in self._hold.counts().items():
            if src in by_address and dst in by_address:
                key = (by_address[src], by_address[dst])
                links[key] = links.get(key, LinkCount()) + LinkCount(size, packets)
        drops = dict(self._drops_carried)
        if self._block is not None and not self._closed:
            for key, dropped in self._drops().items():
                drops[key] = drops.get(key, 0) + dropped
        for key, dropped in drops.items():
            links[key] = links.get(key, LinkCount()) + LinkCount(dropped=dropped)
        return LinkCounters(links)

    def _drops(self) -> dict[tuple[int, int], int]:
        """(src, dst) -> packets the daemon dropped (loss) plus those the kernel's queue dropped (full)."""
        if not self._daemon.is_alive():
            return {}
        try:
            with self._daemon.client() as client:
                stats = client.stats()
        except NfqueueError as exc:
            raise ShapingError(f"nfqueue daemon stats: {exc}") from exc
        by_name = {namespace_name(i): i for i in self._endpoints}
        by_address = {ep.address: i for i, ep in self._endpoints.items()}
        out: dict[tuple[int, int], int] = {}
        for q in stats.get("queues", []):
            dst, src = by_name.get(q.get("namespace")), by_address.get(q.get("source"))
            if dst is None or src is None:
                continue
            kernel = q.get("kernel") or {}
            out[(src, dst)] = int(q.get("dropped", 0)) + int(kernel.get("queue_dropped", 0)) \
                + int(kernel.get("user_dropped", 0))
        return out

    @locked
    def close(self) -> None:
        """Clear, stop the daemon, put the bridge sysctl back, remove its files; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self.clear()
        finally:
            self._daemon.close()
            try:
                with hold.host_lock():
                    self._sysctl.restore()
            finally:
                if self._hold.installed:  # the work directory is how 'squall gc' finds the chain
                    logger.warning("nfqueue run %s: hold chain %s left in %s for 'squall gc'", self.run_id,
                                   self._hold.chain, self._netns)
                else:
                    shutil.rmtree(self._workdir, ignore_errors=True)
                logger.info("nfqueue backend for run %s closed", self.run_id)

    # -- helpers ----------------------------------------------------------------------------------
    @property
    def daemon(self) -> DaemonProcess:
        """The delay daemon (for statistics and tests)."""
        return self._daemon

    @property
    def hold_namespace(self) -> str:
        """The namespace of the bridge where packets wait."""
        return self._netns

    @property
    def queues(self) -> QueueBlock | None:
        """The run's block of queue numbers in :attr:`hold_namespace` (None while nothing is bound)."""
        return self._block

    def _require_open(self) -> None:
        if self._closed:
            raise ShapingError(f"the nfqueue shaper of run {self.run_id} is closed")

    def _wanted_links(self, plans: dict[int, NfqueuePlan]) -> dict[LinkKey, LinkParams]:
        """Every link: the plan's parameters, or a perfect link where no rule feeds its queue."""
        wanted = {key: LinkParams() for key in self._links}
        for index, plan in plans.items():
            wanted.update({(index, q.source): q.params for q in plan.queues})
        return wanted

    def _set_links(self, links: dict[LinkKey, LinkParams]) -> None:
        changed = [(k, v) for k, v in links.items() if self._links.get(k) != v]
        if not changed:
            return
        block = self._bind()
        try:
            with self._daemon.client() as client:
                client.set_links([(namespace_name(rcv), block.queue(rcv, src), params)
                                  for (rcv, src), params in changed])
        except NfqueueError as exc:
            raise ShapingError(f"nfqueue daemon set_links: {exc}") from exc
        self._links.update(changed)


class _DaemonSchedule:
    """A run's schedule held by the delay daemon: loaded now, started with the run, stopped at its end."""

    def __init__(self, daemon: DaemonProcess, workdir: Path, schedule: Schedule) -> None:
        self.daemon = daemon
        self.path = workdir / f"schedule-{time.monotonic_ns()}.json"
        self.path.write_text(schedule.to_json())
        try:
            with daemon.client() as client:
                client.schedule(str(self.path))
        except NfqueueError as exc:
            self.path.unlink(missing_ok=True)
            raise ShapingError(f"the delay daemon refused the schedule: {exc}") from exc

    def go(self, start_ns: int) -> None:
        try:
            with self.daemon.client() as client:
                client.schedule_go(start_ns)
        except NfqueueError as exc:
            raise ShapingError(f"the delay daemon did not start the schedule: {exc}") from exc

    def stop(self) -> list[Applied]:
        try:
            with self.daemon.client() as client:
                return [Applied.from_dict(item) for item in client.schedule_stop()]
        except NfqueueError as exc:
            logger.warning("nfqueue: stopping the schedule: %s", exc)
            return []
        finally:
            self.path.unlink(missing_ok=True)


def _valid_run(run_id: str) -> bool:
    try:
        hold_plan.chain_name(run_id)
    except NfqueueError:
        return False
    return True
