"""The Profile: one emulated world (links, phases, churn, devices), resolved for a cluster of n nodes.

Phases are **not cumulative**: from its ``at`` until the next phase starts, a phase's ``links`` are
applied on top of the base ``links`` (every key a phase sets for a link wins over whatever the base
says for it, whatever scope either came from); the previous phase no longer counts. A phase with no
``links`` returns to the base.

A link scope may replay a trace (:mod:`.traces`): its row in force sets the trace's columns, scope
by scope like any other key. A trace in the base links counts from the start of the run, one in a
phase from the start of that phase; every row start is a change time (:meth:`Profile.change_times`).
"""

from __future__ import annotations

import bisect
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from squall.profiles.churn import REFERENCE_RUN_S, ChurnPlan
from squall.profiles.devices import DeviceModel
from squall.profiles.errors import Origin
from squall.profiles.link_traces import Trace
from squall.profiles.links import NAT_KEY, OWN_NAT, LinkPatch, LinkRules
from squall.profiles.model import ChurnEvent, DeviceSpec, LinkSpec, NodeLinkSpec
from squall.profiles.regions import RegionSet
from squall.profiles.resolve import Resolver, check_link, check_node_rules
from squall.profiles.selectors import NodeSelector

logger = logging.getLogger(__name__)

_SHOWN_LINKS = 4  # links named in a grouped warning


@dataclass(frozen=True)
class Phase:
    """Link settings that hold from one time on, until the next phase."""

    origin: Origin  # phases[i]
    at_us: int  # start, microseconds from the start of the run
    name: str  # optional label ("" when not given)
    links: LinkRules  # applied on top of the base links

    @property
    def at_s(self) -> float:
        """Start in seconds."""
        return self.at_us / 1e6


@dataclass(frozen=True)
class TracedScope:
    """A link section that replays a trace, and when: its trace's row 0 starts at ``start_us``."""

    patch: LinkPatch  # the section (its origin names the scope, e.g. links.between[0])
    start_us: int  # the start of the run (base links) or of the phase
    end_us: int | None  # the start of the next phase, None: the end of the run

    @property
    def trace(self) -> Trace:
        """The section's trace."""
        assert self.patch.trace is not None
        return self.patch.trace


@dataclass(frozen=True)
class WorkerNeed:
    """The smallest cluster a profile's node selectors can be resolved for, and what needs it."""

    workers: int  # n
    what: str  # the term that needs it: "node 99", "part 3/4"; "" when nothing does
    key: str  # where that term was written, e.g. "links.pairs[0].link"
    written: str = ""  # the selector as written there, e.g. "0 -> 99"'s side "99"

    def reason(self) -> str:
        """``node 99 in links.pairs[0].link``."""
        return f"{self.what} in {self.key}" if self.what else "no explicit node"


