"""The harness side of the node agents: a client per node, the job relay, and the shaper.

* :class:`NodeLink`: one node's agent (its address on the node's own network and the run token);
* :class:`RelayAgentClient`: a worker's job agent reached through its node's agent, with the
  interface of :class:`~squall.cluster.agent_client.AgentClient`, so jobs run exactly as on the
  local engine;
* :class:`SwarmShaper`: the :class:`~squall.shaping.base.Shaper` the lab and calibration use. The
  plan is the same as on the local engine; every node's agent gets the whole state and applies
  the part in its own namespaces. All or nothing across nodes: when one node fails, the nodes
  that succeeded are put back to the previous state (cleared if there was none) and the error
  names every failed node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from squall.cluster.agent_client import AgentRequests
from squall.cluster.errors import ClusterError, JobError
from squall.cluster.swarm import wire
from squall.cluster.swarm.wire import NodeCommand
from squall.shaping.base import Endpoint, LinkCounters, LinkState, ShapingError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeLink:
    """One swarm node's agent."""

    node: str  # the node's hostname, as its agent reports it
    host: str  # the node's own address (never an overlay address)
    port: int
    token: str

    def call(self, cmd: NodeCommand, *, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
        """Send one command; return the answer, :class:`ClusterError` when the agent refuses or fails."""
        try:
            answer = wire.call((self.host, self.port), self.token, {"cmd": cmd.value, **fields}, timeout=timeout)
        except wire.WireError as exc:
            raise ClusterError(f"node {self.node}: {exc}") from exc
        if not answer.get("ok"):
            raise ClusterError(f"node {self.node} refused {cmd!r}: {answer.get('error')}")
        return answer

    def clock_offset(self, tries: int = 5) -> float:
        """The node's clock minus ours (seconds), from the exchange with the shortest round trip."""
        best: tuple[float, float] | None = None
        for _ in range(tries):
            t0 = time.time()
            answer = self.call(NodeCommand.HELLO, timeout=10)
            t1 = time.time()
            sample = (t1 - t0, float(answer["time"]) - (t0 + t1) / 2)
            best = sample if best is None or sample[0] < best[0] else best
        assert best is not None
        return best[1]


class RelayAgentClient(AgentRequests):
    """A worker's job agent, reached through the node agent (same interface as ``AgentClient``)."""

    ready_poll_s = 0.1  # each ping crosses the node agent

    def __init__(self, link: NodeLink, slot: int) -> None:
        self.link = link
        self.slot = slot

    def request(self, obj: dict[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
        """Send one request and return the answer; :class:`JobError` when nobody answers."""
        try:
            answer = self.link.call(NodeCommand.RELAY, slot=self.slot, request=obj, timeout=timeout + 5)
        except ClusterError as exc:
            raise JobError(f"worker slot {self.slot} on {self.link.node}: {exc}") from exc
        inner = answer.get("answer")
        if not isinstance(inner, dict):
            raise JobError(f"worker slot {self.slot} on {self.link.node} did not answer {obj.get('cmd')!r}: "
                           f"{answer.get('error')}")
        return inner


@dataclass(frozen=True)
class Placed:
    """Where a worker is, for the agents: its index, address, node and container."""

    index: int
    address: str
    node: str
    container_id: str

    def to_json(self) -> dict[str, Any]:
        """As the agents read it."""
        return {"index": self.index, "address": self.address, "node": self.node, "container_id": self.container_id}


def _each(links: Sequence[NodeLink], call: Callable[[NodeLink], Any]) -> dict[str, BaseException | None]:
    """Run ``call`` on every node at once; node -> its exception or None."""

    def guarded(link: NodeLink) -> BaseException | None:
        try:
            call(link)
        except Exception as exc:
            return exc
        return None

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(links)))) as pool:
        return dict(zip([lk.node for lk in links], pool.map(guarded, links), strict=True))


