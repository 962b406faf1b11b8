"""The claims registry: shipped claims load, bad claims are rejected, evaluation is interleaved and honest."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from squall.claims.registry import ClaimError, evaluate, load_claims
from squall.experiment.lab import RunSpec
from squall.experiment.matrix import build_matrix
from squall.protocols.catalog import PROTOCOLS
from squall.run_trace import RunTrace, StepRecord


def test_shipped_claims_load_and_name_known_protocols_and_profiles() -> None:
    claims = load_claims()
    assert {c.id for c in claims} >= {"sesgd-butterfly-vs-ring", "sesgd-speedup-grows-with-latency"}
    for c in claims:
        if c.names and c.profiles:  # a pure-maths claim runs no protocol on no profile
            sizes = [c.workers] if c.workers else list(c.params.get("workers", []))
            build_matrix({"protocols": list(c.names), "profiles": list(c.profiles), "workers": sizes},
                         source=c.id, known_protocols=PROTOCOLS)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"check": "faster"}, "check 'faster' is not one of"),
        ({"params": {"x": 1}}, "unknown keys ['params']"),
        ({"workers": 0}, "workers must be >= 1"),
        ({"speed": 1}, "unknown keys ['speed']"),
        ({"profiles": ["lan", "wan-5ms"]}, "'speedup' takes one profile"),
        ({"run": {"seconds": 1, "warp": 2}}, "run has unknown keys ['warp']"),
        ({"target": {"metric": "speed", "value": "fast"}}, "target value 'fast'"),
    ],
)
def test_bad_claims_are_rejected(tmp_path: Path, edit: dict[str, Any], message: str) -> None:
    import yaml

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "claims.yaml").read_text())[0]
    raw.update(edit)
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump([raw]))
    with pytest.raises(ClaimError, match=re.escape(message)):
        load_claims(path)


def fake_runner(times: dict[tuple[str, str], float], calls: list[str]) -> Any:
    """Traces where every worker reaches 95 % accuracy at times[(protocol, profile)]."""

    def run(spec: RunSpec, workers: int) -> RunTrace:
        calls.append(spec.protocol)
        t = times[(spec.protocol, spec.profile)] * (1 + 0.01 * spec.seed)
        recs = tuple(StepRecord(w, k, tk, accuracy=acc) for w in range(workers)
                     for k, (tk, acc) in enumerate([(0.1, 0.1), (t, 0.95)]))
        return RunTrace(spec.protocol, spec.profile, workers, spec.seed, "nfqueue", recs)

    return run


def test_speedup_claim_runs_interleaved_and_compares_medians() -> None:
    claim = next(c for c in load_claims() if c.id == "sesgd-butterfly-vs-ring")
    calls: list[str] = []
    result = evaluate(claim, fake_runner({("butterfly", "wan-20ms"): 2.0, ("ring", "wan-20ms"): 6.0}, calls))
    assert calls == ["butterfly", "ring"] * len(claim.seeds)
    assert result.verdict.passed is True and result.verdict.measured == pytest.approx(3.0, rel=1e-3)
    slow = evaluate(claim, fake_runner({("butterfly", "wan-20ms"): 2.0, ("ring", "wan-20ms"): 4.8}, []))
    assert slow.verdict.passed is False


def test_growth_claim_needs_the_speedup_to_increase_along_the_profiles() -> None:
    claim = next(c for c in load_claims() if c.id == "sesgd-speedup-grows-with-latency")
    grows = {("butterfly", "lan"): 1.0, ("ring", "lan"): 1.2, ("butterfly", "wan-5ms"): 2.0, ("ring", "wan-5ms"): 5.0}
    result = evaluate(claim, fake_runner(grows, []))
    assert result.verdict.passed is True and "lan: 1.20x" in result.verdict.why
    flat = {**grows, ("ring", "wan-5ms"): 2.2}
    assert evaluate(claim, fake_runner(flat, [])).verdict.passed is False
