"""``loss_per_sample`` (Non-blocking SGD, T5.1): the same loss for the same samples, and no sample lost.

Non-blocking SGD's speed comes from not waiting, not from better updates: at equal samples trained
on, its training loss must stay within ``params.max_rel`` of the blocking baseline's, and every
epoch of every worker must hold the same number of samples (none lost when a batch is cut short,
none counted twice when it is resumed).

Samples of a step: the sum over workers of ``fast``'s cumulative counts ``extra[params.samples_field]``;
``slow`` trains one full batch per worker per step, so ``step x batch_size`` each. The loss of a step
is the mean over workers; the loss compared at a sample count is the mean over the steps within
+-``params.window`` (relative) of it, at ``params.points`` fractions of the range both runs covered.
Epoch sizes come from ``fast``'s end summaries (``params.epochs_field``, a list per worker).
"""

from __future__ import annotations

import statistics
from typing import Any

from squall.checks import Verdict
from squall.claims.kinds._figures import summary_values
from squall.claims.kinds.base import Claim, ClaimKind, Runner, interleaved
from squall.run_trace import RunTrace

DEFAULTS: dict[str, Any] = {"max_rel": 0.05, "window": 0.1, "points": [0.25, 0.5, 0.75, 1.0]}


def loss_by_samples(trace: RunTrace, samples_of: Any) -> list[tuple[float, float]]:
    """``(samples trained on by all workers together, mean training loss)`` per step, by samples.

    A lock-step step ``k`` is one point: its samples are the sum over the surviving workers of each
    one's cumulative count at that step (a slow worker contributes fewer), its loss their mean.
    Steps some worker did not record are left out.
    """
    alive = set(trace.alive)
    by_step: dict[int, list[tuple[float, float]]] = {}
    for r in trace.records:
        if r.worker in alive and r.step >= 1 and r.loss is not None:
            by_step.setdefault(r.step, []).append((float(samples_of(r)), r.loss))
    rows = [(sum(s for s, _ in recs), statistics.fmean(loss for _, loss in recs))
            for recs in by_step.values() if len(recs) == len(alive)]
    return sorted(row for row in rows if row[0] > 0)


def loss_at(rows: list[tuple[float, float]], samples: float, window: float) -> float | None:
    """Mean loss of the rows within ``samples`` x (1 +- window)."""
    near = [loss for s, loss in rows if abs(s - samples) <= window * samples]
    return statistics.fmean(near) if near else None


def lost_samples(trace: RunTrace, field: str) -> str | None:
    """Why the epoch accounting is wrong, or None when every finished epoch of every worker is the same size."""
    sizes = [list(v) for v in summary_values(trace, field) if isinstance(v, list)]
    if len(sizes) < len(trace.alive):
        return f"{len(sizes)} of {len(trace.alive)} workers reported {field!r}"
    uneven = {tuple(sorted(set(s))) for s in sizes if len(set(s)) > 1}
    if uneven:
        return f"epochs of unequal size {sorted(uneven)}: samples lost or counted twice"
    return None


def compare(claim: Claim, run: Runner) -> Verdict:
    """See the module docstring."""
    p = {**DEFAULTS, **claim.params}
    expected = f"training loss at equal samples within {100 * p['max_rel']:g} % of {claim.slow}'s; equal epochs"
    traces = interleaved(claim, claim.profiles[0], run, (claim.fast, claim.slow))
    worst: list[float] = []
    for fast, slow in zip(traces[claim.fast], traces[claim.slow], strict=True):
        problem = lost_samples(fast, str(p["epochs_field"])) if "epochs_field" in p else None
        if problem is not None:
            return Verdict(claim.check, False, None, expected, f"seed {fast.seed}: {problem}")
        batch, field = claim.spec(claim.slow, claim.profiles[0], slow.seed).batch_size, str(p["samples_field"])
        a = loss_by_samples(fast, lambda r, f=field: r.extra.get(f, 0.0))
        b = loss_by_samples(slow, lambda r, n=batch: r.step * n)
        if not a or not b:
            return Verdict(claim.check, None, None, expected,
                           f"seed {fast.seed}: no training loss against samples ({len(a)}/{len(b)} records; "
                           f"does {claim.fast} record {p['samples_field']!r}?)")
        top = min(a[-1][0], b[-1][0])
        gaps = []
        for fraction in p["points"]:
            la, lb = loss_at(a, fraction * top, p["window"]), loss_at(b, fraction * top, p["window"])
            if la is not None and lb is not None and lb > 0:
                gaps.append(la / lb - 1)
        if not gaps:
            return Verdict(claim.check, None, None, expected, f"seed {fast.seed}: no sample count both runs logged")
        worst.append(max(gaps, key=abs))
    figure = statistics.median(worst)
    side = "lower" if figure < 0 else "higher"
    why = (f"{claim.fast}'s training loss at equal samples is up to {100 * abs(figure):.1f} % {side} than "
           f"{claim.slow}'s (median over {len(worst)} seeds of the largest gap; per seed: "
           f"{', '.join(f'{100 * w:+.1f} %' for w in worst)})")
    return Verdict(claim.check, abs(figure) <= p["max_rel"], round(figure, 4), expected, why)


KIND = ClaimKind("loss_per_sample", frozenset({"fast", "slow", "profiles", "workers", "seeds", "run"}), compare,
                 params=frozenset({"samples_field", "epochs_field", "max_rel", "window", "points"}),
                 required_params=frozenset({"samples_field"}))
