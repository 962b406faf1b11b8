"""Compute utilization of runs on an emulated device: measured, predicted by the alpha-beta model, and their ratio.

Compute utilization is the emulated compute time over the time the steps took (compute, the device's
padding and the protocol's communication; the harness's evaluations and stop votes are not counted).

Measured. Over a window of whole periods, where a period is the steps between two averages of the
same state (``sync_every`` for DiLoCo and Streaming DiLoCo, 1 for DDP): the steps ``(P + tau, kP + tau]``
of each worker's records, ``P`` the period, ``tau`` the overlap, ``k`` as large as the run allows. The
first period is left out (Streaming DiLoCo sends its first fragment only after ``H`` steps), and the
window ends where the last average in it was merged. Each step counts ``step_time_s`` of emulated
compute (the grid's devices have no slow-down or noise); the figure is the mean over workers.

Predicted (LOW-COMMUNICATION section 5, with the busiest link): one average costs
``T = hops x alpha + link_bytes / B``, where ``alpha`` is the profile's one-way delay, ``B`` its
per-link rate, ``hops`` the latencies the collective pays (``2 (n-1)`` for the ring, 2 for the
compressed two-step, 1 for an all-gather) and ``link_bytes`` the most bytes a worker puts on one
link for it (what the protocol records as ``avg_link_bytes``: every byte of the ring goes to the next
rank; the two-step's and the all-gather's go to all peers at once, each on its own shaped link). With
``P`` inner steps of ``t_c`` between averages and an overlap of ``tau`` steps::

    U = P t_c / (P t_c + max(0, T - tau t_c))

A difference of more than :data:`FINDING` between the two is a finding, not a failure: the model has
no TCP slow start or window limit, no Python CPU time, no shaping daemon, and counts the links as
independent.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from squall.profiles import ProfileError, load_profile
from squall.run_trace import RunTrace

#: A measured utilization off its prediction by more than this (relative) is reported as a finding.
FINDING: Final = 0.15


@dataclass(frozen=True)
class Utilization:
    """One run's compute utilization and the alpha-beta model's prediction for it."""

    protocol: str
    profile: str
    workers: int
    seed: int
    step_time_s: float  # t_c, the emulated compute of one step
    period: int  # P, inner steps between averages
    overlap: int  # tau, inner steps an average may take before it is waited for
    link_bytes: int  # bytes of one average on the busiest link
    hops: int  # latencies one average costs
    alpha_s: float | None  # the profile's one-way delay (None: the profile could not be read)
    rate_bps: int | None  # the profile's per-link rate (None: unlimited)
    measured: float | None  # None: no complete window
    steps: int  # steps in the measured window (per worker)
    valid: bool  # the emulation held on every worker (no real compute over the emulated steps)

    @property
    def comm_s(self) -> float | None:
        """The model's time for one average."""
        if self.alpha_s is None:
            return None
        bandwidth = self.link_bytes * 8 / self.rate_bps if self.rate_bps else 0.0
        return self.hops * self.alpha_s + bandwidth

    @property
    def predicted(self) -> float | None:
        """``P t_c / (P t_c + max(0, T - tau t_c))``."""
        t = self.comm_s
        if t is None:
            return None
        compute = self.period * self.step_time_s
        return compute / (compute + max(0.0, t - self.overlap * self.step_time_s))

    @property
    def ratio(self) -> float | None:
        """Measured over predicted."""
        p = self.predicted
        return None if p is None or self.measured is None or p == 0 else self.measured / p

    @property
    def finding(self) -> bool:
        """True when measured and predicted differ by more than :data:`FINDING`."""
        return self.ratio is not None and abs(self.ratio - 1) > FINDING


def _summaries(trace: RunTrace) -> list[Mapping[str, Any]]:
    return [s for s in trace.meta.summaries if isinstance(s, Mapping)]


def _link(profile: str, workers: int) -> tuple[float | None, int | None]:
    try:
        spec = load_profile(profile).link(0, 1 % max(workers, 2), max(workers, 2))
    except (ProfileError, OSError):
        return None, None
    return spec.delay_us / 1e6, spec.rate_bps


