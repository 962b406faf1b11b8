"""The one interface every shaping backend implements, and the values that cross it.

The harness hands a backend the cluster's endpoints once, then a :class:`LinkState` per change
(initial application, each profile phase, each matrix cell, each churn event that touches links).
A backend turns a state into kernel operations through a pure plan and applies them; ``apply``
always receives the *whole* state, never a delta, so a backend may diff or rebuild as it likes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from squall.profiles import LinkSpec, NodeLinkSpec

if TYPE_CHECKING:  # both import this module
    from squall.shaping.clock.change_run import ChangeRun
    from squall.shaping.planning.changes import TimedState

BACKENDS = ("netem", "nfqueue")

#: A stand-in namespace file whose name starts with this marks an endpoint that runs on another
#: machine (a swarm run's node agent makes one): a multi-host shaper enters nothing there, and the
#: nfqueue backend finds no bridge for it and holds no packet for it.
ELSEWHERE_PREFIX = "squall-elsewhere-"


def elsewhere(netns: str) -> bool:
    """Whether an endpoint's namespace path is the stand-in for one on another machine."""
    return Path(netns).name.startswith(ELSEWHERE_PREFIX)


class ShapingError(RuntimeError):
    """Shaping could not be applied, changed or cleared, or a backend's helper died; says why."""


@dataclass(frozen=True)
class Endpoint:
    """One container as the shaping layer sees it."""

    index: int  # node index, 0..n-1
    address: str  # data-plane IPv4 address
    netns: str  # network namespace path, e.g. /proc/<pid>/ns/net
    device: str = "eth0"  # the data-plane interface inside the namespace


@dataclass(frozen=True)
class LinkState:
    """Everything that should hold on the links of an n-node cluster at one moment."""

    links: Mapping[tuple[int, int], LinkSpec]  # every ordered pair (src, dst), src != dst
    node_links: Mapping[int, NodeLinkSpec] = field(default_factory=dict)  # shared up/downlink caps
    blocked: frozenset[tuple[int, int]] = frozenset()  # directed pairs cut (link down, partition)
    nat: tuple[tuple[int, ...], ...] = ()  # NAT sites: the nodes behind each NAT (disjoint); others are reachable

    def site_of(self, node: int) -> int | None:
        """The index of the NAT site ``node`` is behind, None when it is behind none."""
        return next((k for k, site in enumerate(self.nat) if node in site), None)

    def reachable(self, src: int, dst: int) -> bool:
        """Whether ``src`` may open a connection to ``dst`` (TCP or UDP): ``dst`` is behind no NAT, or
        behind the same one as ``src``. Replies to connections ``dst`` opened always reach it."""
        site = self.site_of(dst)
        return site is None or src in self.nat[site]


@dataclass(frozen=True)
class LinkCount:
    """What one directed link carried, counted in the kernel."""

    bytes: int = 0  # IP bytes (headers included, no link-layer header) the sender put on the link
    packets: int = 0  # packets (a segmentation-offload packet counts once in the nfqueue backend)
    dropped: int = 0  # packets the emulated link dropped (loss, a full queue)

    def __add__(self, other: LinkCount) -> LinkCount:
        return LinkCount(self.bytes + other.bytes, self.packets + other.packets, self.dropped + other.dropped)

    def __sub__(self, other: LinkCount) -> LinkCount:
        return LinkCount(max(0, self.bytes - other.bytes), max(0, self.packets - other.packets),
                         max(0, self.dropped - other.dropped))


@dataclass(frozen=True)
class LinkCounters:
    """Every directed link's count since the shaper opened (monotone: a backend keeps what it counted
    before it rebuilt its rules or a node restarted); the difference of two readings is what a run carried."""

    links: Mapping[tuple[int, int], LinkCount] = field(default_factory=dict)  # (src, dst) -> count

    def __sub__(self, before: LinkCounters) -> LinkCounters:
        return LinkCounters({k: v - before.links.get(k, LinkCount()) for k, v in self.links.items()})

    def __add__(self, other: LinkCounters) -> LinkCounters:
        keys = set(self.links) | set(other.links)
        return LinkCounters({k: self.links.get(k, LinkCount()) + other.links.get(k, LinkCount()) for k in keys})

    def sent(self, node: int) -> int:
        """Bytes ``node`` sent to every other node."""
        return sum(c.bytes for (src, _), c in self.links.items() if src == node)

    def received(self, node: int) -> int:
        """Bytes every other node sent to ``node``."""
        return sum(c.bytes for (_, dst), c in self.links.items() if dst == node)


