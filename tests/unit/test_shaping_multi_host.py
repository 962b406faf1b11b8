"""One host's shaper of several (squall.shaping.base.MultiHostShaper): what ``place`` and
``replace_elsewhere`` do to the plan, without touching a kernel (an endpoint elsewhere is never
entered, and nothing here applies a state). The nfqueue shaper's side, which starts its daemon,
runs in the two-node swarm test (tests/integration/test_cluster_swarm_two_nodes.py)."""

from __future__ import annotations

import pytest

from squall.cluster.swarm.node_agent import IdleShaper, _multi_host
from squall.shaping.base import Endpoint, LinkCounters, LinkState, MultiHostShaper, ShapingError
from squall.shaping.netem.backend import NetemShaper
from squall.shaping.nfqueue.backend import NfqueueShaper

HERE = "/proc/self/ns/net"  # any namespace that exists: nothing is entered in these tests


def _endpoints(n: int) -> list[Endpoint]:
    return [Endpoint(i, f"10.9.0.{i + 2}", HERE) for i in range(n)]


def test_the_kernel_backends_and_the_idle_shaper_can_be_one_host_of_several() -> None:
    kinds: list[type[MultiHostShaper]] = [NetemShaper, NfqueueShaper, IdleShaper]  # mypy checks the protocol
    for kind in kinds:
        assert callable(getattr(kind, "place", None)) and callable(getattr(kind, "replace_elsewhere", None)), kind
    assert isinstance(IdleShaper("netem"), MultiHostShaper)


def test_endpoints_elsewhere_are_planned_but_never_entered() -> None:
    shaper = NetemShaper(_endpoints(4), run_id="t-multi-host")
    shaper.place([1, 3])
    assert shaper._applier.live() == [0, 2]  # only these namespaces would be entered
    moved = Endpoint(1, "10.9.0.42", "/nonexistent/elsewhere")
    shaper.replace_elsewhere(moved)  # no state applied yet: only the record changes
    assert shaper._applier.live() == [0, 2]
    assert shaper._applier.nodes[1].endpoint == moved
    with pytest.raises(ShapingError, match="node 7 is not one of"):
        shaper.place([7])
    with pytest.raises(ShapingError, match="node 9 is not one of"):
        shaper.replace_elsewhere(Endpoint(9, "10.9.0.99", HERE))
    shaper.close()
    with pytest.raises(ShapingError, match="closed"):
        shaper.place([0])


def test_an_idle_node_ignores_the_others_but_refuses_a_worker_of_its_own() -> None:
    idle = IdleShaper("nfqueue")
    idle.place([0, 1])
    idle.replace_elsewhere(Endpoint(0, "10.9.0.2", "/nonexistent/elsewhere"))  # a restart on another node
    with pytest.raises(ShapingError, match="opened no shaper"):
        idle.replace_endpoint(Endpoint(0, "10.9.0.2", HERE))


class _SingleHost:
    """A shaper with the plain interface only."""

    backend = "single"

    def apply(self, state: LinkState) -> None: ...
    def clear(self) -> None: ...
    def replace_endpoint(self, endpoint: Endpoint) -> None: ...
    def check(self) -> None: ...
    def counters(self) -> LinkCounters: return LinkCounters()
    def close(self) -> None: ...


def test_a_backend_that_cannot_be_one_of_several_is_refused() -> None:
    with pytest.raises(ShapingError, match="the single shaper cannot leave endpoints on other nodes alone"):
        _multi_host(_SingleHost())
