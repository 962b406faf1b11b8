"""Configured against measured, per directed link: one pure function per quantity, one row per check.

Every row has a :class:`~squall.checks.verdict.Validity`: pass and fail need data; too little data,
a probe that crashed or a host too busy to judge (:mod:`squall.calibration.stalls`) is unknown,
which fails a calibration as fail does, never passes it. One kind of unknown has a word of its own,
``host-limited``, for rates only: the host could not move that many bits through the shaping path
even with the rate limit removed, so the limit itself cannot be verified here. A calibration's rows
merge by the one rule (:func:`~squall.checks.verdict.merge`).

Tolerances and the chance that a correct link fails (its *false-failure probability*):

* **delay**: the mean of the measured delays, minus the unshaped baseline of the same probe, must
  be within ``max(0.5 ms, 5 %)`` of the configured mean (clipping at 0 included). With raw samples
  the mean leaves out host stalls (:mod:`squall.calibration.stalls`) and says how many. Sampling
  noise of the mean is ``se = sd / sqrt(n)``; a correct link fails with probability
  ``P(|Z| > tol / se)``, which each row states; the runner sizes n so that it is below 1e-6 for
  every shipped profile. Subtracting the baseline is justified because the probe's own path
  (bridge, syscalls, wake-ups) is there with or without shaping; it is measured with the same
  probe, rate and pairs on the unshaped cluster.
* **jitter**: the s.d. must be within ``max(15 %, 0.25 ms)`` of ``sqrt(sd_cfg^2 + sd_base^2)``.
  A handful of host stalls dominate a sample s.d., so the s.d. is estimated from the
  interquartile range and the configured law's shape (IQR = 1.349 s.d. for normal, sqrt(3) s.d.
  for uniform jitter; links without jitter are taken as normal noise), which a few % of stalls move
  by a few %; where the shape is not known (clipped laws, uniform + normal round trips) from the
  samples inside the stall window. The 0.25 ms floor covers the spread of a link without jitter on
  a quiet host. The estimate's relative standard error is about ``1.17 / sqrt(n)`` from the
  quartiles (``0.71 / sqrt(n)`` for a sample s.d.) for a normal law, so with n >= 250 a correct
  link fails with probability ``P(|Z| > 0.15 sqrt(n) / 1.17)`` < 0.2 % (1e-10 at the n = 2000-3000
  the runner collects), stated per row. Heavy-tailed (Pareto) jitter keeps the plain sample s.d.:
  the check is made, but its false-failure probability is not bounded.
* **loss**: the number lost among the n packets that entered the link must lie in the central
  acceptance region of its law at the check's confidence (99 % by default; the runner may
  tighten it so that the whole calibration keeps 99 %): exact binomial for independent loss, the
  normal approximation with the Markov chain's variance for correlated or Gilbert-Elliott loss.
  A correct link fails with probability at most 1 - confidence. n must reach
  :func:`loss_packets_needed`, else the row is unknown.
* **rate**: goodput measured at the receiver, converted to frames on the wire, within 7 % of the
  configured rate. It is a tolerance on a near-deterministic quantity (a token bucket), so no
  probability is attached; the tolerance is specified for 10 Mbit/s to 1 Gbit/s.

The delay and jitter floors, the stall window and the share of stalls that leaves a row unknown are
the stall policy's (:class:`squall.calibration.stalls.StallPolicy`), which every caller passes in:
nothing here reads a policy from anywhere else.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from squall.calibration import stalls
from squall.calibration.expected import DelayModel, LossModel, wire_bps
from squall.calibration.stalls import StallPolicy
from squall.calibration.stats import (
    Moments,
    acceptance_range,
    interquartile_range,
    normal_range,
    normal_two_sided,
    wilson_interval,
    z_two_sided,
)
from squall.checks.verdict import Validity, merge

DELAY_REL = 0.05  # delay within 5 % of the configured mean, or the stall policy's floor (0.5 ms)
JITTER_REL = 0.15  # s.d. within 15 %, or the stall policy's floor (0.25 ms), whichever is larger
RATE_REL = 0.07  # rate within 7 %
RATE_RANGE_BPS = (10e6, 1e9)  # where the rate tolerance is specified
LOSS_CONFIDENCE = 0.99  # acceptance region of the loss count
LOSS_RESOLUTION = 0.5  # needed n: the acceptance region spans at most +-50 % of the mean loss
STRAY_LOSS = 0.01  # on a link without loss, n must reveal a 1 % loss with the check's confidence
MIN_DELAY_SAMPLES = 50  # fewer delay samples: unknown
MIN_JITTER_SAMPLES = 250  # fewer samples on a link with jitter: unknown (30 without jitter)
SD_REL_ERROR = math.sqrt(0.5)  # sqrt(n) x relative s.e. of a sample s.d. (normal law)
IQR_REL_ERROR = 1.166  # sqrt(n) x relative s.e. of the s.d. estimated from the quartiles (normal law)


#: The word of an unknown rate row whose host cannot carry the configured rate at all: not verified.
HOST_LIMITED = "host-limited"
#: Every word a row or a whole calibration ends in, in the order counts are given.
WORDS = (Validity.PASS.past, Validity.FAIL.past, Validity.UNKNOWN.past, HOST_LIMITED)


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
    validity: Validity  # pass, fail or unknown
    why: str  # one sentence: numbers, tolerance, caveats
    samples: int = 0  # packets or round trips behind the measurement (0 for rate)
    false_failure: float | None = None  # chance a correct link fails this check, when known
    host_limited: bool = False  # unknown because this host cannot carry the configured rate at all

    @property
    def verdict(self) -> str:
        """The row's word: ``passed``, ``failed``, ``unknown`` or ``host-limited``."""
        return HOST_LIMITED if self.host_limited else self.validity.past

    def to_dict(self) -> dict[str, object]:
        """Plain data for JSON."""
        return {"link": list(self.link), "metric": self.metric, "unit": self.unit, "configured": self.configured,
                "measured": self.measured, "low": self.low, "high": self.high, "verdict": self.verdict,
                "why": self.why, "samples": self.samples, "false_failure": self.false_failure}