@dataclass(frozen=True)
class Profile:
    """A network profile read from YAML; see ``netem_profiles/README.md`` for the schema."""

    name: str  # short name, also the file's stem for shipped profiles
    description: str  # one line for listings
    source: str  # the file it was read from, or "<string>"
    min_workers: int  # smallest cluster it is meant for
    regions: RegionSet  # named node groups
    base: LinkRules  # the top-level links
    phases: tuple[Phase, ...]  # later link changes, in time order
    churn: ChurnPlan  # failures in time
    devices: DeviceModel  # compute speed per node

    def phase_at(self, at: float) -> Phase | None:
        """The phase in force at ``at`` seconds, or None while the base holds."""
        index = bisect.bisect_right([phase.at_s for phase in self.phases], at)
        return self.phases[index - 1] if index else None

    def change_times(self, until: float | None = None) -> tuple[float, ...]:
        """Times (seconds) before ``until`` at which link settings may change: phase starts and trace
        rows (a looping trace's every pass). ``until`` None: one pass of every trace."""
        until_us = round(until * 1e6) if until is not None else None
        times = {phase.at_us for phase in self.phases}
        for scope in self.traced_scopes():
            end = scope.end_us
            if end is None:
                end = until_us if until_us is not None else scope.start_us + scope.trace.length_us + 1
            elif until_us is not None:
                end = min(end, until_us)
            times.update(scope.start_us + t for t in scope.trace.change_times_us(end - scope.start_us))
        return tuple(t / 1e6 for t in sorted(times) if t > 0 and (until_us is None or t < until_us))

    def traced_scopes(self) -> list[TracedScope]:
        """Every link section that replays a trace, with the time its trace starts and ends."""
        found = [TracedScope(patch, 0, self.phases[0].at_us if self.phases else None)
                 for patch in self.base.traces()]
        for index, phase in enumerate(self.phases):
            end = self.phases[index + 1].at_us if index + 1 < len(self.phases) else None
            found += [TracedScope(patch, phase.at_us, end) for patch in phase.links.traces()]
        return found

    def link(self, src: int, dst: int, n: int, at: float = 0.0) -> LinkSpec:
        """The effective settings of the directed link src -> dst in a cluster of n, at ``at`` seconds."""
        resolver = self._resolver(src, dst, n, self.phase_at(at), at)
        spec = resolver.build()
        check_link(spec, resolver)
        return spec

    def links(self, n: int, at: float = 0.0) -> dict[tuple[int, int], LinkSpec]:
        """Every ordered pair's link settings in a cluster of n, at ``at`` seconds."""
        return {(src, dst): self.link(src, dst, n, at) for src in range(n) for dst in range(n) if src != dst}

    def explain(self, src: int, dst: int, n: int, at: float = 0.0) -> dict[str, str]:
        """Which key path set each non-default field of the link (LinkSpec field -> key path)."""
        resolver = self._resolver(src, dst, n, self.phase_at(at), at)
        return {field: origin.key for field, origin in resolver.origins.items()}

    def node_link(self, node: int, n: int, at: float = 0.0) -> NodeLinkSpec:
        """The node's shared uplink/downlink rates (from ``links.nodes`` entries, fixed or traced) at ``at``
        seconds; a phase's entry overrides the base's key by key."""
        _check_node(node, n)
        uplink, downlink = None, None
        phase = self.phase_at(at)
        at_us = round(at * 1e6)
        for rules, start_us in ((self.base, 0), (phase.links if phase else None, phase.at_us if phase else 0)):
            for rule in rules.nodes if rules else ():
                if node in rule.nodes.nodes(n):
                    up, down = rule.access_at(at_us - start_us)
                    uplink = up if up is not None else uplink
                    downlink = down if down is not None else downlink
        return NodeLinkSpec(uplink, downlink)

    def nat_sites(self, n: int) -> tuple[tuple[int, ...], ...]:
        """The NAT sites of a cluster of n: the nodes behind each NAT (``links.nodes`` entries with ``nat``),
        each site's nodes sorted, sites in the order of their first node; nodes in no site are reachable."""
        named: dict[str, set[int]] = {}
        sites: list[tuple[int, ...]] = []
        for rule in self.base.nodes:
            members = sorted(rule.nodes.nodes(n))
            if rule.nat == OWN_NAT:
                sites += [(node,) for node in members]
            elif rule.nat is not None:
                named.setdefault(rule.nat, set()).update(members)
        sites += [tuple(sorted(nodes)) for nodes in named.values() if nodes]
        return tuple(sorted(sites))

    def region_of(self, node: int, n: int) -> str | None:
        """The node's region, or None."""
        _check_node(node, n)
        return self.regions.region_of(n).get(node)

    def churn_events(self, n: int, duration: float) -> list[ChurnEvent]:
        """Every churn event before ``duration`` seconds in a cluster of n, sorted by time."""
        return self.churn.expand(n, duration)

    def device(self, node: int, n: int) -> DeviceSpec:
        """How fast ``node`` computes in a cluster of n."""
        _check_node(node, n)
        return self.devices.device(node, n)

    def required_workers(self) -> int:
        """The smallest n this profile can be checked for: min_workers, 2, and every explicit index."""
        return max(self.min_workers, 2, self.worker_need().workers)

    def worker_need(self) -> WorkerNeed:
        """The smallest n every node selector resolves for, and the selector term that needs the most."""
        need = WorkerNeed(1, "", "")
        for selector in self._selectors():
            workers, what = selector.requirement()
            if workers > need.workers:
                need = WorkerNeed(workers, what, selector.origin.key, selector.text)
        return need

    def sizes_to_check(self, defaults: Sequence[int]) -> list[int]:
        """The cluster sizes to validate: the smallest the profile can be used at, then ``defaults`` above it."""
        smallest = self.required_workers()
        return [smallest, *sorted(n for n in set(defaults) if n > smallest)]

    def runnable_for(self, n: int, *, duration_s: float = REFERENCE_RUN_S, engine: str = "local") -> list[str]:
        """:meth:`validate_for`, and what this version of Squall cannot run: ``nat`` is realised by the
        local engine only (its NAT rules live in the containers' namespaces on this machine), so another
        engine refuses it (ProfileError naming the entry) rather than leave the node reachable."""
        warnings = self.validate_for(n, duration_s=duration_s)
        if engine != "local":
            self.refuse_nat(engine)
        return warnings

    def refuse_nat(self, engine: str) -> None:
        """Raise ProfileError at the first ``links.nodes`` entry with ``nat``: ``engine`` does not realise it."""
        for rule in self.base.nodes:
            if rule.nat is not None:
                raise rule.origin.at(NAT_KEY).error(
                    f"the {engine} engine does not put nodes behind NAT (the node would be reachable by every "
                    "peer)", value=rule.nat or True, allowed="the local engine (--engine local), or no nat key")

    def validate_for(self, n: int, *, duration_s: float = REFERENCE_RUN_S) -> list[str]:
        """Check everything that depends on n (random churn for a run of ``duration_s``); raise ProfileError,
        or return (and log) warnings."""
        if n < 1:
            raise ValueError(f"a cluster needs at least one node, got n={n}")
        if n < self.min_workers:
            raise Origin(self.source, "min_workers").error(
                f"the profile needs at least {self.min_workers} workers",
                value=n,
                allowed=f">= {self.min_workers}",
            )
        need = self.worker_need()
        if n < need.workers:
            raise Origin(self.source, need.key).error(
                f"{need.what} is out of range for {n} workers: the profile needs at least {need.workers} "
                f"workers ({need.reason()})",
                value=need.written,
                allowed=f"a cluster of {need.workers} workers or more",
            )
        for selector in self._selectors():
            selector.nodes(n)
        self.regions.region_of(n)
        grouped: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
        classes = self.node_classes(n)
        for phase in (None, *self.phases):
            check_node_rules(phase.links if phase else self.base, n)
            for node in range(n):
                self.node_link(node, n, phase.at_s if phase else 0.0)
        sites = self.nat_sites(n)
        # every combination a run can see: each phase start and each trace row (one pass); one link
        # per pair of node classes, in the order of their first link, so an error names the same
        # link as checking every link in order would; a warning counts all of the pair's links
        for at in (0.0, *self.change_times()):
            for (src, dst), links in _class_pairs(classes):
                resolver = self._resolver(src, dst, n, self.phase_at(at), at)
                spec = resolver.build()
                for warning in check_link(spec, resolver):
                    grouped[warning] += links
        warnings_nat = _nat_warnings(sites, n)
        self.churn.scheduled(n)
        self.churn.check_draws(n, duration_s)
        for node in range(n):
            self.devices.device(node, n)
        warnings = [_grouped(text, [f"{a}->{b}" for a, b in sorted(set(links))]) for text, links in grouped.items()]
        warnings += warnings_nat
        for warning in warnings:
            logger.warning("%s", warning)
        return warnings

    def _resolver(self, src: int, dst: int, n: int, phase: Phase | None, at: float = 0.0) -> Resolver:
        """Accumulate the base links, then the phase's, for one directed link, ``at`` seconds in."""
        _check_node(src, n)
        _check_node(dst, n)
        if src == dst:
            raise ValueError(f"a link needs two different nodes, got {src} -> {dst}")
        at_us = round(at * 1e6)
        resolver = Resolver(src, dst, n)
        resolver.apply_rules(self.base, self.regions, at_us)
        if phase is not None:
            resolver.apply_rules(phase.links, self.regions, at_us - phase.at_us)
        return resolver

    def node_classes(self, n: int) -> list[list[int]]:
        """The nodes of a cluster of n grouped by what the profile can tell apart: nodes in the same
        node selectors and region get the same settings on every link, so validation checks one link
        per pair of classes (62,250 links at 250 workers took seconds; a class pair takes microseconds)."""
        members = [frozenset(selector.nodes(n)) for selector in self._selectors()]
        region_of = self.regions.region_of(n)
        by_signature: dict[tuple[object, ...], list[int]] = {}
        for node in range(n):
            signature = (region_of.get(node), *(node in m for m in members))
            by_signature.setdefault(signature, []).append(node)
        return list(by_signature.values())

    def _selectors(self) -> list[NodeSelector]:
        """Every node selector in the profile."""
        found = [region.nodes for region in self.regions.regions] + self.base.selectors()
        for phase in self.phases:
            found += phase.links.selectors()
        return found + self.churn.selectors() + self.devices.selectors()


