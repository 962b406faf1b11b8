"""Claims of training under packet loss (docs/protocols/lossy_sgd.md) measured in containers on real dropped packets.

``drift_bounded`` (T7.2): ``fast`` (a protocol whose owners record their share of the drift, see
:func:`squall.checks.drift.owner_drift_series`) runs on each of ``profiles`` (one seed each of
``seeds``); on every one its mean drift from the owners over the late window must be at most
``at_most`` x its mid-run drift (:func:`~squall.checks.drift.owner_drift_bounded`), and below the
analytic bound ``c lr^2 G^2 p / (1 - p)`` (:func:`~squall.checks.drift.analytic_bound`; ``c`` =
``params.c``, default 10; ``p`` the loss measured from the run's datagram counters; ``G^2`` the late
window's mean squared norm of the reconstructed gradient) when the run records them. ``slow``, the
control without resync, runs on ``params.control_profile`` (default: the first profile) and its
late/early drift ratio must be at least ``params.control_growth`` (it grows).

``loss_accuracy`` (T7.3): ``fast`` runs on ``profiles[0]`` (lossy) and ``profiles[1]`` (lossless) with
the same steps and seeds; the median final accuracy on the lossy profile must be within ``at_most``
(absolute) of the lossless one.
"""

from __future__ import annotations

import statistics

from squall.checks import Validity, Verdict, merge
from squall.checks.drift import analytic_bound, owner_drift_bounded, owner_drift_grows
from squall.claims.kinds._figures import final_accuracy, summaries
from squall.claims.kinds.base import Claim, ClaimKind, Runner
from squall.run_trace import RunTrace


def measured_loss(trace: RunTrace) -> float | None:
    """1 - received / sent data datagrams over every directed link (end summaries' ``sent_to``/``received_from``)."""
    by_rank = {s["rank"]: s for s in summaries(trace) if "sent_to" in s and "received_from" in s}
    ranks = sorted(by_rank)
    sent = sum(by_rank[i]["sent_to"][j] for i in ranks for j in ranks if i != j)
    received = sum(by_rank[j]["received_from"][i] for i in ranks for j in ranks if i != j)
    return None if sent == 0 else 1 - received / sent


def bounded(claim: Claim, run: Runner) -> Verdict:
    """T7.2 (see the module docstring)."""
    growth = 2.0 if claim.at_most is None else claim.at_most
    control_growth = float(claim.params.get("control_growth", 3.0))
    control_profile = str(claim.params.get("control_profile", claim.profiles[0]))
    measured: dict[str, object] = {}
    parts: list[tuple[str, Verdict]] = []

    def note(key: str, v: Verdict) -> None:
        measured[key] = v.measured
        parts.append((key, v))

    c = float(claim.params.get("c", 10.0))
    for profile in claim.profiles:
        for seed in claim.seeds:
            spec = claim.spec(claim.fast, profile, seed)
            trace = run(spec, claim.workers)
            loss = measured_loss(trace)
            bound = None if loss is None else analytic_bound(trace, lr=spec.lr, loss=loss, c=c)
            verdict = owner_drift_bounded(trace, max_growth=growth, bound=bound)
            figures = verdict.measured if isinstance(verdict.measured, dict) else {}
            note(f"{profile}/{seed}", verdict)
            measured[f"{profile}/{seed}"] = {**figures, "measured_loss": loss, "bound": bound}
    for seed in claim.seeds:
        note(f"control {control_profile}/{seed}",
             owner_drift_grows(run(claim.spec(claim.slow, control_profile, seed), claim.workers),
                               min_growth=control_growth))
    expected = (f"late/mid drift <= {growth:g} and late drift <= {c:g} lr^2 G^2 p/(1-p) on {list(claim.profiles)}; "
                f"the control's late/early >= {control_growth:g}")
    validity = merge(v.validity for _, v in parts)
    if validity is Validity.PASS:
        return Verdict("drift_bounded", True, measured, expected, "bounded on every profile, the control grows")
    why = "; ".join(f"{key}: {v.why}" for key, v in parts if v.validity is validity)
    return Verdict("drift_bounded", validity.passed, measured, expected, why)


def accuracy(claim: Claim, run: Runner) -> Verdict:
    """T7.3 (see the module docstring)."""
    gap = 0.01 if claim.at_most is None else claim.at_most
    lossy_profile, clean_profile = claim.profiles
    figures: dict[str, list[float]] = {lossy_profile: [], clean_profile: []}
    for seed in claim.seeds:
        for profile in (lossy_profile, clean_profile):
            acc = final_accuracy(run(claim.spec(claim.fast, profile, seed), claim.workers))
            if acc is not None:
                figures[profile].append(acc)
    expected = f"final accuracy on {lossy_profile} >= that on {clean_profile} - {gap:g}"
    if not figures[lossy_profile] or not figures[clean_profile]:
        return Verdict("loss_accuracy", None, figures, expected, "a run never evaluated")
    lossy, clean = statistics.median(figures[lossy_profile]), statistics.median(figures[clean_profile])
    measured = {"lossy": round(lossy, 4), "lossless": round(clean, 4), "gap": round(clean - lossy, 4)}
    return Verdict("loss_accuracy", clean - lossy <= gap, measured, expected,
                   f"{lossy:.4f} with loss, {clean:.4f} without")


def _two_profiles(claim: Claim) -> None:
    if len(claim.profiles) != 2:
        raise ValueError(f"profiles: a 'loss_accuracy' claim takes [lossy, lossless], got {list(claim.profiles)}")


KINDS = (
    ClaimKind("drift_bounded", frozenset({"fast", "slow", "profiles", "workers", "seeds", "run"}), bounded,
              accepts=frozenset({"at_most"}), params=frozenset({"control_growth", "control_profile", "c"})),
    ClaimKind("loss_accuracy", frozenset({"fast", "profiles", "workers", "seeds", "run"}), accuracy,
              accepts=frozenset({"at_most"}), validate=_two_profiles),
)
