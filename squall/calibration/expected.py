"""What a configured link implies for what the probes measure: delay moments, loss law, wire rate.

Delay. A link adds ``d + J`` to each packet, where J is the jitter: uniform on [-j, j] (s.d.
``j / sqrt(3)``), normal with s.d. ``j``, or a Pareto/Pareto-normal law scaled to s.d. ``j``. Both
backends clip the sum at 0 (a packet is never released before it arrived), which raises the mean
when ``j`` is comparable with ``d``; :func:`delay_model` returns the moments of ``max(0, d + J)``
in closed form for uniform and normal jitter (Pareto laws are taken unclipped and the model says
so). Jitter correlation does not change the marginal law (the nfqueue backend keeps it exactly;
netem's uniform mixing is known to shrink it, which this calibration then reports as a failure).
The law's interquartile range in units of its s.d. (``iqr_per_sd``: 1.349 normal, sqrt(3)
uniform) lets the jitter check estimate the s.d. from the quartiles, which host stalls barely move.

Loss. Random loss with probability p and no correlation makes the number of losses among n packets
Binomial(n, p). With lag-1 correlation rho the loss indicators form a two-state Markov chain, and
the count's variance grows to ``n p (1-p) (1+rho)/(1-rho)``. Gilbert-Elliott loss (chain with
good->bad p, bad->good r, loss h in bad and k in good) has mean ``pi h + (1-pi) k`` with
``pi = p/(p+r)`` and asymptotic variance per packet ``m(1-m) + 2 (h-k)^2 pi (1-pi) lam/(1-lam)``
with ``lam = 1 - p - r`` (the chain's second eigenvalue).

Rate. HTB counts whole frames, so TCP payload is a fraction ``mss / (mss + overhead)`` of the
configured rate, with ``overhead`` = 14 (Ethernet) + 20 (IPv4) + 32 (TCP with timestamps) = 66
bytes: at MSS 1448 goodput is 95.6 % of the rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

from squall.profiles import Distribution, LinkSpec, Loss, NodeLinkSpec

FRAME_OVERHEAD_BYTES = 66  # Ethernet 14 + IPv4 20 + TCP 20 + timestamps option 12
NORMAL_IQR_PER_SD = 1.3489795  # 2 * Phi^-1(0.75)
UNIFORM_IQR_PER_SD = math.sqrt(3.0)  # U(-a, a): IQR a, s.d. a / sqrt(3)
_STD = NormalDist()


@dataclass(frozen=True)
class DelayModel:
    """Moments of the delay one link adds (microseconds)."""

    mean_us: float  # expected added delay, after clipping at 0
    sd_us: float  # its standard deviation
    note: str = ""  # a caveat the verdict repeats ("" when the model is exact)
    heavy_tailed: bool = False  # Pareto-type jitter: far samples are part of the law, not host stalls
    iqr_per_sd: float | None = NORMAL_IQR_PER_SD  # the law's interquartile range in s.d.; None if not known


@dataclass(frozen=True)
class LossModel:
    """The law of the number of packets a link loses."""

    mean: float  # long-run fraction lost, 0..1
    variance: float  # asymptotic Var(count)/n; mean(1-mean) when losses are independent
    independent: bool  # True: the count is exactly binomial

    @property
    def dispersion(self) -> float:
        """Variance relative to a binomial with the same mean (1 when independent)."""
        binomial = self.mean * (1 - self.mean)
        return self.variance / binomial if binomial > 0 else 1.0


def jitter_sd_us(spec: LinkSpec) -> float:
    """Standard deviation of the configured jitter, before clipping."""
    amount = float(spec.jitter.amount_us)
    return amount / math.sqrt(3.0) if spec.jitter.distribution == Distribution.UNIFORM else amount


def delay_model(spec: LinkSpec) -> DelayModel:
    """Mean and s.d. of ``max(0, delay + jitter)`` for one link."""
    d, j = float(spec.delay_us), float(spec.jitter.amount_us)
    if j == 0:
        return DelayModel(d, 0.0)
    dist = spec.jitter.distribution
    if dist == Distribution.UNIFORM:
        if d >= j:
            return DelayModel(d, j / math.sqrt(3.0), iqr_per_sd=UNIFORM_IQR_PER_SD)
        top = d + j  # the clipped law: an atom at 0 and a density 1/(2j) on (0, d + j]
        m1, m2 = top**2 / (4 * j), top**3 / (6 * j)
        return DelayModel(m1, math.sqrt(max(0.0, m2 - m1 * m1)), "jitter wider than the delay: clipped at 0",
                          iqr_per_sd=None)
    if dist == Distribution.NORMAL:
        a = d / j
        cdf, pdf = _STD.cdf(a), _STD.pdf(a)
        m1 = d * cdf + j * pdf
        m2 = (d * d + j * j) * cdf + d * j * pdf
        note = "normal jitter clipped at 0" if cdf < 0.999 else ""
        return DelayModel(m1, math.sqrt(max(0.0, m2 - m1 * m1)), note,
                          iqr_per_sd=None if note else NORMAL_IQR_PER_SD)
    note = "" if d >= 2 * j else f"{dist.value} jitter near the delay: clipping at 0 not modelled"
    return DelayModel(d, j, note, heavy_tailed=True, iqr_per_sd=None)


def rtt_model(forward: LinkSpec, back: LinkSpec) -> DelayModel:
    """A round trip crosses both links: means add, variances add (independent draws)."""
    a, b = delay_model(forward), delay_model(back)
    note = "; ".join(n for n in (a.note, b.note) if n)
    if b.sd_us == 0:
        shape = a.iqr_per_sd
    elif a.sd_us == 0:
        shape = b.iqr_per_sd
    elif a.iqr_per_sd == b.iqr_per_sd == NORMAL_IQR_PER_SD:
        shape = NORMAL_IQR_PER_SD  # normal + normal is normal
    else:
        shape = None  # e.g. uniform + normal: no fixed shape, the s.d. is judged without the quartiles
    return DelayModel(a.mean_us + b.mean_us, math.hypot(a.sd_us, b.sd_us), note, a.heavy_tailed or b.heavy_tailed,
                      shape)


def loss_model(loss: Loss) -> LossModel:
    """The law of the loss count for one link's loss settings."""
    ge = loss.gemodel
    if ge is not None:
        p, r, h, k = ge.p, ge.r, ge.loss_bad, ge.loss_good
        pi = p / (p + r) if p + r > 0 else 0.0
        m = pi * h + (1 - pi) * k
        lam = 1.0 - p - r
        extra = 2 * (h - k) ** 2 * pi * (1 - pi) * lam / (1 - lam) if lam < 1 else 0.0
        return LossModel(m, m * (1 - m) + extra, independent=False)
    p, rho = loss.probability, loss.correlation
    if rho == 0:
        return LossModel(p, p * (1 - p), independent=True)
    return LossModel(p, p * (1 - p) * (1 + rho) / (1 - rho), independent=False)


