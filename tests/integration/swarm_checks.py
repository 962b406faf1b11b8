"""What the swarm engine's tests check after a run: nothing of it left, the swarm as it was found.

Shared by the one-node (``test_cluster_swarm_engine.py``) and two-node (``test_cluster_swarm_two_nodes.py``) tests.
"""

from __future__ import annotations

from typing import Any

from squall.cluster.swarm.membership import GWBRIDGE, swarm_state


def leftovers(client: Any, run_id: str) -> dict[str, list[str]]:
    """Everything of the run the engine still holds: containers, networks and, in a swarm, services,
    secrets and node entries labelled with the run (the two-node test's emulated machines)."""
    flt = {"label": f"squall.run={run_id}"}
    out = {"containers": [c.name for c in client.containers.list(all=True, filters=flt)],
           "networks": [n.name for n in client.networks.list(filters=flt)]}
    if swarm_state(client) == "active":
        out["services"] = [s.name for s in client.services.list(filters=flt)]
        out["secrets"] = [s.name for s in client.secrets.list(filters=flt)]
        nodes = client.nodes.list(filters={"node.label": f"squall.run={run_id}"})
        out["nodes"] = [n.attrs["Description"]["Hostname"] for n in nodes]
    return {k: v for k, v in out.items() if v}


def swarm_as_before(client: Any, before: str) -> None:
    """The engine's swarm state is what it was before the test; a swarm Squall made left no gwbridge."""
    assert swarm_state(client) == before
    if before != "active":
        assert not [n for n in client.networks.list(names=[GWBRIDGE]) if n.name == GWBRIDGE]
