"""Configured against measured, per directed link: one pure function per quantity, one row per check.

A check ends in one of four states. ``passed`` and ``failed`` need data; too little data, or a
probe that crashed, is ``unknown``, which fails a calibration like ``failed`` does, never passes.
``host-limited`` is only for rates: the host could not move that many bits through the shaping
path even with the rate limit removed, so the limit itself cannot be verified here.

Tolerances and the chance that a correct link fails (its *false-failure probability*):

* **delay**: the mean of the measured delays, minus the unshaped baseline of the same probe, must
  be within ``max(0.5 ms, 5 %)`` of the configured mean (clipping at 0 included). With raw samples
  the mean leaves out host stalls as the jitter check does (below), and says how many. Sampling noise
  of the mean is ``se = sd / sqrt(n)``; a correct link fails with probability ``P(|Z| > tol / se)``,
  which each row states; the runner sizes n so that it is below 1e-6 for every shipped profile.
  Subtracting the baseline is justified because the probe's own path (bridge, syscalls, wake-ups:
  about 40 us one way on this host) is there with or without shaping; it is measured with the
  same probe, rate and pairs on the unshaped cluster.
* **jitter**: the s.d. must be within ``max(15 %, 0.25 ms)`` of ``sqrt(sd_cfg^2 + sd_base^2)``.
  A busy 2-core host stalls a process for 1-10 ms now and then (0.1-1 % of packets when quiet,
  several % while other work loads both cores), and a handful of stalls dominate a sample s.d.
  So the s.d. is estimated from the interquartile range and the configured law's shape (IQR =
  1.349 s.d. for normal, sqrt(3) s.d. for uniform jitter; links without jitter are taken as
  normal noise), which a few % of stalls move by a few %; where the shape is not known (clipped
  laws, uniform + normal round trips) from the samples within ``max(6 sd_cfg, 1 ms)`` of the
  median. Samples beyond that distance are counted as stalls and left out; above 10 % the row (and
  the delay's) is ``unknown`` (see :data:`JITTER_STALL_FRACTION`): a probe and a userspace shaper
  stalled by the host cannot be told apart. The 0.25 ms floor
  covers links without jitter, whose core spread is 0.03-0.1 ms here. The estimate's relative
  standard error is about ``1.17 / sqrt(n)`` from the quartiles (``0.71 / sqrt(n)`` for a sample
  s.d.) for a normal law, so with n >= 250 a correct link fails with probability
  ``P(|Z| > 0.15 sqrt(n) / 1.17)`` < 0.2 % (1e-10 at the n = 2000-3000 the runner collects),
  stated per row. Heavy-tailed (Pareto) jitter keeps the plain sample s.d.: the check is made,
  but its false-failure probability is not bounded.
* **loss**: the number lost among the n packets that entered the link must lie in the central
  acceptance region of its law at the check's confidence (99 % by default; the runner may
  tighten it so that the whole calibration keeps 99 %): exact binomial for independent loss, the
  normal approximation with the Markov chain's variance for correlated or Gilbert-Elliott loss.
  A correct link fails with probability at most 1 - confidence. n must reach
  :func:`loss_packets_needed`, else the row is ``unknown``.
* **rate**: goodput measured at the receiver, converted to frames on the wire, within 7 % of the
  configured rate. It is a tolerance on a near-deterministic quantity (a token bucket), so no
  probability is attached; the tolerance is specified for 10 Mbit/s to 1 Gbit/s.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from squall.calibration.expected import DelayModel, LossModel, wire_bps
from squall.calibration.stats import (
    Moments,
    acceptance_range,
    interquartile_range,
    normal_range,
    normal_two_sided,
    wilson_interval,
    without_stalls,
    z_two_sided,
)

DELAY_FLOOR_US = 500.0  # delay tolerance never below 0.5 ms
DELAY_REL = 0.05  # ... or 5 % of the configured mean
JITTER_REL = 0.15  # s.d. within 15 %
JITTER_FLOOR_US = 250.0  # ... or 0.25 ms, whichever is larger
RATE_REL = 0.07  # rate within 7 %
RATE_RANGE_BPS = (10e6, 1e9)  # where the rate tolerance is specified
LOSS_CONFIDENCE = 0.99  # acceptance region of the loss count
LOSS_RESOLUTION = 0.5  # needed n: the acceptance region spans at most +-50 % of the mean loss
STRAY_LOSS = 0.01  # on a link without loss, n must reveal a 1 % loss with the check's confidence
MIN_DELAY_SAMPLES = 50  # fewer delay samples: unknown
MIN_JITTER_SAMPLES = 250  # fewer samples on a link with jitter: unknown (30 without jitter)
STALL_SIGMAS = 6.0  # a delay this many configured s.d. from the median is a host stall ...
STALL_FLOOR_US = 1000.0  # ... and at least this far
#: More stalls than this: the probe as a whole cannot be used (the conformance suites' and ping's bound;
#: the delay and jitter checks stop at :data:`JITTER_STALL_FRACTION`). Stalls are one-sided, so they
#: move the median to the law's 0.5 / (1 - f) quantile: 0.67 at f = 25 %, 0.43 s.d. for a normal law,
#: inside the law's core; the window of max(6 sd, 1 ms) around it then still holds the whole law.
MAX_STALL_FRACTION = 0.25
#: The same for a link whose jitter is wider than the stall floor: its window keeps the stalls that
#: land inside its law, so the host may stall only this much of the probe for it to be judged.
HIDDEN_STALL_FRACTION = 0.05
#: More stalls than this: the jitter and the delay checks are unknown. Host stalls are not all beyond the
#: window: each one far out comes with shorter ones (0.1-1 ms) inside it, and a host that stalls that
#: often is late with every packet. Measured on a stalling 2-core CI VM under nfqueue: 18-22 % of
#: samples beyond 1 ms came with s.d. 0.23-0.33 ms from the quartiles for a 0.055 ms baseline; under
#: 5 % of them, with 0.03-0.09 ms. And with 19-21 % of a probe beyond 1 ms, a correct 5 ms link read
#: 5.53 ms, its median as late as its mean (agent-run probes, two CPU-bound processes beside them).
JITTER_STALL_FRACTION = 0.10
SD_REL_ERROR = math.sqrt(0.5)  # sqrt(n) x relative s.e. of a sample s.d. (normal law)
IQR_REL_ERROR = 1.166  # sqrt(n) x relative s.e. of the s.d. estimated from the quartiles (normal law)


class CalibrationOutcome(enum.StrEnum):
    """How one calibration check (and a whole calibration) ended; not :class:`squall.checks.Verdict`."""

    PASSED = "passed"  # "measured inside the tolerance"
    FAILED = "failed"  # "measured outside the tolerance"
    UNKNOWN = "unknown"  # "too little data, or the probe crashed: not a pass"
    HOST_LIMITED = "host-limited"  # "this host cannot carry the configured rate at all: not verified"


@dataclass(frozen=True)
class Check:
    """One row of a calibration report: one quantity of one directed link."""

    link: tuple[int, int]  # (src, dst); for round-trip rows the prober and its target
    metric: str  # delay, jitter, loss, rate; rtt, rtt_jitter, rtt_loss for round trips
    unit: str  # unit of configured/measured/low/high: ms, %, Mbit/s
    configured: float  # what the profile implies for this quantity
    measured: float | None  # what was measured (baseline-corrected for delay); None when nothing was
    low: float  # smallest accepted value
    high: float  # largest accepted value
    verdict: CalibrationOutcome  # the outcome
    why: str  # one sentence: numbers, tolerance, caveats
    samples: int = 0  # packets or round trips behind the measurement (0 for rate)
    false_failure: float | None = None  # chance a correct link fails this check, when known

    def to_dict(self) -> dict[str, object]:
        """Plain data for JSON."""
        return {"link": list(self.link), "metric": self.metric, "unit": self.unit, "configured": self.configured,
                "measured": self.measured, "low": self.low, "high": self.high, "verdict": self.verdict.value,
                "why": self.why, "samples": self.samples, "false_failure": self.false_failure}


def _ms(us: float) -> float:
    return us / 1000.0


def _unknown(link: tuple[int, int], metric: str, unit: str, configured: float, why: str, *, samples: int = 0) -> Check:
    return Check(link, metric, unit, configured, None, math.nan, math.nan, CalibrationOutcome.UNKNOWN, why, samples)


def check_delay(link: tuple[int, int], model: DelayModel, measured: Moments | None, baseline_us: float,
                *, samples: Sequence[float] = (), metric: str = "delay", host_stalls: float = 0.0) -> Check:
    """Mean delay (one way, or round trip with ``metric="rtt"``) against the configured mean.

    With raw ``samples`` (and a law that is not heavy-tailed) the mean is taken over the samples
    within ``max(6 sd_cfg, 1 ms)`` of the median, as the jitter check does: a host stall delays a
    few packets by milliseconds, one-sided, and moves the plain mean although the shaper's delay is
    right. The configured law puts (almost) nothing that far out (uniform: nothing; normal: 2e-9),
    so the window keeps the law whole and its mean unbiased. The samples left out are counted and
    shown; more than :data:`JITTER_STALL_FRACTION` of them make the row ``unknown`` (a shaper that
    is late and a host that stalls cannot be told apart), never ``passed``: the jitter check's bound,
    because a host that stalls that often is late with every packet, not only with the far ones (a
    correct 5 ms link read 5.53 ms, every sample later, with 19-21 % of a probe beyond the window).
    ``host_stalls`` is the largest such fraction among the probe's links (stalls hit every link of a
    probe alike, and are plain to see only on links without wide jitter): above the same bound the
    row is ``unknown`` too.
    """
    want = _ms(model.mean_us)
    if measured is None or measured.count < MIN_DELAY_SAMPLES:
        n = measured.count if measured else 0
        return _unknown(link, metric, "ms", want, f"{n} delay samples, at least {MIN_DELAY_SAMPLES} needed",
                        samples=n)
    tol_us = max(DELAY_FLOOR_US, DELAY_REL * model.mean_us)
    low, high = _ms(model.mean_us - tol_us), _ms(model.mean_us + tol_us)
    stalls, n, plain_mean = 0, measured.count, measured.mean
    if samples and not model.heavy_tailed:
        measured, stalls = without_stalls(samples, stall_half_width_us(model))
        n = len(samples)
    value_us = measured.mean - baseline_us
    ok = abs(value_us - model.mean_us) <= tol_us
    p_false = normal_two_sided(tol_us / measured.standard_error) if measured.sd > 0 else 0.0
    why = (f"mean {_ms(value_us):.3f} ms ({_ms(measured.mean):.3f} measured - {_ms(baseline_us):.3f} baseline) "
           f"vs {want:.3f} ms +- {_ms(tol_us):.3f} ms")
    if samples:
        why += f"; median {_ms(statistics.median(samples) - baseline_us):.3f} ms"
    if stalls:
        why += (f"; {stalls} of {n} samples ({100 * stalls / n:.2f} %) more than "
                f"{_ms(stall_half_width_us(model)):.3f} ms from the median left out as host stalls "
                f"(mean of all: {_ms(plain_mean - baseline_us):.3f} ms)")
    why += f"; {model.note}" if model.note else ""
    limit = _host_limit(model)
    if stalls > limit * n or host_stalls > limit:
        return Check(link, metric, "ms", want, _ms(value_us), low, high, CalibrationOutcome.UNKNOWN,
                     why + _too_busy(max(stalls / n, host_stalls), "delay", limit), n)
    return Check(link, metric, "ms", want, _ms(value_us), low, high,
                 CalibrationOutcome.PASSED if ok else CalibrationOutcome.FAILED, why, n, p_false)


def check_jitter(link: tuple[int, int], model: DelayModel, measured: Moments | None, baseline_sd_us: float,
                 *, samples: Sequence[float] = (), metric: str = "jitter", host_stalls: float = 0.0) -> Check:
    """The delay's s.d. against the configured s.d. combined with the baseline's.

    With raw ``samples`` (and a law that is not heavy-tailed) the s.d. is estimated robustly:
    from the interquartile range when the law's shape is known, else from the samples within
    ``max(6 sd_cfg, 1 ms)`` of the median; samples beyond that are counted as host stalls, and more
    than :data:`JITTER_STALL_FRACTION` of them (or of any link of the probe: ``host_stalls``) make
    the check unknown.
    Without samples the plain sample s.d. is used.
    """
    want_us = math.hypot(model.sd_us, baseline_sd_us)
    need = MIN_JITTER_SAMPLES if model.sd_us > JITTER_FLOOR_US else 30
    n = len(samples) if samples else (measured.count if measured else 0)
    if n < need or (measured is None and not samples):
        return _unknown(link, metric, "ms", _ms(model.sd_us), f"{n} delay samples, at least {need} needed",
                        samples=n)
    sd_us, method, stalls, rel_error = _spread(model, measured, samples)
    tol_us = max(JITTER_REL * want_us, JITTER_FLOOR_US)
    low, high = _ms(max(0.0, want_us - tol_us)), _ms(want_us + tol_us)
    why = (f"s.d. {_ms(sd_us):.3f} ms ({method}) vs {_ms(want_us):.3f} ms (configured {_ms(model.sd_us):.3f}, "
           f"baseline {_ms(baseline_sd_us):.3f}) +- {_ms(tol_us):.3f} ms")
    if stalls:
        why += (f"; {stalls} of {n} samples ({100 * stalls / n:.2f} %) more than "
                f"{_ms(stall_half_width_us(model)):.3f} ms from the median: host stalls")
    why += f"; {model.note}" if model.note else ""
    limit = _host_limit(model)
    if stalls > limit * n or host_stalls > limit:
        return Check(link, metric, "ms", _ms(model.sd_us), _ms(sd_us), low, high, CalibrationOutcome.UNKNOWN,
                     why + _too_busy(max(stalls / n, host_stalls), "jitter", limit), n)
    ok = abs(sd_us - want_us) <= tol_us
    p_false = normal_two_sided(tol_us / want_us * math.sqrt(n) / rel_error) if want_us > 0 else 0.0
    return Check(link, metric, "ms", _ms(model.sd_us), _ms(sd_us), low, high,
                 CalibrationOutcome.PASSED if ok else CalibrationOutcome.FAILED, why, n,
                 None if model.heavy_tailed else p_false)


def _spread(model: DelayModel, measured: Moments | None,
            samples: Sequence[float]) -> tuple[float, str, int, float]:
    """(s.d. estimate, how it was made, stalls counted, relative standard error times sqrt(n))."""
    if not samples or model.heavy_tailed:
        assert measured is not None or samples
        plain = measured if measured is not None else Moments.of(samples)
        return plain.sd, "sample s.d.", 0, SD_REL_ERROR
    kept, stalls = without_stalls(samples, stall_half_width_us(model))
    if model.iqr_per_sd is None:
        return kept.sd, "sample s.d. without stalls", stalls, SD_REL_ERROR
    if stalls:  # the quartiles of the law, not of the stalls
        median, half_width = statistics.median(samples), stall_half_width_us(model)
        samples = [v for v in samples if abs(v - median) <= half_width]
    return interquartile_range(samples) / model.iqr_per_sd, "from the quartiles", stalls, IQR_REL_ERROR


def _host_limit(model: DelayModel) -> float:
    """How much of the probe the host may stall before this link's delay and s.d. cannot be judged.

    Stalls are left out only beyond the window ``max(6 sd, 1 ms)``; a link with wider jitter than
    that floor keeps the stalls that land inside its own law, where nothing tells them apart, so
    it is judged only while the host stalls little (:data:`HIDDEN_STALL_FRACTION`); any other link up
    to :data:`JITTER_STALL_FRACTION`, the bound of both checks.
    """
    wide = stall_half_width_us(model) > STALL_FLOOR_US
    return min(HIDDEN_STALL_FRACTION, JITTER_STALL_FRACTION) if wide else JITTER_STALL_FRACTION


def _too_busy(fraction: float, what: str, limit: float) -> str:
    return (f"; the host stalled {100 * fraction:.1f} % of a link's packets in this probe, more than "
            f"{100 * limit:g} %: the host is too busy to judge the {what}")


def stall_half_width_us(model: DelayModel) -> float:
    """How far from the median a delay may lie before it counts as a host stall."""
    return max(STALL_SIGMAS * model.sd_us, STALL_FLOOR_US)


def loss_packets_needed(model: LossModel, confidence: float = LOSS_CONFIDENCE,
                        resolution: float = LOSS_RESOLUTION) -> int:
    """Packets a loss check needs to mean something.

    With mean loss m > 0: the acceptance region at ``confidence`` should span at most
    ``+- resolution * m``, i.e. ``n >= z^2 var / (resolution m)^2`` (``var`` per packet from the
    model; ``z`` the two-sided quantile). Without loss: n such that a stray loss of
    :data:`STRAY_LOSS` shows up with probability ``confidence``: ``n >= ln(1 - c) / ln(1 - 0.01)``.
    """
    z = z_two_sided(1.0 - confidence)
    if model.mean <= 0:
        return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - STRAY_LOSS))
    if model.mean >= 1:
        return 1
    return math.ceil(z * z * model.variance / (resolution * model.mean) ** 2)


def check_loss(link: tuple[int, int], model: LossModel, packets: int, lost: int,
               *, confidence: float = LOSS_CONFIDENCE, metric: str = "loss",
               resolution: float = LOSS_RESOLUTION) -> Check:
    """The loss count against the acceptance region of the configured law.

    ``resolution`` is what the count must resolve (see :func:`loss_packets_needed`): a quick
    calibration asks for +-100 % of the mean loss instead of +-50 % and sizes its probe for that.
    """
    want = 100 * model.mean
    need = loss_packets_needed(model, confidence, resolution)
    if packets < need:
        return _unknown(link, metric, "%", want, f"{packets} packets crossed the link, {need} needed "
                        f"to resolve {want:g} % at {confidence:.4g} confidence", samples=packets)
    if not 0 <= lost <= packets:
        return _unknown(link, metric, "%", want, f"inconsistent count: {lost} lost of {packets}", samples=packets)
    if model.independent or model.mean in (0.0, 1.0):
        lo, hi = acceptance_range(packets, model.mean, confidence)
        law = "binomial"
    else:
        lo, hi = normal_range(packets, model.mean, model.variance, confidence)
        law = f"normal, variance x{model.dispersion:.2f} of binomial"
    ok = lo <= lost <= hi
    w_lo, w_hi = wilson_interval(lost, packets, confidence)
    why = (f"{lost} of {packets} lost ({100 * lost / packets:.3f} %, Wilson {100 * w_lo:.3f}-{100 * w_hi:.3f} %); "
           f"accepted {lo}-{hi} ({law}, {confidence:.4g})")
    return Check(link, metric, "%", want, 100 * lost / packets, 100 * lo / packets, 100 * hi / packets,
                 CalibrationOutcome.PASSED if ok else CalibrationOutcome.FAILED, why, packets, 1.0 - confidence)


def check_rate(link: tuple[int, int], configured_bps: float, goodput_bps: float | None, mss: int | None,
               *, ceiling_bps: float | None = None, error: str | None = None, host_stalls: float = 0.0) -> Check:
    """Wire rate of a bulk transfer against the configured rate.

    ``ceiling_bps`` is the wire rate the same path carried with no rate limit (measured only when
    the limited transfer came out short): below the accepted range it makes the row
    ``host-limited`` instead of ``failed``. A transfer that came out short while the host stalled
    more than :data:`JITTER_STALL_FRACTION` of the delay probe's packets (``host_stalls``) is
    ``unknown``: the endpoints and a userspace shaper were starved of CPU (a CI run read 520-890
    Mbit/s for 1 Gbit/s under nfqueue with 21-26 % of packets stalled), which says nothing of the limit.
    """
    want = configured_bps / 1e6
    lo, hi = (1 - RATE_REL) * configured_bps, (1 + RATE_REL) * configured_bps
    if goodput_bps is None or not mss:
        return _unknown(link, "rate", "Mbit/s", want, f"no transfer measured: {error or 'no result'}")
    wire = wire_bps(goodput_bps, mss)
    why = (f"{goodput_bps / 1e6:.2f} Mbit/s TCP payload = {wire / 1e6:.2f} Mbit/s of frames (MSS {mss}) "
           f"vs {want:g} Mbit/s +- {100 * RATE_REL:g} %")
    if not RATE_RANGE_BPS[0] <= configured_bps <= RATE_RANGE_BPS[1]:
        why += "; outside the 10 Mbit/s-1 Gbit/s range the tolerance is specified for"
    verdict = CalibrationOutcome.PASSED if lo <= wire <= hi else CalibrationOutcome.FAILED
    if wire < lo and ceiling_bps is not None and ceiling_bps < lo:
        verdict = CalibrationOutcome.HOST_LIMITED
        why += (f"; without a rate limit this path carried only {ceiling_bps / 1e6:.1f} Mbit/s on this host, "
                "so the limit cannot be verified here")
    elif wire < lo and ceiling_bps is not None:
        why += f"; the unlimited path carried {ceiling_bps / 1e6:.1f} Mbit/s, so the shaper is too slow"
    if wire < lo and host_stalls > JITTER_STALL_FRACTION:
        verdict = CalibrationOutcome.UNKNOWN
        why += _too_busy(host_stalls, "rate", JITTER_STALL_FRACTION)
    return Check(link, "rate", "Mbit/s", want, wire / 1e6, lo / 1e6, hi / 1e6, verdict, why)


def overall(checks: Iterable[Check]) -> CalibrationOutcome:
    """One verdict for many checks: any failed -> failed; else any unknown (or none at all) -> unknown;
    else any host-limited -> host-limited; else passed."""
    states = {c.verdict for c in checks}
    for state in (CalibrationOutcome.FAILED, CalibrationOutcome.UNKNOWN, CalibrationOutcome.HOST_LIMITED):
        if state in states:
            return state
    return CalibrationOutcome.PASSED if states else CalibrationOutcome.UNKNOWN
