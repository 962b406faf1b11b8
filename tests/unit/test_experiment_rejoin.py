"""A restarted node's runs of a job, joined in order (squall.experiment.lab.incarnations), and which
protocols are given their job back after a restart."""

from __future__ import annotations

from pathlib import Path

from squall.cluster.jobs import JobResult
from squall.experiment.lab import incarnations
from squall.protocols.catalog import PROTOCOLS


def _result(node: int, job: str, state: str, tmp: Path) -> JobResult:
    return JobResult(node, job, state, 0 if state == "done" else None, 1.0, tmp / job / str(node))


def test_each_node_keeps_its_first_run_then_its_later_ones_in_order(tmp_path: Path) -> None:
    first = [_result(i, "j0001", "lost" if i == 2 else "done", tmp_path) for i in (3, 0, 2, 1)]
    later = [_result(2, "j0002", "lost", tmp_path), _result(2, "j0003", "done", tmp_path)]
    lives = incarnations(first, later)
    assert [[r.job_id for r in runs] for runs in lives] == [["j0001"], ["j0001"], ["j0001", "j0002", "j0003"],
                                                             ["j0001"]]
    assert [runs[-1].ok for runs in lives] == [True, True, True, True]  # node 2's last run finished


def test_without_restarts_every_node_has_one_run(tmp_path: Path) -> None:
    first = [_result(i, "j0001", "done", tmp_path) for i in range(4)]
    assert incarnations(first, []) == [[r] for r in first]


def test_only_protocols_that_can_join_a_run_under_way_are_given_their_job_back() -> None:
    assert {name for name, p in PROTOCOLS.items() if p.rejoins} == {"moshpit"}