class SwarmShaper:
    """Shapes a swarm run's links through the node agents (all or nothing across nodes)."""

    def __init__(self, links: Sequence[NodeLink], placed: Sequence[Placed], *, locate: Callable[[int], Placed],
                 backend: str | None = None, timeout: float = 120.0) -> None:
        """Open a shaper on every node; if one cannot, close the others and raise :class:`ShapingError`."""
        self.links = list(links)
        self.locate = locate
        self.timeout = timeout
        self._state: LinkState | None = None
        self._closed = False
        endpoints = [p.to_json() for p in placed]
        backends: dict[str, str] = {}

        def open_one(link: NodeLink) -> None:
            backends[link.node] = link.call(NodeCommand.SHAPE_OPEN, backend=backend, endpoints=endpoints,
                                            timeout=timeout)["backend"]

        failed = {n: e for n, e in _each(self.links, open_one).items() if e is not None}
        if failed or len(set(backends.values())) > 1:
            self._closed = True
            _each([lk for lk in self.links if lk.node in backends], lambda lk: lk.call(NodeCommand.SHAPE_CLOSE))
            why = "; ".join(f"{n}: {e}" for n, e in failed.items()) or f"nodes chose different backends {backends}"
            raise ShapingError(f"cannot open shaping on every node: {why}")
        self.backend = next(iter(backends.values()))
        logger.info("swarm shaper: backend %s on %d nodes", self.backend, len(self.links))

    def _require_open(self) -> None:
        if self._closed:
            raise ShapingError("the swarm shaper is closed")

    def _all(self, cmd: NodeCommand, links: Sequence[NodeLink] | None = None,
             **fields: Any) -> dict[str, BaseException]:
        return {n: e for n, e in _each(list(links or self.links),
                                       lambda lk: lk.call(cmd, timeout=self.timeout, **fields)).items()
                if e is not None}

    def apply(self, state: LinkState) -> None:
        """Every node applies the state to its namespaces; if one fails, the others are put back."""
        self._require_open()
        t0 = time.monotonic()
        failed = self._all(NodeCommand.SHAPE_APPLY, state=wire.encode_state(state))  # encoded once for every node
        if failed:
            done = [lk for lk in self.links if lk.node not in failed]
            if self._state is not None:
                back = self._all(NodeCommand.SHAPE_APPLY, done, state=wire.encode_state(self._state))
            else:
                back = self._all(NodeCommand.SHAPE_CLEAR, done)
            why = "; ".join(f"{n}: {e}" for n, e in failed.items())
            extra = f" (and putting back {sorted(back)} failed too: {back})" if back else ""
            raise ShapingError(f"shaping not applied on every node, the others were put back{extra}: {why}")
        self._state = state
        logger.info("swarm shaper: applied %d links on %d nodes in %.1f ms", len(state.links), len(self.links),
                    (time.monotonic() - t0) * 1e3)

    def clear(self) -> None:
        """Every node removes what its shaper added."""
        failed = self._all(NodeCommand.SHAPE_CLEAR)
        self._state = None
        if failed:
            raise ShapingError("clear failed on " + "; ".join(f"{n}: {e}" for n, e in failed.items()))

    def replace_endpoint(self, endpoint: Endpoint) -> None:
        """A worker restarted (maybe elsewhere, maybe with a new address): every node re-plans."""
        self._require_open()
        placed = self.locate(endpoint.index)
        failed = self._all(NodeCommand.SHAPE_REPLACE, **placed.to_json())
        if failed:
            raise ShapingError("re-applying after a restart failed on "
                               + "; ".join(f"{n}: {e}" for n, e in failed.items()))

    def counters(self) -> LinkCounters:
        """Every node's link counters, added up (each link is counted on one node: its sender's for netem,
        its receiver's for nfqueue)."""
        self._require_open()
        found: dict[str, LinkCounters] = {}

        def one(link: NodeLink) -> None:
            answer = link.call(NodeCommand.SHAPE_COUNTERS, timeout=self.timeout)
            found[link.node] = wire.decode_counters(answer["counters"])

        failed = {n: e for n, e in _each(self.links, one).items() if e is not None}
        if failed:
            raise ShapingError("reading link counters failed on " + "; ".join(f"{n}: {e}" for n, e in failed.items()))
        total = LinkCounters()
        for counters in found.values():
            total = total + counters
        return total

    def check(self) -> None:
        """Raise :class:`ShapingError` when any node's shaping stopped."""
        if self._closed:
            return
        failed = self._all(NodeCommand.SHAPE_CHECK)
        if failed:
            raise ShapingError("shaping stopped on " + "; ".join(f"{n}: {e}" for n, e in failed.items()))

    def close(self) -> None:
        """Clear and stop the shaper on every node; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        failed = self._all(NodeCommand.SHAPE_CLOSE)
        if failed:
            raise ShapingError("closing shaping failed on " + "; ".join(f"{n}: {e}" for n, e in failed.items()))


def offsets(links: Mapping[str, NodeLink]) -> dict[str, float]:
    """Every node's clock offset (seconds, its clock minus this host's)."""
    return {node: round(link.clock_offset(), 6) for node, link in links.items()}
