"""The link state a profile asks for at one moment: :func:`state_at` (pure).

``links`` and ``node_links`` come from the profile's base links and the phase in force at ``at``,
``nat`` from its base links (a node's NAT holds for the whole run).
``blocked`` replays the churn events that happened up to and including ``at``, in their order:

* ``link_down`` cuts its directed links, ``link_up`` restores them;
* ``partition`` cuts every directed link between different groups; a later ``partition`` replaces
  the earlier one (the world is split the new way), ``heal`` ends it;
* a cut from ``link_down`` and one from a partition are independent: healing the partition does
  not restore a link that is down, and ``link_up`` does not cross a partition.

Node churn (kill, pause, restart) is the cluster's business and changes no link.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from squall.profiles import ChurnEvent, ChurnKind, NodeLinkSpec, Profile
from squall.shaping.base import LinkState
from squall.shaping.planning.changes import TimedState

LINK_KINDS = frozenset({ChurnKind.LINK_DOWN, ChurnKind.LINK_UP, ChurnKind.PARTITION, ChurnKind.HEAL})

Pair = tuple[int, int]


def state_at(profile: Profile, n: int, at: float) -> LinkState:
    """Everything that should hold on the links of an n-node cluster ``at`` seconds into the run."""
    if n < 1:
        raise ValueError(f"a cluster needs at least one node, got n={n}")
    if not math.isfinite(at) or at < 0:
        raise ValueError(f"'at' must be a finite time >= 0, got {at!r}")
    links = profile.links(n, at)
    caps = {node: profile.node_link(node, n, at) for node in range(n)}
    node_links = {node: spec for node, spec in caps.items() if spec != NodeLinkSpec()}
    events = profile.churn_events(n, duration=math.nextafter(at, math.inf))  # every event with at_s <= at
    return LinkState(links=links, node_links=node_links, blocked=blocked_after(events), nat=profile.nat_sites(n))


def blocked_after(events: Iterable[ChurnEvent]) -> frozenset[Pair]:
    """Directed links cut once ``events`` (in time order) have happened."""
    down: set[Pair] = set()
    split: frozenset[Pair] = frozenset()
    for event in events:
        if event.kind == ChurnKind.LINK_DOWN:
            down.update(event.links)
        elif event.kind == ChurnKind.LINK_UP:
            down.difference_update(event.links)
        elif event.kind == ChurnKind.PARTITION:
            split = partition_pairs(event.groups)
        elif event.kind == ChurnKind.HEAL:
            split = frozenset()
    return frozenset(down) | split


def partition_pairs(groups: Iterable[Iterable[int]]) -> frozenset[Pair]:
    """Every directed pair of nodes that sit in different groups."""
    member = {node: g for g, group in enumerate(groups) for node in group}
    return frozenset((a, b) for a in member for b in member if member[a] != member[b])


def change_labels(profile: Profile, n: int, duration: float) -> dict[float, list[str]]:
    """What may change the links at each time in ``(0, duration)``: phases, trace rows, link churn."""
    labels: defaultdict[float, list[str]] = defaultdict(list)
    for index, phase in enumerate(profile.phases):
        if 0 < phase.at_s < duration:
            labels[phase.at_s].append(f"phase {phase.name or index}")
    for scope in profile.traced_scopes():
        end = duration if scope.end_us is None else min(duration, scope.end_us / 1e6)
        for t_us in scope.trace.change_times_us(round(end * 1e6) - scope.start_us):
            at = (scope.start_us + t_us) / 1e6
            if 0 < at < duration:
                labels[at].append(f"trace {scope.patch.origin.key}")
    for event in profile.churn_events(n, duration):
        if event.kind in LINK_KINDS and 0 < event.at_s < duration:
            labels[event.at_s].append(f"{event.kind.value} ({event.origin})" if event.origin else event.kind.value)
    return dict(labels)


def link_timeline(profile: Profile, n: int, duration: float) -> list[TimedState]:
    """Every link state of a run of ``duration`` seconds: the one at 0, then one per change that
    changes something (phases, trace rows, link churn), in time order. Pure."""
    timeline = [TimedState(0.0, "start", state_at(profile, n, 0.0))]
    for at, labels in sorted(change_labels(profile, n, duration).items()):
        state = state_at(profile, n, at)
        if state != timeline[-1].state:
            timeline.append(TimedState(at, "; ".join(labels), state))
    return timeline