def round_trip_loss(forward: Loss, back: Loss) -> LossModel:
    """A round trip is lost when either leg is: ``1 - (1-p1)(1-p2)``; exact only without memory."""
    a, b = loss_model(forward), loss_model(back)
    m = 1 - (1 - a.mean) * (1 - b.mean)
    return LossModel(m, m * (1 - m) * max(a.dispersion, b.dispersion), a.independent and b.independent)


def link_rate_bps(src: int, dst: int, spec: LinkSpec, node_links: Mapping[int, NodeLinkSpec]) -> int | None:
    """The rate one transfer on ``src -> dst`` alone gets: the least of the link's rate, the sender's
    uplink and the receiver's downlink (None when none is set)."""
    caps = [spec.rate_bps, node_links.get(src, NodeLinkSpec()).uplink_bps,
            node_links.get(dst, NodeLinkSpec()).downlink_bps]
    known = [c for c in caps if c]
    return min(known) if known else None


def wire_bps(goodput_bps: float, mss: int, overhead: int = FRAME_OVERHEAD_BYTES) -> float:
    """The frame rate on the wire that carries ``goodput_bps`` of TCP payload in ``mss``-byte segments."""
    if mss <= 0:
        raise ValueError(f"mss must be > 0, got {mss}")
    return goodput_bps * (mss + overhead) / mss