def window_utilization(trace: RunTrace, *, step_time_s: float, period: int, overlap: int) -> tuple[float | None, int]:
    """Mean over workers of emulated compute over step time in the steps ``(P + tau, kP + tau]``."""
    values, sizes = [], []
    for w in trace.alive:
        records = {r.step: r for r in trace.of(w) if r.step > 0 and "step_s" in r.extra}
        if not records:
            continue
        last = max(records)
        k = (last - overlap) // period
        window = [records[s] for s in range(period + overlap + 1, k * period + overlap + 1) if s in records]
        if k < 2 or not window:
            continue
        values.append(len(window) * step_time_s / sum(r.extra["step_s"] for r in window))
        sizes.append(len(window))
    return (statistics.fmean(values), min(sizes)) if values else (None, 0)


def utilization(trace: RunTrace) -> Utilization | None:
    """The run's :class:`Utilization`; None when it ran on no emulated step time or records no averages."""
    ends = _summaries(trace)
    devices = [s.get("device") for s in ends]
    if not ends or not all(isinstance(d, Mapping) and d.get("step_time_s") for d in devices):
        return None
    first = ends[0]
    if not all(isinstance(first.get(k), int) for k in ("avg_every", "avg_link_bytes", "avg_hops")):
        return None
    step_time = float(devices[0]["step_time_s"])  # type: ignore[index]
    period, overlap = int(first["avg_every"]), int(first.get("overlap_steps") or 0)
    measured, steps = window_utilization(trace, step_time_s=step_time, period=period, overlap=overlap)
    alpha, rate = _link(trace.profile, trace.workers)
    return Utilization(trace.protocol, trace.profile, trace.workers, trace.seed, step_time, period, overlap,
                       int(first["avg_link_bytes"]), int(first["avg_hops"]), alpha, rate, measured, steps,
                       all(bool(d.get("valid")) for d in devices if isinstance(d, Mapping)))


def utilizations(traces: Sequence[RunTrace]) -> list[Utilization]:
    """Every run that has one."""
    return [u for t in traces if (u := utilization(t)) is not None]


HEAD: Final = ["protocol", "profile", "one-way delay ms", "rate Mbit/s", "t_c ms", "period", "overlap",
               "bytes per average on a link", "measured U", "predicted U", "measured / predicted", "emulation"]


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def rows(cells: Sequence[Utilization]) -> list[list[str]]:
    """One table row per run."""
    return [[u.protocol, u.profile, _num(None if u.alpha_s is None else u.alpha_s * 1e3, ".3g"),
             "unlimited" if u.rate_bps is None else f"{u.rate_bps / 1e6:g}", f"{u.step_time_s * 1e3:g}",
             str(u.period), str(u.overlap), f"{u.link_bytes:,}", _num(u.measured, ".3f"), _num(u.predicted, ".3f"),
             _num(u.ratio, ".2f"), "valid" if u.valid else "INVALID: real compute outlasted the emulated steps"]
            for u in cells]


def findings(cells: Sequence[Utilization]) -> list[str]:
    """One sentence per run whose measured utilization is off its prediction by more than :data:`FINDING`."""
    out = []
    for u in cells:
        if u.finding and u.ratio is not None and u.predicted is not None and u.measured is not None:
            side = "above" if u.ratio > 1 else "below"
            out.append(f"{u.protocol} on {u.profile}: measured {u.measured:.3f}, predicted {u.predicted:.3f}: "
                       f"{100 * abs(u.ratio - 1):.0f} % {side} the alpha-beta model")
    return out


def emulation_flags(traces: Sequence[RunTrace]) -> list[str]:
    """One line per run whose emulated device did not hold (real compute outlasted the emulated steps)."""
    out = []
    for t in traces:
        bad = [(k, s["device"]) for k, s in enumerate(_summaries(t))
               if isinstance(s.get("device"), Mapping) and s["device"].get("valid") is False]
        if bad:
            worst = max(float(d.get("overrun_s", 0.0)) for _, d in bad)
            out.append(f"{t.protocol} on {t.profile} (w{t.workers}, seed {t.seed}): the emulated device is INVALID on "
                       f"workers {[k for k, _ in bad]}: real compute outlasted the emulated steps (up to "
                       f"{worst:.2f} s in total), so its timings describe a slower device")
    return out
