"""The low-communication family's claims (DiLoCo, Streaming DiLoCo, SPARTA, DeMo): bytes, loss at equal tokens,
peak bandwidth. Each runs its protocols interleaved over the claim's seeds on ``profiles[0]`` with a step budget
and no time budget, so every run trains on the same number of tokens and no stop vote talks in between.

* ``bytes_ratio``: the bytes each worker sent per inner step, ``slow``'s over ``fast``'s, equal
  ``params.ratio`` (DiLoCo: ``H``) to within ``params.tolerance`` (relative; 0 = exactly), for every
  worker and seed, and each run's bytes equal its protocol's own exact formula (the ``avg_bytes_total``
  its algorithm records). Bytes per inner step are counted from the first step record (after the start
  barrier) to the end summary. ``params.counters`` says where the bytes are read: ``transport`` (the
  transport's counters of application messages, message headers included) is the only source today;
  per-link kernel counters (``kernel``) are meant to take its place once the shaping backends record
  them, with a tolerance for TCP/IP headers, retransmissions and the votes.
* ``loss_and_bytes``: every candidate (``fast`` and ``protocols``) against the reference ``slow`` after
  the same steps: its final held-out loss (mean over workers; the median over seeds) at most
  ``1 + params.margin`` times the reference's, and, with ``params.min_bytes_ratio``, the reference's
  bytes per inner step at least that many times the candidate's. Either threshold is one number for
  every candidate or a mapping from candidate to number.
* ``peak_bandwidth``: the largest bytes a worker sent in one step over its mean per step (the peak
  at equal average bytes), ``fast``'s over ``slow``'s, at most ``params.peak_max`` (Streaming DiLoCo:
  about ``1/F``), and, with ``params.margin``, ``fast``'s final loss within it of ``slow``'s. The steps up to
  ``params.from_step`` are left out (Streaming DiLoCo sends nothing in its first ``H`` steps).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from squall.checks import Verdict
from squall.claims.kinds._figures import summaries
from squall.claims.kinds.base import Claim, ClaimKind, Runner, interleaved
from squall.run_trace import RunTrace

COUNTERS = ("transport",)
_RUNS = frozenset({"slow", "profiles", "workers", "seeds", "run"})


def loop_bytes(trace: RunTrace) -> dict[int, int]:
    """Bytes each surviving worker sent from its first step record (after the start barrier) to its end summary."""
    ends = {int(s.get("rank", k)): s for k, s in enumerate(summaries(trace))}
    out = {}
    for w in trace.alive:
        first = [r for r in trace.of(w) if r.step == 0]
        if first and w in ends and isinstance(ends[w].get("bytes_sent"), int):
            out[w] = int(ends[w]["bytes_sent"]) - first[0].bytes_sent
    return out


def formula_bytes(trace: RunTrace) -> dict[int, int]:
    """What each worker's protocol says it sent (its ``avg_bytes_total`` record field)."""
    return {int(s.get("rank", k)): int(s["avg_bytes_total"]) for k, s in enumerate(summaries(trace))
            if isinstance(s.get("avg_bytes_total"), int)}


def steps_of(trace: RunTrace) -> int:
    """Steps the run took (the largest of the workers' summaries)."""
    return max((int(s.get("steps", 0)) for s in summaries(trace)), default=0)


def final_loss(trace: RunTrace) -> float | None:
    """Mean over workers of the final held-out loss (None when a worker has none)."""
    losses = [s.get("final_eval", {}).get("loss") for s in summaries(trace)]
    if not losses or any(not isinstance(v, int | float) for v in losses):
        return None
    return statistics.fmean(float(v) for v in losses)


def per_step_bytes(trace: RunTrace, worker: int) -> list[int]:
    """Bytes the worker sent in each step, from consecutive step records (records every step)."""
    records = sorted((r for r in trace.of(worker) if r.step >= 0), key=lambda r: r.step)
    return [b.bytes_sent - a.bytes_sent for a, b in itertools.pairwise(records) if b.step == a.step + 1]


def bytes_per_step(trace: RunTrace) -> float | None:
    """Median over workers of the bytes sent per inner step."""
    steps, sent = steps_of(trace), loop_bytes(trace)
    return statistics.median(v / steps for v in sent.values()) if steps and sent else None


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if len(known) == len(values) and known else None


