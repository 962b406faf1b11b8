"""Docker clusters of worker containers: image, network, containers, agents, jobs, churn and gc.

Only this package talks to Docker (docs/architecture.md, section 3).
"""

from squall.cluster.cluster import Cluster, JobHandle, Node, NodeState
from squall.cluster.errors import (
    ClusterError,
    ClusterSpecError,
    EngineUnavailable,
    ImageError,
    JobError,
)
from squall.cluster.jobs import JobResult
from squall.cluster.spec import ClusterSpec, Mount

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterSpec",
    "ClusterSpecError",
    "EngineUnavailable",
    "ImageError",
    "JobError",
    "JobHandle",
    "JobResult",
    "Mount",
    "Node",
    "NodeState",
]
