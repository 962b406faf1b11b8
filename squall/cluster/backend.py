"""The cluster backend interface, and :func:`open_cluster`, which picks an engine by ``spec.engine``.

A backend owns a run's worker containers wherever they run and everything the run needs around
them. Two implement it:

* ``local`` (:class:`squall.cluster.cluster.Cluster`): containers on this machine's Docker engine,
  shaped from this process through ``/proc/<pid>/ns/net``;
* ``swarm`` (:class:`squall.cluster.swarm.cluster.SwarmCluster`): a Docker Swarm service of workers
  on an overlay network, shaped on each node by the ``squall-node-agent`` global service.

Callers above this package (the lab, calibration, the CLI) use only what this interface names:
``endpoints()`` for the plan, :meth:`ClusterBackend.open_shaper` for a shaper that reaches the
endpoints wherever they are, ``start_job``/``run_job`` for jobs, the churn verbs, ``state`` and
``close``. ``squall gc`` (:mod:`squall.cluster.gc`) cleans up after both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from squall.cluster.errors import ClusterSpecError
from squall.cluster.spec import ENGINES, LOCAL, SWARM, ClusterSpec

if TYPE_CHECKING:
    from squall.cluster.cluster import JobHandle, Node, NodeState
    from squall.cluster.jobs import JobResult
    from squall.shaping.base import Endpoint, Shaper


@runtime_checkable
class ClusterBackend(Protocol):
    """What every engine offers the layers above ``squall.cluster``."""

    engine: str  # "local" or "swarm": recorded with the results
    spec: ClusterSpec
    run_id: str
    nodes: list[Node]  # one per worker, index order; ``run_dir`` holds its job outputs on this host

    def __enter__(self) -> ClusterBackend:
        """:meth:`start`; the ``with`` block's end is :meth:`close`."""

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """:meth:`close`."""

    def start(self) -> ClusterBackend:
        """Create everything and wait until every worker's job agent answers; all or nothing."""

    def endpoints(self) -> list[Endpoint]:
        """Index, data-plane address and namespace of each worker (the namespace as its node sees it)."""

    def placement(self) -> dict[int, str]:
        """Worker index -> the machine (engine node) it runs on."""

    def open_shaper(self, backend: str | None = None) -> Shaper:
        """A shaper for :meth:`endpoints`, running where the endpoints are; nothing shaped until ``apply``."""

    def clock_offsets(self) -> dict[str, float]:
        """Node -> its clock minus this host's clock, in seconds, as last measured (0.0 for this host)."""

    def start_job(self, entry: str, config: dict[str, Any] | None = None, *, nodes: Sequence[int] | None = None,
                  timeout: float = 120.0, seed: int = 0,
                  per_node: Mapping[int, Mapping[str, Any]] | None = None) -> JobHandle:
        """Start ``entry`` on ``nodes`` (default all) and return at once."""

    def run_job(self, entry: str, config: dict[str, Any] | None = None, *, nodes: Sequence[int] | None = None,
                timeout: float = 120.0, seed: int = 0, raise_on_failure: bool = True,
                per_node: Mapping[int, Mapping[str, Any]] | None = None) -> list[JobResult]:
        """Run ``entry`` and wait for every result."""

    def kill(self, index: int) -> None:
        """SIGKILL worker ``index``."""

    def pause(self, index: int) -> None:
        """Freeze worker ``index``."""

    def unpause(self, index: int) -> None:
        """Resume a paused worker."""

    def restart(self, index: int, *, wait_ready: bool = True) -> Node:
        """Start worker ``index`` again; the returned node may have a new address and namespace."""

    def disconnect(self, index: int) -> None:
        """Take worker ``index`` off the data network."""

    def reconnect(self, index: int) -> None:
        """Put worker ``index`` back on the data network."""

    def state(self, index: int) -> NodeState:
        """Whether worker ``index`` runs and whether it is paused."""

    def close(self) -> None:
        """Remove everything the run created; safe to call twice."""


def open_cluster(spec: ClusterSpec, **kwargs: Any) -> ClusterBackend:
    """An engine for ``spec`` (not started: call ``start()`` or use it as a context manager).

    :raises ClusterSpecError: for an engine this function does not know.
    """
    if spec.engine == LOCAL:
        from squall.cluster.cluster import Cluster

        return Cluster(spec, **kwargs)
    if spec.engine == SWARM:
        from squall.cluster.swarm.cluster import SwarmCluster

        return SwarmCluster(spec, **kwargs)
    raise ClusterSpecError(f"engine {spec.engine!r} is not one of {', '.join(ENGINES)}")