def bytes_ratio(claim: Claim, run: Runner) -> Verdict:
    """See the module docstring."""
    p = {"tolerance": 0.0, "counters": "transport", **claim.params}
    ratio, tol = float(p["ratio"]), float(p["tolerance"])
    expected = (f"bytes per inner step of {claim.slow} = {ratio:g} x {claim.fast}'s"
                + (f" (+-{100 * tol:g} %)" if tol else " exactly") + ", and each = its protocol's formula")
    traces = interleaved(claim, claim.profiles[0], run, (claim.fast, claim.slow))
    figures, problems = [], []
    for fast, slow in zip(traces[claim.fast], traces[claim.slow], strict=True):
        bf, bs = loop_bytes(fast), loop_bytes(slow)
        if not bf or set(bf) != set(bs) or steps_of(fast) != steps_of(slow):
            return Verdict(claim.check, None, None, expected, f"seed {fast.seed}: the runs did not record their "
                           f"bytes from step 0 on every worker, or took different steps ({steps_of(fast)}, "
                           f"{steps_of(slow)})")
        for trace, sent in ((fast, bf), (slow, bs)):
            formula = formula_bytes(trace)
            off = {w: (b, formula.get(w)) for w, b in sent.items() if formula.get(w) != b}
            if off:
                problems.append(f"seed {trace.seed} {trace.protocol}: counted != formula on workers {off}")
        for w in bf:
            r = bs[w] / bf[w] if bf[w] else float("inf")
            figures.append(r)
            if abs(bs[w] - ratio * bf[w]) > tol * ratio * bf[w]:
                problems.append(f"seed {fast.seed} worker {w}: {bs[w]} / {bf[w]} = {r:.6g}")
    measured = round(statistics.median(figures), 6)
    per_step = [bytes_per_step(t) for t in traces[claim.fast]]
    why = (f"{claim.slow} sent {measured:g}x the bytes of {claim.fast} per inner step on every worker "
           f"({claim.fast}: {statistics.median(v for v in per_step if v is not None):.0f} B/step, counted by the "
           f"{p['counters']} counters, equal to the formula)") if not problems else "; ".join(problems)
    return Verdict(claim.check, not problems, measured, expected, why)


def _losses(traces: Mapping[str, list[RunTrace]]) -> dict[str, float | None]:
    return {name: _median([final_loss(t) for t in runs]) for name, runs in traces.items()}


def _bytes(traces: Mapping[str, list[RunTrace]]) -> dict[str, float | None]:
    return {name: _median([bytes_per_step(t) for t in runs]) for name, runs in traces.items()}


def _per(value: Any, candidate: str) -> float | None:
    """A threshold for ``candidate``: one number for all, or its entry of a mapping (None: none)."""
    if isinstance(value, Mapping):
        value = value.get(candidate)
    return None if value is None else float(value)


def loss_and_bytes(claim: Claim, run: Runner) -> Verdict:
    """See the module docstring."""
    p = claim.params
    candidates = [c for c in (claim.fast, *claim.protocols) if c]
    margins = {c: _per(p["margin"], c) for c in candidates}
    ratios = {c: _per(p.get("min_bytes_ratio"), c) for c in candidates}
    expected = "; ".join(f"{c}: loss <= (1 + {margins[c]:g}) x {claim.slow}'s"
                         + (f", {ratios[c]:g}x fewer bytes per step" if ratios[c] is not None else "")
                         for c in candidates if margins[c] is not None) + " (equal steps)"
    traces = interleaved(claim, claim.profiles[0], run, (*candidates, claim.slow))
    loss, sent = _losses(traces), _bytes(traces)
    ref, ref_bytes = loss[claim.slow], sent[claim.slow]
    need_bytes = any(r is not None for r in ratios.values())
    if ref is None or any(loss[c] is None for c in candidates) or (
            need_bytes and (not ref_bytes or any(not sent[c] for c in candidates))):
        return Verdict(claim.check, None, {"loss": loss, "bytes_per_step": sent}, expected,
                       "a run has no final loss, or no bytes where a bytes ratio is asked")
    measured: dict[str, Any] = {claim.slow: {"loss": round(ref, 4), "bytes_per_step": _round(ref_bytes)}}
    failed = []
    for c in candidates:
        lc, bc, margin, need = loss[c], sent[c], margins[c], ratios[c]
        assert lc is not None and margin is not None
        gap = lc / ref - 1
        ratio = ref_bytes / bc if ref_bytes and bc else None
        measured[c] = {"loss": round(lc, 4), "gap": round(gap, 4), "bytes_per_step": _round(bc),
                       "bytes_ratio": None if ratio is None else round(ratio, 2)}
        if gap > margin:
            failed.append(f"{c}: loss {lc:.4f} is {100 * gap:+.1f} % of {claim.slow}'s {ref:.4f}, beyond "
                          f"{100 * margin:+g} %")
        if need is not None and (ratio is None or ratio < need):
            failed.append(f"{c}: {ratio}x fewer bytes per step, below {need:g}x")
    why = "; ".join(failed) or ", ".join(
        f"{c}: {100 * measured[c]['gap']:+.1f} % loss" + (f", {measured[c]['bytes_ratio']:g}x fewer bytes"
                                                          if measured[c]["bytes_ratio"] else "") for c in candidates)
    return Verdict(claim.check, not failed, measured, expected, why)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value)


