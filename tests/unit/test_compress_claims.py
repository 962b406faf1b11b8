"""The compression claims' pure-maths kinds: the shipped T6.1, T6.2 and T8.1 claims hold in process, and
each kind fails when its threshold cannot be met (so the verdicts can fail)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from squall.claims.kinds import KINDS
from squall.claims.registry import Claim, evaluate, load_claims
from squall.experiment.lab import RunSpec
from squall.run_trace import RunTrace

IDS = ("arc-t61-aligned-contraction", "arc-t62-heterogeneous-synthetic", "flash-t81-quantized-error",
       "flash-t83-quantized-inference")


def no_containers(spec: RunSpec, workers: int) -> RunTrace:
    raise AssertionError("a pure-maths claim started a run")


@pytest.fixture(scope="module")
def claims() -> dict[str, Claim]:
    return {c.id: c for c in load_claims()}


@pytest.mark.parametrize("claim_id", IDS)
def test_the_shipped_pure_maths_claims_gate_and_hold(claims: dict[str, Claim], claim_id: str) -> None:
    claim = claims[claim_id]
    assert claim.gate
    verdict = evaluate(claim, no_containers).verdict
    assert verdict.passed is True, verdict.line()


def test_each_kind_fails_when_its_threshold_cannot_be_met(claims: dict[str, Claim]) -> None:
    t61 = claims["arc-t61-aligned-contraction"]
    strict = replace(t61, params={**t61.params, "slack": 0.5, "trials": 50})
    assert KINDS["sketch_contraction"].evaluate(strict, no_containers).passed is False
    t62 = claims["arc-t62-heterogeneous-synthetic"]
    strict = replace(t62, params={**t62.params, "vs_uncompressed": 1.0, "ratios": [0.05]})
    verdict = KINDS["heterogeneous_synthetic"].evaluate(strict, no_containers)
    assert verdict.passed is False and "x uncompressed" in verdict.why
    t81 = claims["flash-t81-quantized-error"]
    swapped = replace(t81, fast=t81.slow, slow=t81.fast, params={**t81.params, "ranks": [2, 16]})
    verdict = KINDS["quantized_error"].evaluate(swapped, no_containers)
    assert verdict.passed is False and "err(16)/err(2)" in verdict.why
    t83 = claims["flash-t83-quantized-inference"]
    strict = replace(t83, params={**t83.params, "int4_max_drop": -0.5})
    verdict = KINDS["quantized_inference"].evaluate(strict, no_containers)
    assert verdict.passed is False and "INT4 drop" in verdict.why
