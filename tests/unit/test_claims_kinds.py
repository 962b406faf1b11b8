"""Claim kinds: discovered from their folder, validated by their declared keys, and honest on known traces."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from squall.claims.kinds import KINDS
from squall.claims.registry import ClaimError, evaluate, load_claims
from squall.experiment.lab import RunSpec
from squall.protocols.dropcompute.protocol import BASELINE as OFF
from squall.protocols.dropcompute.protocol import NAME as DC
from squall.run_meta import RunMeta
from squall.run_trace import RunTrace, StepRecord

BASE = {"id": "x", "paper": "p", "claim": "c", "paper_figure": "f", "our_setting": "s"}


def _load(tmp_path: Path, **raw: Any) -> Any:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump([{**BASE, **raw}]))
    return load_claims(path)[0]


def test_the_shipped_kinds_are_discovered() -> None:
    assert {"speedup", "speedup_grows", "straggler_robustness", "straggler_overhead", "threshold_choice"} <= set(KINDS)


def test_every_shipped_claim_names_a_kind_and_only_its_keys() -> None:
    for claim in load_claims():
        assert claim.check in KINDS


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"check": "straggler_overhead", "fast": "a", "slow": "b", "profiles": ["lan"], "seeds": [0], "run": {},
          "params": {"workers": [4], "flat_within": 0.1}}, "params.workers: a list of two or more"),
        ({"check": "straggler_overhead", "fast": "a", "slow": "b", "profiles": ["lan"], "seeds": [0], "run": {}},
         "missing keys ['params']"),
        ({"check": "threshold_choice", "fast": "a", "profiles": ["lan"], "workers": 8, "seeds": [0], "run": {},
          "slow": "b"}, "unknown keys ['slow']"),
        ({"check": "threshold_choice", "fast": "a", "profiles": ["lan"], "workers": 8, "seeds": [0]},
         "missing keys ['run']"),
    ],
)
def test_a_kind_refuses_keys_it_does_not_read(tmp_path: Path, raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=re.escape(message)):
        _load(tmp_path, **raw)


def _trace(spec: RunSpec, workers: int, *, step_s: float, phases: list[float], micro: float, drop: float,
           accuracy: float, summary: dict[str, Any] | None = None) -> RunTrace:
    recs = []
    for k in range(1, 11):
        for w in range(workers):
            phase = phases[(k + w) % len(phases)]
            recs.append(StepRecord(w, k, k * step_s, accuracy=accuracy if k == 10 else None,
                                   extra={"step_s": step_s, "compute_s": phase / 2, "sleep_s": phase / 2,
                                          "microbatch_s": micro, "drop_rate": drop}))
    summaries = [{"global_drop_rate": drop, "micro_batches": 8, **(summary or {})} for _ in range(workers)]
    return RunTrace(spec.protocol, spec.profile, workers, spec.seed, "nfqueue", tuple(recs),
                    meta=RunMeta.from_json({"summaries": summaries}))


def test_straggler_robustness_reads_step_time_drop_and_accuracy(tmp_path: Path) -> None:
    claim = _load(tmp_path, check="straggler_robustness", fast=DC, slow=OFF, profiles=["lan"], workers=4,
                  seeds=[0, 1], run={"steps": 10})

    def run(spec: RunSpec, workers: int) -> RunTrace:
        fast = spec.protocol == DC
        return _trace(spec, workers, step_s=0.2 if fast else 0.4, phases=[0.16], micro=0.02, drop=0.05 if fast else 0,
                      accuracy=0.9 if fast else 0.905)

    verdict = evaluate(claim, run).verdict
    assert verdict.passed is True, verdict.why
    assert verdict.measured == {"step_speedup": 2.0, "effective_speedup": 1.9, "drop_rate": 0.05,
                                "accuracy_gap": 0.005}

    def worse(spec: RunSpec, workers: int) -> RunTrace:
        fast = spec.protocol == DC
        return _trace(spec, workers, step_s=0.2 if fast else 0.4, phases=[0.16], micro=0.02, drop=0.2 if fast else 0,
                      accuracy=0.85 if fast else 0.905)

    bad = evaluate(claim, worse).verdict
    assert bad.passed is False and "drop rate" in bad.why and "accuracy" in bad.why


def test_straggler_overhead_needs_the_baseline_to_grow_and_the_threshold_to_stay_flat(tmp_path: Path) -> None:
    claim = _load(tmp_path, check="straggler_overhead", fast=DC, slow=OFF, profiles=["lan"], seeds=[0],
                  run={"steps": 10}, params={"workers": [4, 8]})

    def run(spec: RunSpec, workers: int) -> RunTrace:
        slow_phase = 0.64 if workers == 8 else 0.32  # more workers: a straggler in more steps
        phases = [0.16, 0.2] if spec.protocol == DC else [0.16, slow_phase]
        return _trace(spec, workers, step_s=0.3, phases=phases, micro=0.02, drop=0, accuracy=0.9)

    verdict = evaluate(claim, run).verdict
    assert verdict.passed is True, verdict.why
    assert verdict.measured[f"{OFF} overhead"] == {4: 2.0, 8: 4.0}  # max phase / (8 x 20 ms)
    assert verdict.measured[f"{DC} overhead"] == {4: 1.25, 8: 1.25}

    def flat_baseline(spec: RunSpec, workers: int) -> RunTrace:
        return _trace(spec, workers, step_s=0.3, phases=[0.16, 0.32], micro=0.02, drop=0, accuracy=0.9)

    assert evaluate(claim, flat_baseline).verdict.passed is False


def test_threshold_choice_checks_the_band_and_the_prediction(tmp_path: Path) -> None:
    claim = _load(tmp_path, check="threshold_choice", fast=DC, profiles=["lan"], workers=4, seeds=[0],
                  run={"steps": 60})

    def run_with(tau: float, realised: float) -> Any:
        def run(spec: RunSpec, workers: int) -> RunTrace:
            return _trace(spec, workers, step_s=0.2, phases=[0.16], micro=0.02, drop=0.05, accuracy=0.9,
                          summary={"tau_s": tau, "microbatch_s_median": 0.02, "effective_speedup_est": 1.5,
                                   "effective_speedup_measured": realised})
        return run

    good = evaluate(claim, run_with(0.2, 1.4)).verdict  # a nominal worker ends by 0.2 + 0.02 s = 1.375 M t0
    assert good.passed is True and good.measured["end_over_M_t0"] == 1.375
    assert evaluate(claim, run_with(0.15, 1.4)).verdict.passed is True  # ends by 1.06 M t0
    assert evaluate(claim, run_with(0.24, 1.4)).verdict.passed is False  # 1.625 M t0
    assert evaluate(claim, run_with(0.2, 1.0)).verdict.passed is False  # -33 % from predicted
    at_end = dataclasses.replace(claim, params={"threshold_at": "end"})
    assert evaluate(at_end, run_with(0.15, 1.4)).verdict.passed is False  # 0.94 M t0 as an end threshold


def test_a_kind_that_crashes_is_unknown_not_passed(tmp_path: Path) -> None:
    claim = _load(tmp_path, check="threshold_choice", fast=DC, profiles=["lan"], workers=4, seeds=[0],
                  run={"steps": 60})

    def broken(spec: RunSpec, workers: int) -> RunTrace:
        raise RuntimeError("cluster gone")

    verdict = evaluate(claim, broken).verdict
    assert verdict.passed is None and "cluster gone" in verdict.why


def test_loss_per_sample_compares_at_equal_samples_and_checks_epochs(tmp_path: Path) -> None:
    from squall.protocols.dpsgd.protocol import DPSGD as BLOCKING
    from squall.protocols.nonblocking.protocol import DPSGD as NONBLOCKING

    claim = _load(tmp_path, check="loss_per_sample", fast=NONBLOCKING, slow=BLOCKING, profiles=["lan"], workers=2,
                  seeds=[0], run={"steps": 40, "batch_size": 32},
                  params={"samples_field": "nb_samples", "epochs_field": "nb_epoch_sizes"})

    def run_with(scale: float, epochs: list[int]) -> Any:
        def run(spec: RunSpec, workers: int) -> RunTrace:
            per = 16 if spec.protocol == NONBLOCKING else 32  # non-blocking: half the samples per step
            recs = tuple(StepRecord(w, k, 0.1 * k, loss=(scale if spec.protocol == NONBLOCKING else 1.0) / (k * per),
                                    extra={"nb_samples": k * per}) for k in range(1, 41) for w in range(workers))
            meta = RunMeta(summaries=tuple({"nb_epoch_sizes": epochs} for _ in range(workers)))
            return RunTrace(spec.protocol, spec.profile, workers, spec.seed, "nfqueue", recs, meta=meta)
        return run

    same = evaluate(claim, run_with(1.0, [64, 64])).verdict
    assert same.passed is True and same.measured < 0.05, same.why
    assert evaluate(claim, run_with(1.2, [64, 64])).verdict.passed is False
    lost = evaluate(claim, run_with(1.0, [64, 60])).verdict
    assert lost.passed is False and "unequal" in lost.why


def test_a_claim_with_a_step_budget_alone_is_not_cut_short_by_the_default_time_budget(tmp_path: Path) -> None:
    claim = _load(tmp_path, check="threshold_choice", fast=DC, profiles=["lan"], workers=4, seeds=[0],
                  run={"steps": 110})
    spec = claim.spec(DC, "lan", 0)
    assert spec.steps == 110 and spec.seconds is None