def _margins(claim: Claim) -> None:
    _step_budget(claim)
    candidates = [c for c in (claim.fast, *claim.protocols) if c]
    if not candidates:
        raise ValueError("fast or protocols: a loss_and_bytes claim needs at least one candidate")
    for key in ("margin", "min_bytes_ratio"):
        value = claim.params.get(key)
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(candidates))
            if unknown or (key == "margin" and set(value) != set(candidates)):
                raise ValueError(f"params.{key} names {sorted(value)}; its candidates are {candidates}")


def normalised_peak(trace: RunTrace, from_step: int = 0) -> float | None:
    """Median over workers of (the most bytes sent in one step) / (the mean bytes per step), over the steps after
    ``from_step``."""
    peaks = []
    for w in trace.alive:
        steps = per_step_bytes(trace, w)[from_step:]
        total = sum(steps)
        if steps and total:
            peaks.append(max(steps) / (total / len(steps)))
    return statistics.median(peaks) if peaks else None


def peak_bandwidth(claim: Claim, run: Runner) -> Verdict:
    """See the module docstring."""
    p = claim.params
    peak_max = float(p["peak_max"])
    margin = None if p.get("margin") is None else float(p["margin"])
    expected = f"{claim.fast}'s peak bytes per step at equal mean <= {peak_max:g} x {claim.slow}'s" + (
        "" if margin is None else f"; final loss <= (1 + {margin:g}) x {claim.slow}'s")
    traces = interleaved(claim, claim.profiles[0], run, (claim.fast, claim.slow))
    start = int(p.get("from_step", 0))
    peaks = {name: _median([normalised_peak(t, start) for t in runs]) for name, runs in traces.items()}
    loss = _losses(traces)
    pf, ps, lf, ls = peaks[claim.fast], peaks[claim.slow], loss[claim.fast], loss[claim.slow]
    if pf is None or ps is None or lf is None or ls is None:
        return Verdict(claim.check, None, {"peaks": peaks, "loss": loss}, expected, "a run has no per-step bytes "
                       "or no final loss (records every step are needed: metrics_every 1)")
    ratio, gap = pf / ps, lf / ls - 1
    measured = {"peak_ratio": round(ratio, 4), f"{claim.fast}_peak_over_mean": round(pf, 2),
                f"{claim.slow}_peak_over_mean": round(ps, 2), "loss_gap": round(gap, 4),
                "loss": {k: None if v is None else round(v, 4) for k, v in loss.items()}}
    failed = [f"peak ratio {ratio:.3f} > {peak_max:g}"] if ratio > peak_max else []
    failed += [f"loss {100 * gap:+.1f} % > {100 * margin:g} %"] if margin is not None and gap > margin else []
    why = "; ".join(failed) or (f"peak at equal mean bytes {ratio:.3f}x {claim.slow}'s, loss {100 * gap:+.1f} %")
    return Verdict(claim.check, not failed, measured, expected, why)


def _step_budget(claim: Claim) -> None:
    if "steps" not in claim.run or "seconds" in claim.run:
        raise ValueError("run: these claims compare runs at equal tokens: give steps and no seconds")


def _bytes_ratio_params(claim: Claim) -> None:
    _step_budget(claim)
    if claim.params.get("counters", "transport") not in COUNTERS:
        raise ValueError(f"params.counters must be one of {COUNTERS} (kernel counters are not recorded yet)")


KINDS = (
    ClaimKind("bytes_ratio", frozenset({"fast", *_RUNS}), bytes_ratio, params=frozenset({"ratio", "tolerance",
              "counters"}), required_params=frozenset({"ratio"}), validate=_bytes_ratio_params),
    ClaimKind("loss_and_bytes", _RUNS, loss_and_bytes, accepts=frozenset({"fast", "protocols"}),
              params=frozenset({"margin", "min_bytes_ratio"}), required_params=frozenset({"margin"}),
              validate=_margins),
    ClaimKind("peak_bandwidth", frozenset({"fast", *_RUNS}), peak_bandwidth,
              params=frozenset({"peak_max", "margin", "from_step"}), required_params=frozenset({"peak_max"}),
              validate=_step_budget),
)