def _ms(us: float) -> float:
    return us / 1000.0


def _unknown(link: tuple[int, int], metric: str, unit: str, configured: float, why: str, *, samples: int = 0) -> Check:
    return Check(link, metric, unit, configured, None, math.nan, math.nan, Validity.UNKNOWN, why, samples)


def check_delay(link: tuple[int, int], model: DelayModel, measured: Moments | None, baseline_us: float,
                *, policy: StallPolicy, samples: Sequence[float] = (), metric: str = "delay",
                host_stalls: float = 0.0) -> Check:
    """Mean delay (one way, or round trip with ``metric="rtt"``) against the configured mean.

    With raw ``samples`` (and a law that is not heavy-tailed) the mean is taken over the samples
    inside the stall window (:mod:`squall.calibration.stalls`): a host stall delays a few packets by
    milliseconds, one-sided, and moves the plain mean although the shaper's delay is right. The
    samples left out are counted and shown; more of them than the policy's limit for this link make
    the row unknown (a shaper that is late and a host that stalls cannot be told apart), never
    passed. ``host_stalls`` is the largest such share among the probe's links (stalls hit every link
    of a probe alike, and are plain to see only on links without wide jitter): above the same
    limit the row is unknown too. A delay short of the accepted range even in the mean of all
    samples is failed however busy the host: a stall cannot make a packet early. ``policy`` sets the
    floor, the window and the limit.
    """
    want = _ms(model.mean_us)
    if measured is None or measured.count < MIN_DELAY_SAMPLES:
        n = measured.count if measured else 0
        return _unknown(link, metric, "ms", want, f"{n} delay samples, at least {MIN_DELAY_SAMPLES} needed",
                        samples=n)
    tol_us = max(policy.delay_floor_us, DELAY_REL * model.mean_us)
    low, high = _ms(model.mean_us - tol_us), _ms(model.mean_us + tol_us)
    stalled, n, plain_mean = 0, measured.count, measured.mean
    if samples and not model.heavy_tailed:
        measured, stalled = policy.split(samples, model.sd_us)
        n = len(samples)
    value_us = measured.mean - baseline_us
    ok = abs(value_us - model.mean_us) <= tol_us
    p_false = normal_two_sided(tol_us / measured.standard_error) if measured.sd > 0 else 0.0
    why = (f"mean {_ms(value_us):.3f} ms ({_ms(measured.mean):.3f} measured - {_ms(baseline_us):.3f} baseline) "
           f"vs {want:.3f} ms +- {_ms(tol_us):.3f} ms")
    if samples:
        why += f"; median {_ms(statistics.median(samples) - baseline_us):.3f} ms"
    if stalled:
        why += (f"; {stalled} of {n} samples ({100 * stalled / n:.2f} %) more than "
                f"{_ms(policy.window_us(model.sd_us)):.3f} ms from the median left out as host stalls "
                f"(mean of all: {_ms(plain_mean - baseline_us):.3f} ms)")
    why += f"; {model.note}" if model.note else ""
    limit = policy.limit(model.sd_us)
    # A stall only ever adds delay: when even the mean of every sample, stalls and the unshaped
    # path included, is short of the accepted range, the shaper's delay is too small.
    short = plain_mean < model.mean_us - tol_us
    if (stalled > limit * n or host_stalls > limit) and not short:
        return Check(link, metric, "ms", want, _ms(value_us), low, high, Validity.UNKNOWN,
                     why + stalls.too_busy(max(stalled / n, host_stalls), "delay", limit), n)
    if short:
        why += "; even the mean of all samples, baseline included, is short of it: a busy host cannot explain that"
        ok = False
    return Check(link, metric, "ms", want, _ms(value_us), low, high, Validity.of(ok), why, n, p_false)


