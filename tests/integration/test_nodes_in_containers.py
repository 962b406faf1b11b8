"""Several ranks per node in containers (issue 39, item 1): the DDP example as 2 nodes x 2 ranks, and the
hierarchical example (docs/examples/hierarchical/) whose gradients are averaged inside each node over its
loopback and only a shard per rank crosses the shaped links between nodes.

One cluster of 2 containers serves the module (the plugin's session); each run is a few seconds of
traffic.
"""

from __future__ import annotations

import pytest

from squall.programs.result import ProgramResult

pytestmark = [pytest.mark.docker]

DDP = "../../docs/examples/ddp"  # the marker's workdir, relative to this file
HIERARCHICAL = "../../docs/examples/hierarchical"
STEP = {"loss": r"step (?P<step>\d+) loss (?P<value>\S+)"}


@pytest.mark.squall(command=["python", "train.py", "--steps", "20"], workdir=DDP, metrics=STEP, profiles=["lan"],
                    workers=2, nproc_per_node=2, seconds=150)
def test_ddp_runs_as_two_nodes_of_two_ranks(squall_program: ProgramResult) -> None:
    assert squall_program.verdict.passed is True, squall_program.verdict.why
    assert squall_program.json["workers"] == 2 and squall_program.json["nproc_per_node"] == 2
    assert sorted({r.worker for r in squall_program.trace.records}) == [0, 1, 2, 3]  # global ranks print
    assert all(squall_program.run(rank).state == "exited" for rank in range(4))
    nodes = squall_program.nodes
    assert [n.ranks for n in nodes] == [(0, 1), (2, 3)]
    # DDP's one ring crosses the links between the nodes and the loopback inside each
    assert all(n.sent > 0 and n.received > 0 for n in nodes), nodes
    assert all(n.inside is not None and n.inside > 0 for n in nodes), nodes


@pytest.mark.squall(command=["python", "train.py", "--steps", "10", "--hidden", "256"], workdir=HIERARCHICAL,
                    metrics={**STEP, "params": r"params (\S+)", "between": r"payload inside \S+ between (\S+)",
                             "inside": r"payload inside (\S+) between"},
                    agree=["params"], profiles=["thin-20mbit"], workers=2, nproc_per_node=2, seconds=180)
def test_the_hierarchical_example_keeps_most_bytes_inside_its_nodes(squall_program: ProgramResult) -> None:
    assert squall_program.verdict.passed is True, squall_program.verdict.why
    assert [a.passed for a in squall_program.agreement] == [True]  # every rank ends with the same parameters
    for node in squall_program.nodes:
        between = sum(squall_program.values("between", rank)[-1] for rank in node.ranks)
        inside = sum(squall_program.values("inside", rank)[-1] for rank in node.ranks)
        # the kernel's count of what the node sent to the other node: its ranks' shards (plus headers and gloo's
        # rendezvous), not every rank's whole gradient
        assert 0.9 * between <= node.sent <= 2.5 * between, (node, between)
        # the example's point: more of the traffic stays on the node's loopback than crosses the slow link
        assert inside >= 2 * between
        assert node.inside is not None and node.inside > node.sent, node
