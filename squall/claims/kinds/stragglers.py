"""Straggler claims (DropCompute): robustness at equal steps, overhead against scale, threshold.

The claims: docs/protocols/dropcompute.md.

``straggler_robustness`` (T4.1): ``fast`` (a thresholded protocol) and ``slow`` (the same without a
threshold) run the same steps interleaved over seeds on one profile. From step ``params.from_step`` on:

* step-time speed-up = mean step time of ``slow`` / of ``fast`` (medians over seeds) >= ``step_speedup``;
* effective speed-up = step-time speed-up x (1 - drop rate) >= ``effective_speedup`` (completed samples
  per second, the paper's definition);
* drop rate (every worker's dropped micro-batches / all micro-batches over the same steps, from the
  records' ``drop_rate``) <= ``max_drop_rate``;
* final held-out accuracy of ``fast`` >= that of ``slow`` - ``accuracy_gap``.

``straggler_overhead`` (T4.1, the scale curve): for each cluster size in ``params.workers``, the
straggler overhead E[sync compute] / E[mean worker compute] of both protocols, where a step's sync
compute is the slowest worker's compute phase (a lock-step step waits for it) and a worker's compute
is its micro-batch time x M (what it would take for the whole batch). ``slow``'s overhead must grow
from the first size to the last by more than ``grows_by`` while ``fast``'s stays within ``flat_within``
of its first value.

``threshold_choice`` (T4.2): the automatic threshold of ``fast`` lies within ``params.band`` x M t0
(t0: the median micro-batch time the choice was made from) and the realised effective speed-up is
within ``params.effective_rel`` of the predicted one. The band is on the time a worker at nominal
speed ends its compute (the planning simulation of docs/protocols/dropcompute.md counts a micro-batch
only if it *ends* by tau).
With ``params.threshold_at: start`` (DropCompute's runtime here, like the paper code, checks the
timer before a micro-batch *starts*, so a started one runs to its end) that end is tau + t0, and the
position reported is (tau + t0) / (M t0); with ``end`` it is tau / (M t0).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from typing import Any

from squall.checks import Verdict
from squall.claims.kinds._figures import final_accuracy, mean_extra, median, steps_from, summary_values
from squall.claims.kinds.base import Claim, ClaimKind, Runner, interleaved
from squall.run_trace import RunTrace

_PAIR = frozenset({"fast", "slow", "profiles", "workers", "seeds", "run"})


def _one_profile(claim: Claim) -> None:
    if len(claim.profiles) != 1:
        raise ValueError(f"profiles: a {claim.check!r} claim takes one profile, got {list(claim.profiles)}")


def _step_time(trace: RunTrace, first: int) -> float | None:
    return mean_extra(steps_from(trace, first), "step_s")


def _drop_rate(trace: RunTrace, first: int) -> float | None:
    """Dropped micro-batches / all micro-batches over the steps from ``first`` on (every worker's records)."""
    return mean_extra(steps_from(trace, first), "drop_rate")


def robustness(claim: Claim, run: Runner) -> Verdict:
    """T4.1's four checks at equal steps (see the module docstring)."""
    p = {"from_step": 0, "step_speedup": 1.6, "effective_speedup": 1.4, "max_drop_rate": 0.1, "accuracy_gap": 0.01,
         **claim.params}
    first = int(p["from_step"])
    expected = (f"steps {p['step_speedup']:g}x+, effective {p['effective_speedup']:g}x+, drop <= "
                f"{100 * p['max_drop_rate']:g} %, accuracy >= baseline - {100 * p['accuracy_gap']:g} points")
    traces = interleaved(claim, claim.profiles[0], run, (claim.fast, claim.slow))
    ratios, drops, gaps = [], [], []
    for fast, slow in zip(traces[claim.fast], traces[claim.slow], strict=True):
        t_fast, t_slow = _step_time(fast, first), _step_time(slow, first)
        drop, acc_fast, acc_slow = _drop_rate(fast, first), final_accuracy(fast), final_accuracy(slow)
        if None in (t_fast, t_slow, drop, acc_fast, acc_slow):
            return Verdict(claim.check, None, None, expected,
                           f"seed {fast.seed}: a figure is missing (step time {t_fast}/{t_slow}, drop rate {drop}, "
                           f"accuracy {acc_fast}/{acc_slow}): did both runs record step_s, evaluate and finish?")
        assert t_fast is not None and t_slow is not None and drop is not None
        assert acc_fast is not None and acc_slow is not None
        ratios.append(t_slow / t_fast)
        drops.append(drop)
        gaps.append(acc_slow - acc_fast)
    step, drop, gap = statistics.median(ratios), statistics.median(drops), statistics.median(gaps)
    effective = step * (1 - drop)
    measured = {"step_speedup": round(step, 3), "effective_speedup": round(effective, 3),
                "drop_rate": round(drop, 4), "accuracy_gap": round(gap, 4)}
    failed = [name for name, ok in (("step speed-up", step >= p["step_speedup"]),
                                    ("effective speed-up", effective >= p["effective_speedup"]),
                                    ("drop rate", drop <= p["max_drop_rate"]),
                                    ("accuracy", gap <= p["accuracy_gap"])) if not ok]
    why = (f"medians over {len(ratios)} seeds from step {first}: steps {step:.2f}x, effective {effective:.2f}x, "
           f"{100 * drop:.1f} % dropped, accuracy {100 * gap:+.2f} points behind the baseline")
    if failed:
        why = f"{', '.join(failed)} short: {why}"
    return Verdict(claim.check, not failed, measured, expected, why)


def overhead(trace: RunTrace, first: int) -> float | None:
    """E[slowest worker's compute phase] / E[a worker's micro-batch time x M], steps from ``first`` on."""
    micro = [int(m) for m in summary_values(trace, "micro_batches")]
    if not micro:
        return None
    per_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in steps_from(trace, first):
        phase = r.extra.get("compute_s", 0.0) + r.extra.get("sleep_s", 0.0)
        if "microbatch_s" in r.extra and phase > 0:
            per_step[r.step].append((phase, r.extra["microbatch_s"] * micro[0]))
    rows = [rows for rows in per_step.values() if len(rows) == len(trace.alive)]
    if not rows:
        return None
    sync = statistics.fmean(max(phase for phase, _ in rs) for rs in rows)
    worker = statistics.fmean(whole for rs in rows for _, whole in rs)
    return sync / worker


def scale_curve(claim: Claim, run: Runner) -> Verdict:
    """T4.1's overhead curve over cluster sizes (see the module docstring)."""
    p = {"from_step": 0, "flat_within": 0.1, "grows_by": 0.1, **claim.params}
    sizes = [int(n) for n in p["workers"]]
    first = int(p["from_step"])
    expected = (f"{claim.slow}'s overhead grows by > {100 * p['grows_by']:g} % from {sizes[0]} to {sizes[-1]} "
                f"workers; {claim.fast}'s stays within {100 * p['flat_within']:g} %")
    curve: dict[str, list[float]] = {claim.fast: [], claim.slow: []}
    for n in sizes:
        sized = dataclasses.replace(claim, workers=n)
        traces = interleaved(sized, claim.profiles[0], run, (claim.fast, claim.slow))
        for name, runs in traces.items():
            figures = [o for t in runs if (o := overhead(t, first)) is not None]
            if not figures:
                return Verdict(claim.check, None, curve, expected,
                               f"{name} at {n} workers: no step with every worker's compute_s, sleep_s and "
                               "microbatch_s, or no micro_batches in the summaries")
            curve[name].append(round(statistics.median(figures), 3))
    slow, fast = curve[claim.slow], curve[claim.fast]
    grows = slow[-1] > slow[0] * (1 + p["grows_by"])
    flat = max(abs(f / fast[0] - 1) for f in fast) <= p["flat_within"]
    measured = {f"{name} overhead": dict(zip(sizes, values, strict=True)) for name, values in curve.items()}
    why = (f"overhead at {sizes} workers: {claim.slow} {slow}, {claim.fast} {fast}"
           + ("" if grows else f"; {claim.slow}'s does not grow") + ("" if flat else f"; {claim.fast}'s is not flat"))
    return Verdict(claim.check, grows and flat, measured, expected, why)


def threshold(claim: Claim, run: Runner) -> Verdict:
    """T4.2 (see the module docstring): one run of ``fast`` per seed."""
    p: dict[str, Any] = {"band": [1.0, 1.5], "effective_rel": 0.15, "threshold_at": "start", **claim.params}
    lo, hi = float(p["band"][0]), float(p["band"][1])
    at_start = p["threshold_at"] == "start"
    end = "tau + t0" if at_start else "tau"
    expected = (f"{end} in [{lo:g}, {hi:g}] x M t0; realised effective speed-up within "
                f"{100 * p['effective_rel']:g} % of predicted")
    positions, errors = [], []
    for seed in claim.seeds:
        trace = run(claim.spec(claim.fast, claim.profiles[0], seed), claim.workers)
        tau = median(float(v) for v in summary_values(trace, "tau_s"))
        t0 = median(float(v) for v in summary_values(trace, "microbatch_s_median"))
        micro = median(float(v) for v in summary_values(trace, "micro_batches"))
        predicted = median(float(v) for v in summary_values(trace, "effective_speedup_est"))
        realised = median(float(v) for v in summary_values(trace, "effective_speedup_measured"))
        if None in (tau, t0, micro, predicted, realised):
            return Verdict(claim.check, None, None, expected,
                           f"seed {seed}: the summaries lack a figure (tau {tau}, t0 {t0}, M {micro}, predicted "
                           f"{predicted}, realised {realised}): did the run pass the threshold step?")
        assert tau is not None and t0 is not None and micro is not None
        assert predicted is not None and realised is not None
        positions.append((tau + t0 if at_start else tau) / (micro * t0))
        errors.append(realised / predicted - 1)
    position, error = statistics.median(positions), statistics.median(errors)
    ok_band, ok_pred = lo <= position <= hi, abs(error) <= p["effective_rel"]
    measured = {"end_over_M_t0": round(position, 3), "effective_error": round(error, 3)}
    why = (f"medians over {len(positions)} seeds: {end} = {position:.2f} M t0, realised effective speed-up "
           f"{100 * error:+.1f} % from predicted" + ("" if ok_band else "; tau outside the band")
           + ("" if ok_pred else "; prediction missed"))
    return Verdict(claim.check, ok_band and ok_pred, measured, expected, why)


def _threshold_params(claim: Claim) -> None:
    _one_profile(claim)
    if claim.params.get("threshold_at", "start") not in ("start", "end"):
        raise ValueError(f"params.threshold_at: 'start' or 'end', got {claim.params['threshold_at']!r}")


def _sizes(claim: Claim) -> None:
    _one_profile(claim)
    sizes = claim.params.get("workers")
    if not isinstance(sizes, list) or len(sizes) < 2 or not all(isinstance(n, int) and n >= 2 for n in sizes):
        raise ValueError(f"params.workers: a list of two or more cluster sizes >= 2, got {sizes!r}")


KINDS = (
    ClaimKind("straggler_robustness", _PAIR, robustness, validate=_one_profile,
              params=frozenset({"from_step", "step_speedup", "effective_speedup", "max_drop_rate", "accuracy_gap"})),
    ClaimKind("straggler_overhead", frozenset({"fast", "slow", "profiles", "seeds", "run"}), scale_curve,
              params=frozenset({"workers", "from_step", "flat_within", "grows_by"}),
              required_params=frozenset({"workers"}), validate=_sizes),
    ClaimKind("threshold_choice", frozenset({"fast", "profiles", "workers", "seeds", "run"}), threshold,
              validate=_threshold_params, params=frozenset({"band", "effective_rel", "threshold_at"})),
)