def check_jitter(link: tuple[int, int], model: DelayModel, measured: Moments | None, baseline_sd_us: float,
                 *, policy: StallPolicy, samples: Sequence[float] = (), metric: str = "jitter",
                 host_stalls: float = 0.0) -> Check:
    """The delay's s.d. against the configured s.d. combined with the baseline's.

    With raw ``samples`` (and a law that is not heavy-tailed) the s.d. is estimated robustly:
    from the interquartile range when the law's shape is known, else from the samples inside the
    stall window; samples beyond it are counted as host stalls, and more of them than the stall
    policy's limit for this link (or of any link of the probe: ``host_stalls``) make the check
    unknown. Without samples the plain sample s.d. is used. ``policy`` sets the floor, the window and
    the limit.
    """
    want_us = math.hypot(model.sd_us, baseline_sd_us)
    need = MIN_JITTER_SAMPLES if model.sd_us > policy.jitter_floor_us else 30
    n = len(samples) if samples else (measured.count if measured else 0)
    if n < need or (measured is None and not samples):
        return _unknown(link, metric, "ms", _ms(model.sd_us), f"{n} delay samples, at least {need} needed",
                        samples=n)
    sd_us, method, stalled, rel_error = _spread(model, measured, samples, policy)
    tol_us = max(JITTER_REL * want_us, policy.jitter_floor_us)
    low, high = _ms(max(0.0, want_us - tol_us)), _ms(want_us + tol_us)
    why = (f"s.d. {_ms(sd_us):.3f} ms ({method}) vs {_ms(want_us):.3f} ms (configured {_ms(model.sd_us):.3f}, "
           f"baseline {_ms(baseline_sd_us):.3f}) +- {_ms(tol_us):.3f} ms")
    if stalled:
        why += (f"; {stalled} of {n} samples ({100 * stalled / n:.2f} %) more than "
                f"{_ms(policy.window_us(model.sd_us)):.3f} ms from the median: host stalls")
    why += f"; {model.note}" if model.note else ""
    limit = policy.limit(model.sd_us)
    if stalled > limit * n or host_stalls > limit:
        return Check(link, metric, "ms", _ms(model.sd_us), _ms(sd_us), low, high, Validity.UNKNOWN,
                     why + stalls.too_busy(max(stalled / n, host_stalls), "jitter", limit), n)
    ok = abs(sd_us - want_us) <= tol_us
    p_false = normal_two_sided(tol_us / want_us * math.sqrt(n) / rel_error) if want_us > 0 else 0.0
    return Check(link, metric, "ms", _ms(model.sd_us), _ms(sd_us), low, high, Validity.of(ok), why, n,
                 None if model.heavy_tailed else p_false)


