"""Fixtures of the integration tests: real clusters of worker containers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from squall.cluster import Cluster, ClusterSpec


@pytest.fixture(scope="module")
def cluster4(docker_client: Any, worker_image: str) -> Iterator[Cluster]:
    """Name: cluster4. Scope: module. Depends: docker_client, worker_image. Four workers, torn down after."""
    with Cluster(ClusterSpec(workers=4, cpus=1.0, memory="768m"), client=docker_client) as cluster:
        yield cluster


def labelled(client: Any, run_id: str) -> tuple[list[Any], list[Any]]:
    """Containers and networks that carry ``squall.run=<run_id>``."""
    flt = {"label": f"squall.run={run_id}"}
    return client.containers.list(all=True, filters=flt), client.networks.list(filters=flt)


@pytest.fixture(scope="module")
def swarm_before(docker_client: Any) -> str:
    """Name: swarm_before. Scope: module. Depends: docker_client. The engine's swarm state before any
    test of the module (the swarm tests check they leave it as found: tests/integration/swarm_checks.py)."""
    from squall.cluster.swarm.membership import swarm_state

    return swarm_state(docker_client)