def _check_node(node: int, n: int) -> None:
    """Reject a node index outside the cluster (a caller's mistake, not the profile's)."""
    if not 0 <= node < n:
        raise ValueError(f"node {node} is not in a cluster of {n} nodes")


def _nat_warnings(sites: tuple[tuple[int, ...], ...], n: int) -> list[str]:
    """A cluster in which no node accepts connections from outside its site is probably a mistake."""
    behind = {node for site in sites for node in site}
    if len(sites) > 1 and len(behind) == n:
        return [f"every node of {n} is behind NAT, in {len(sites)} sites: no node can open a connection to a "
                "node of another site (only hole punching or a relay outside would join them)"]
    return []


def _class_pairs(classes: list[list[int]]) -> list[tuple[tuple[int, int], list[tuple[int, int]]]]:
    """For each ordered pair of node classes with a link between two different nodes: its first link
    (smallest source, then destination) and all its links; sorted by first link."""
    pairs = []
    for a in classes:
        for b in classes:
            links = [(s, d) for s in a for d in b if s != d]
            if links:
                pairs.append((links[0], links))
    return sorted(pairs, key=lambda pair: pair[0])


def _grouped(text: str, labels: list[str]) -> str:
    """One warning for all the links it applies to."""
    shown = ", ".join(labels[:_SHOWN_LINKS]) + (", ..." if len(labels) > _SHOWN_LINKS else "")
    return f"{text} (on {len(labels)} link{'s' if len(labels) > 1 else ''}: {shown})"
