"""The cluster backend interface: engine selection in ClusterSpec and open_cluster (no Docker needed)."""

from __future__ import annotations

import pytest

from squall.cluster import Cluster, ClusterSpec, ClusterSpecError
from squall.cluster.backend import ClusterBackend, open_cluster
from squall.cluster.spec import ENGINES, MAX_WORKERS


def test_default_engine_is_local() -> None:
    assert ClusterSpec(workers=2).engine == "local"


def test_unknown_engine_names_key_value_and_allowed() -> None:
    with pytest.raises(ClusterSpecError) as info:
        ClusterSpec(workers=2, engine="kubernetes")
    text = str(info.value)
    assert "engine" in text and "'kubernetes'" in text
    for allowed in ENGINES:
        assert allowed in text


def test_worker_limit_depends_on_engine() -> None:
    ClusterSpec(workers=256, engine="swarm")
    with pytest.raises(ClusterSpecError, match=r"1\.\.250"):
        ClusterSpec(workers=256)
    with pytest.raises(ClusterSpecError, match=r"1\.\.1000"):
        ClusterSpec(workers=MAX_WORKERS["swarm"] + 1, engine="swarm")


def test_open_cluster_local_is_the_docker_cluster_and_meets_the_interface() -> None:
    cluster = open_cluster(ClusterSpec(workers=2), client=object())
    assert isinstance(cluster, Cluster)
    assert isinstance(cluster, ClusterBackend)
    assert cluster.engine == "local"


def test_open_cluster_swarm_meets_the_interface() -> None:
    from squall.cluster.swarm.cluster import SwarmCluster

    cluster = open_cluster(ClusterSpec(workers=2, engine="swarm"), client=object())
    assert isinstance(cluster, SwarmCluster)
    assert isinstance(cluster, ClusterBackend)
    assert cluster.engine == "swarm"


def test_select_engine_sets_the_default_of_later_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    from squall.cluster.spec import ENGINE_ENV, select_engine

    monkeypatch.setenv(ENGINE_ENV, "")  # recorded, so whatever select_engine sets below is undone after
    select_engine(None)
    assert ClusterSpec(workers=2).engine == "local"
    select_engine("swarm")
    assert ClusterSpec(workers=2).engine == "swarm"
    assert ClusterSpec(workers=2, engine="local").engine == "local"  # an explicit engine wins
    with pytest.raises(ClusterSpecError, match="'k8s'"):
        select_engine("k8s")
    monkeypatch.setenv(ENGINE_ENV, "k8s")
    with pytest.raises(ClusterSpecError, match=r"\$SQUALL_ENGINE"):
        ClusterSpec(workers=2)


def test_the_engine_default_did_not_leak_from_the_test_above() -> None:
    assert ClusterSpec(workers=2).engine == "local"