def _spread(model: DelayModel, measured: Moments | None, samples: Sequence[float],
            policy: StallPolicy) -> tuple[float, str, int, float]:
    """(s.d. estimate, how it was made, stalls counted, relative standard error times sqrt(n))."""
    if not samples or model.heavy_tailed:
        assert measured is not None or samples
        plain = measured if measured is not None else Moments.of(samples)
        return plain.sd, "sample s.d.", 0, SD_REL_ERROR
    kept, stalled = policy.split(samples, model.sd_us)
    if model.iqr_per_sd is None:
        return kept.sd, "sample s.d. without stalls", stalled, SD_REL_ERROR
    if stalled:  # the quartiles of the law, not of the stalls
        samples = stalls.within(samples, policy.window_us(model.sd_us))
    return interquartile_range(samples) / model.iqr_per_sd, "from the quartiles", stalled, IQR_REL_ERROR


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
               resolution: float = LOSS_RESOLUTION, host_dropped: int = 0) -> Check:
    """The loss count against the acceptance region of the configured law.

    ``resolution`` is what the count must resolve (see :func:`loss_packets_needed`): a quick
    calibration asks for +-100 % of the mean loss instead of +-50 % and sizes its probe for that.
    ``host_dropped``: at most this many of the ``lost`` were dropped by the receiving host's full
    socket buffers, not by the link, so the link lost between ``lost - host_dropped`` and ``lost``;
    the row passes when some count in that range is accepted.
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
    least = max(0, lost - max(0, host_dropped))
    ok = lo <= lost and least <= hi
    w_lo, w_hi = wilson_interval(lost, packets, confidence)
    why = (f"{lost} of {packets} lost ({100 * lost / packets:.3f} %, Wilson {100 * w_lo:.3f}-{100 * w_hi:.3f} %); "
           f"accepted {lo}-{hi} ({law}, {confidence:.4g})")
    if least < lost:
        why += (f"; this host's full receive buffers dropped up to {lost - least} of them, "
                f"so the link lost {least}-{lost}")
    return Check(link, metric, "%", want, 100 * lost / packets, 100 * lo / packets, 100 * hi / packets,
                 Validity.of(ok), why, packets, 1.0 - confidence)


def check_rate(link: tuple[int, int], configured_bps: float, goodput_bps: float | None, mss: int | None,
               *, policy: StallPolicy, ceiling_bps: float | None = None, error: str | None = None,
               host_stalls: float = 0.0) -> Check:
    """Wire rate of a bulk transfer against the configured rate.

    ``ceiling_bps`` is the wire rate the same path carried with no rate limit (measured only when
    the limited transfer came out short): below the accepted range it makes the row
    ``host-limited`` instead of ``failed``. A transfer that came out short while the host stalled
    more of the delay probe's packets (``host_stalls``) than ``policy``'s judge share is
    unknown: the endpoints and a userspace shaper were starved of CPU, which says nothing of the limit.
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
    validity, host_limited = Validity.of(lo <= wire <= hi), False
    if wire < lo and ceiling_bps is not None and ceiling_bps < lo:
        validity, host_limited = Validity.UNKNOWN, True
        why += (f"; without a rate limit this path carried only {ceiling_bps / 1e6:.1f} Mbit/s on this host, "
                "so the limit cannot be verified here")
    elif wire < lo and ceiling_bps is not None:
        why += f"; the unlimited path carried {ceiling_bps / 1e6:.1f} Mbit/s, so the shaper is too slow"
    judge_share = policy.judge_share
    if wire < lo and host_stalls > judge_share:
        validity, host_limited = Validity.UNKNOWN, False
        why += stalls.too_busy(host_stalls, "rate", judge_share)
    return Check(link, "rate", "Mbit/s", want, wire / 1e6, lo / 1e6, hi / 1e6, validity, why,
                 host_limited=host_limited)


def overall(checks: Iterable[Check]) -> Validity:
    """The rows merged by the one rule (:func:`~squall.checks.verdict.merge`); unknown when there are none:
    a calibration that checked nothing verified nothing."""
    rows = list(checks)
    return merge(c.validity for c in rows) if rows else Validity.UNKNOWN


def outcome(checks: Iterable[Check]) -> str:
    """The word of many rows: :func:`overall`'s, except ``host-limited`` when every unknown row is."""
    rows = list(checks)
    validity = overall(rows)
    if rows and validity is Validity.UNKNOWN and all(c.host_limited for c in rows if c.validity is Validity.UNKNOWN):
        return HOST_LIMITED
    return validity.past
