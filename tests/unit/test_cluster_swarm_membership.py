"""Joining, initialising and leaving a swarm (squall.cluster.swarm.membership), against a stand-in engine.

The stand-in records what Squall asks of the engine; the record file is the real one, in a temporary
directory. What is checked: a swarm Squall finds is never left, one it made is left when the last
live run using it ends (or is found dead), and leaving also removes docker_gwbridge.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from squall.cluster.errors import ClusterError
from squall.cluster.ownership import Owner
from squall.cluster.swarm import membership


class _Net:
    def __init__(self, engine: FakeEngine, name: str) -> None:
        self.engine, self.name = engine, name

    def remove(self) -> None:
        self.engine.calls.append(f"rm {self.name}")
        self.engine.nets.discard(self.name)


class _Networks:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def list(self, names: list[str]) -> list[_Net]:
        return [_Net(self.engine, n) for n in sorted(self.engine.nets) if n in names]


class _Swarm:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def init(self, advertise_addr: str, listen_addr: str) -> None:
        self.engine.calls.append(f"init {advertise_addr}")
        self.engine.state, self.engine.manager = "active", True
        self.engine.nets.add(membership.GWBRIDGE)

    def leave(self, force: bool) -> None:
        self.engine.calls.append(f"leave force={force}")
        self.engine.state, self.engine.manager = "inactive", False


class FakeEngine:
    """Just what membership asks of docker-py's client."""

    def __init__(self, state: str = "inactive", manager: bool = False) -> None:
        self.state, self.manager = state, manager
        self.calls: list[str] = []
        self.nets: set[str] = set()
        self.swarm, self.networks = _Swarm(self), _Networks(self)

    def info(self) -> dict[str, Any]:
        return {"Swarm": {"LocalNodeState": self.state, "ControlAvailable": self.manager}}


@pytest.fixture(autouse=True)
def _record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "swarm-init.json"
    monkeypatch.setattr(membership, "record_path", lambda: path)
    monkeypatch.setattr(membership, "default_route_address", lambda: "192.0.2.2")
    return path


def test_an_engine_in_no_swarm_is_initialised_and_left_by_the_last_run(_record: Path) -> None:
    engine = FakeEngine()
    assert membership.join_or_init(engine, "run1") is True
    assert engine.calls == ["init 192.0.2.2"]
    assert membership.join_or_init(engine, "run2") is True  # Squall's swarm: joined, not initialised again
    assert engine.calls == ["init 192.0.2.2"]
    assert set(json.loads(_record.read_text())["runs"]) == {"run1", "run2"}
    assert membership.release(engine, "run1") is False  # run2 (this live process) still uses it
    assert engine.state == "active"
    assert membership.release(engine, "run2") is True
    assert engine.calls[-2:] == ["leave force=True", f"rm {membership.GWBRIDGE}"]
    assert engine.state == "inactive" and not engine.nets and not _record.exists()


def test_a_swarm_found_is_used_and_never_left() -> None:
    engine = FakeEngine("active", manager=True)
    assert membership.join_or_init(engine, "run1") is False
    assert membership.release(engine, "run1") is False
    assert membership.release(engine, None, force=True) is False
    assert engine.calls == [] and engine.state == "active"


def test_a_swarm_worker_engine_is_refused() -> None:
    with pytest.raises(ClusterError, match="not a manager"):
        membership.join_or_init(FakeEngine("active", manager=False), "run1")


def test_gc_leaves_a_swarm_whose_runs_are_all_dead(_record: Path) -> None:
    engine = FakeEngine()
    membership.join_or_init(engine, "run1")
    record = json.loads(_record.read_text())
    dead = Owner(Owner.me().host, 999_999_999, 1.0)  # no such pid: its owner is gone
    record["runs"]["run1"] = dead.labels("run1", Path("/tmp/x"))
    _record.write_text(json.dumps(record))
    assert membership.release(engine, None) is True
    assert engine.state == "inactive"


def test_gc_keeps_a_swarm_a_live_run_uses_unless_forced() -> None:
    engine = FakeEngine()
    membership.join_or_init(engine, "run1")
    assert membership.release(engine, None) is False
    assert engine.state == "active"
    assert membership.release(engine, None, force=True) is True
    assert engine.state == "inactive"
