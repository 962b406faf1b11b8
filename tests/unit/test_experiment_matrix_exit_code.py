"""``squall matrix``'s exit status: cells and gating claims decide it; a ``gate: false`` claim is only reported."""

from __future__ import annotations

from squall.checks import Verdict
from squall.cli.run import matrix_exit_code
from squall.report.page import CellResult, ClaimResult
from squall.run_meta import RunMeta
from squall.run_trace import RunTrace


def _cell(*passed: bool | None) -> CellResult:
    trace = RunTrace(protocol="ring", profile="lan", workers=4, seed=0, backend="nfqueue", records=(), churn=(),
                     survivors=(0, 1, 2, 3), meta=RunMeta.from_json({}))
    return CellResult("ring-lan-w4", trace, tuple(Verdict("converged", p, 1.0, ">= 0.9", "why") for p in passed))


def _claim(claim_id: str, passed: bool | None) -> ClaimResult:
    return ClaimResult(claim_id, "paper", "claim", "1.3x", "ours", Verdict("speedup", passed, 1.0, ">= 1.25", "why"))


def test_all_passing_is_zero() -> None:
    assert matrix_exit_code([_cell(True, True)], [_claim("a", True)], {"a": True}) == 0


def test_a_failed_or_unknown_cell_check_fails_the_run() -> None:
    assert matrix_exit_code([_cell(True, False)], [], {}) == 1
    assert matrix_exit_code([_cell(None)], [], {}) == 1


def test_a_gating_claim_that_fails_fails_the_run() -> None:
    assert matrix_exit_code([_cell(True)], [_claim("a", False)], {"a": True}) == 1
    assert matrix_exit_code([_cell(True)], [_claim("a", None)], {"a": True}) == 1


def test_a_claim_that_is_not_a_gate_is_only_reported() -> None:
    claims = [_claim("gated", True), _claim("reported", False)]
    assert matrix_exit_code([_cell(True)], claims, {"gated": True, "reported": False}) == 0
    assert matrix_exit_code([_cell(False)], claims, {"gated": True, "reported": False}) == 1