@runtime_checkable
class Shaper(Protocol):
    """A shaping backend bound to one cluster's endpoints."""

    backend: str  # "netem" or "nfqueue": recorded in every result

    def apply(self, state: LinkState) -> None:
        """Make the links behave as ``state`` says (first time or a change); all or nothing."""

    def clear(self) -> None:
        """Remove every qdisc, filter, rule and queue this shaper added; leave namespaces as found."""

    def replace_endpoint(self, endpoint: Endpoint) -> None:
        """A node restarted with a new namespace: re-apply its part of the current state there."""

    def check(self) -> None:
        """Raise :class:`ShapingError` when shaping silently stopped (e.g. the nfqueue daemon died)."""

    def counters(self) -> LinkCounters:
        """Bytes, packets and drops of every directed link between endpoints, counted in the kernel
        since the shaper opened (see :class:`LinkCounters`); cheap enough to read every second."""

    def close(self) -> None:
        """:meth:`clear`, then stop helpers; safe to call twice."""


@runtime_checkable
class SchedulingShaper(Shaper, Protocol):
    """A shaper that applies a whole run's link changes in place, from a real-time executor.

    ``schedule`` plans every state of ``timeline`` (:class:`squall.shaping.planning.changes.TimedState`, the
    first at 0) on one tree, applies the first now and returns a
    :class:`squall.shaping.clock.change_run.ChangeRun`; ``go(start)`` starts the clock, ``finish()`` returns
    when each change was done. It raises :class:`squall.shaping.planning.changes.NotInPlace` when the
    timeline cannot be applied by changes alone.
    """

    def schedule(self, timeline: Sequence[TimedState]) -> ChangeRun:
        """Plan, apply the first state, return the prepared run."""


@runtime_checkable
class MultiHostShaper(Shaper, Protocol):
    """A shaper that can be one of several, one per host of a multi-host run (a swarm's node agents).

    It is opened on every endpoint of the run, since its plan needs every address, but only some
    endpoints' namespaces are on its host; :meth:`place` names the others. An endpoint elsewhere is
    planned and never entered, as a namespace that is gone is, until :meth:`replace_endpoint` brings
    one to this host.
    """

    def place(self, elsewhere: Collection[int]) -> None:
        """The endpoints ``elsewhere`` run on other hosts: shape nothing in their namespaces here."""

    def replace_elsewhere(self, endpoint: Endpoint) -> None:
        """An endpoint on another host restarted: take its new address, still enter nothing of it."""


@runtime_checkable
class HostLeftover(Protocol):
    """What a shaper of one run keeps on the host outside the containers, found after the run is gone.

    ``squall gc`` lists them with :func:`squall.shaping.select.host_leftovers` and removes those of
    dead runs; it judges a run by its id and by the owner recorded here (pid and start time).
    """

    @property
    def backend(self) -> str:
        """The backend that left it."""

    @property
    def run_id(self) -> str:
        """The run its shaper belonged to."""

    @property
    def workdir(self) -> Path:
        """The shaper's work directory on the host (it may be gone while a helper process lives)."""

    @property
    def owner_pid(self) -> int | None:
        """Pid of the process that owned the shaper; None when unrecorded."""

    @property
    def owner_start(self) -> float | None:
        """That process's start time (``psutil`` ``create_time``)."""

    @property
    def daemons(self) -> tuple[int, ...]:
        """Pids of the helper processes still running for it."""

    def remove(self) -> list[str]:
        """Stop the helpers and remove everything; return what could not be removed, with why."""
