"""The claims registry: each seed paper's claim as data (``claims.yaml``), and how to evaluate one.

Evaluation runs the two protocols interleaved (fast, slow, fast, slow, ... over seeds) on one lab
per cluster size, so slow drifts of a shared machine hit both sides alike, and compares medians.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.checks import Target, Verdict, speedup
from harness.experiment import RunSpec
from harness.report import ClaimResult
from harness.trace import RunTrace

logger = logging.getLogger(__name__)

CLAIMS_FILE = Path(__file__).resolve().parents[1] / "claims.yaml"
CHECKS = ("speedup", "speedup_grows")
FIELDS = {"id", "paper", "claim", "paper_figure", "our_setting", "check", "fast", "slow", "profiles", "workers",
          "seeds", "target", "at_least", "run", "gate"}
OPTIONAL = {"run", "gate"}
RUN_FIELDS = {"seconds", "steps", "lr", "task", "batch_size", "config"}

#: Runs one spec on a cluster of ``workers`` and returns its trace (the plugin's ``squall_run``, or a Lab).
Runner = Callable[[RunSpec, int], RunTrace]


class ClaimError(ValueError):
    """A claim in the registry is malformed; names the claim, the key and what is allowed."""


@dataclass(frozen=True)
class Claim:
    """One paper's claim and our scaled-down test of it."""

    id: str  # registry id
    paper: str  # short citation
    claim: str  # the claim in words
    paper_figure: str  # the paper's number and setting
    our_setting: str  # our scaled-down setting, in words
    check: str  # "speedup" or "speedup_grows"
    fast: str  # protocol expected to be faster
    slow: str  # protocol it is compared with
    profiles: tuple[str, ...]  # one profile (speedup) or the ordered list (speedup_grows)
    workers: int  # cluster size
    seeds: tuple[int, ...]  # seeds, medians over them
    target: Target  # what "reached the target" means
    at_least: float  # threshold on the speed-up (speedup) or on its growth ratio (speedup_grows)
    run: Mapping[str, Any] = field(default_factory=dict)  # RunSpec fields: seconds, lr, config...
    gate: bool = True  # whether CI fails when the claim does not hold (false: reported only)

    def spec(self, protocol: str, profile: str, seed: int) -> RunSpec:
        """The run of ``protocol`` for one seed on one profile."""
        target = {self.target.metric: self.target.value}
        return RunSpec(protocol=protocol, profile=profile, seed=seed, target=target, **dict(self.run))


def _claim(raw: Any, where: str) -> Claim:
    if not isinstance(raw, dict):
        raise ClaimError(f"{where}: a claim must be a mapping with keys {sorted(FIELDS)}")
    name = f"{where} ({raw.get('id', '?')})"
    unknown, missing = sorted(set(raw) - FIELDS), sorted(FIELDS - OPTIONAL - set(raw))
    if unknown or missing:
        raise ClaimError(f"{name}: unknown keys {unknown}, missing keys {missing}; allowed: {sorted(FIELDS)}")
    if raw["check"] not in CHECKS:
        raise ClaimError(f"{name}: check {raw['check']!r} is not one of {list(CHECKS)}")
    run = dict(raw.get("run") or {})
    if set(run) - RUN_FIELDS:
        raise ClaimError(f"{name}: run has unknown keys {sorted(set(run) - RUN_FIELDS)}; allowed: {sorted(RUN_FIELDS)}")
    profiles = tuple(raw["profiles"])
    if (raw["check"] == "speedup") != (len(profiles) == 1) or not profiles:
        raise ClaimError(f"{name}: profiles: 'speedup' takes one profile, 'speedup_grows' two or more")
    target = raw["target"]
    try:
        return Claim(id=str(raw["id"]), paper=str(raw["paper"]), claim=str(raw["claim"]),
                     paper_figure=str(raw["paper_figure"]), our_setting=str(raw["our_setting"]),
                     check=raw["check"], fast=str(raw["fast"]), slow=str(raw["slow"]), profiles=profiles,
                     workers=int(raw["workers"]), seeds=tuple(int(s) for s in raw["seeds"]),
                     target=Target(str(target["metric"]), float(target["value"])), at_least=float(raw["at_least"]),
                     run=run, gate=bool(raw.get("gate", True)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ClaimError(f"{name}: {exc}") from exc


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    """Every claim in the registry file, validated; ids are unique."""
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, list):
        raise ClaimError(f"{path}: the registry must be a list of claims")
    claims = [_claim(item, f"{path}[{k}]") for k, item in enumerate(raw)]
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ClaimError(f"{path}: duplicated claim ids in {ids}")
    return claims


def measure_speedup(claim: Claim, profile: str, run: Runner) -> Verdict:
    """Run fast and slow interleaved over the seeds on ``profile``; the speed-up verdict."""
    fast: list[RunTrace] = []
    slow: list[RunTrace] = []
    for seed in claim.seeds:
        fast.append(run(claim.spec(claim.fast, profile, seed), claim.workers))
        slow.append(run(claim.spec(claim.slow, profile, seed), claim.workers))
    at_least = claim.at_least if claim.check == "speedup" else 0.0
    return speedup(fast, slow, claim.target, at_least=at_least)


def evaluate(claim: Claim, run: Runner) -> ClaimResult:
    """Measure ``claim`` and return it next to the paper's figure."""
    if claim.check == "speedup":
        verdict = measure_speedup(claim, claim.profiles[0], run)
    else:
        verdict = _grows(claim, [measure_speedup(claim, p, run) for p in claim.profiles])
    return ClaimResult(claim.id, claim.paper, claim.claim, claim.paper_figure, claim.our_setting, verdict)


def _grows(claim: Claim, steps: Sequence[Verdict]) -> Verdict:
    expected = f"speed-up increases along {list(claim.profiles)} (each step x{claim.at_least:g} or more)"
    figures = [v.measured for v in steps]
    failed = [f"{p}: {v.why}" for p, v in zip(claim.profiles, steps, strict=True) if v.passed is False]
    if failed:
        return Verdict("speedup_grows", False, figures, expected, "; ".join(failed))
    if any(not isinstance(f, int | float) for f in figures):
        return Verdict("speedup_grows", None, figures, expected,
                       "a speed-up could not be measured: " + "; ".join(v.why for v in steps))
    ratios = [b / a for a, b in itertools.pairwise(figures)]
    passed = all(r > claim.at_least for r in ratios)
    why = ", ".join(f"{p}: {f:.2f}x" for p, f in zip(claim.profiles, figures, strict=True))
    return Verdict("speedup_grows", passed, round(figures[-1] / figures[0], 3), expected, why)
