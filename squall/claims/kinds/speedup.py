"""``speedup`` and ``speedup_grows``: one protocol reaches the target faster than another.

``speedup``: time-to-target(slow) / time-to-target(fast) >= ``at_least``, medians over seeds, runs
interleaved on one cluster and one profile. ``speedup_grows``: the same speed-up measured on each of
``profiles`` must increase along the list, by more than ``at_least`` per step.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from squall.checks import Validity, Verdict, merge, speedup
from squall.claims.kinds.base import Claim, ClaimKind, Runner, interleaved

_NEEDS = frozenset({"fast", "slow", "profiles", "workers", "seeds", "target", "at_least"})


def measure_speedup(claim: Claim, profile: str, run: Runner, *, at_least: float) -> Verdict:
    """Run fast and slow interleaved over the seeds on ``profile``; the speed-up verdict."""
    assert claim.target is not None  # required by both kinds
    traces = interleaved(claim, profile, run, (claim.fast, claim.slow))
    return speedup(traces[claim.fast], traces[claim.slow], claim.target, at_least=at_least)


def _one(claim: Claim, run: Runner) -> Verdict:
    assert claim.at_least is not None
    return measure_speedup(claim, claim.profiles[0], run, at_least=claim.at_least)


def _grows(claim: Claim, run: Runner) -> Verdict:
    return growth(claim, [measure_speedup(claim, p, run, at_least=0.0) for p in claim.profiles])


def growth(claim: Claim, steps: Sequence[Verdict]) -> Verdict:
    """The ``speedup_grows`` verdict from one speed-up verdict per profile."""
    at_least = claim.at_least or 0.0
    expected = f"speed-up increases along {list(claim.profiles)} (each step x{at_least:g} or more)"
    figures = [v.measured for v in steps]
    validity = merge(v.validity for v in steps)
    if validity is Validity.FAIL:
        failed = [f"{p}: {v.why}" for p, v in zip(claim.profiles, steps, strict=True) if v.validity is Validity.FAIL]
        return Verdict("speedup_grows", False, figures, expected, "; ".join(failed))
    if validity is Validity.UNKNOWN or any(not isinstance(f, int | float) for f in figures):
        return Verdict("speedup_grows", None, figures, expected,
                       "a speed-up could not be measured: " + "; ".join(v.why for v in steps))
    ratios = [b / a for a, b in itertools.pairwise(figures)]
    passed = all(r > at_least for r in ratios)
    why = ", ".join(f"{p}: {f:.2f}x" for p, f in zip(claim.profiles, figures, strict=True))
    return Verdict("speedup_grows", passed, round(figures[-1] / figures[0], 3), expected, why)


def _one_profile(claim: Claim) -> None:
    if len(claim.profiles) != 1:
        raise ValueError("profiles: 'speedup' takes one profile, 'speedup_grows' two or more")


def _several_profiles(claim: Claim) -> None:
    if len(claim.profiles) < 2:
        raise ValueError("profiles: 'speedup' takes one profile, 'speedup_grows' two or more")


KINDS = (
    ClaimKind("speedup", _NEEDS, _one, accepts=frozenset({"run"}), validate=_one_profile),
    ClaimKind("speedup_grows", _NEEDS, _grows, accepts=frozenset({"run"}), validate=_several_profiles),
)
