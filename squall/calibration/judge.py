"""Observations + the configured :class:`LinkState` -> one :class:`Check` per quantity per link (pure).

Per checked link ``s -> d``:

* with a shared clock: ``delay`` and ``jitter`` from one-way legs, against the link's own settings;
* without one: ``rtt`` and ``rtt_jitter`` of the probe ``s -> d -> s``, against the sum of both
  links' means and the root-sum-square of their s.d. (a TCP round trip is used when UDP gave none);
* ``loss`` per direction from the server's counts (``rtt_loss`` with ``1 - (1-p1)(1-p2)`` when
  only round trips are known);
* ``rate`` when the link (or the sender's uplink, or the receiver's downlink) has one;
* ``uplink`` per node whose uplink cap the plan measured by sending to every peer at once: the
  transfers' wire rates added up, against the cap (or what the peers' links allow together, when
  less), shown as the link ``s->*``.

A link in ``state.blocked`` must lose everything, and gets only a ``loss`` row expecting 100 %.
Every function that counts host stalls takes the caller's :class:`~.stalls.StallPolicy`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from squall.calibration import stalls
from squall.calibration.expected import (
    NORMAL_IQR_PER_SD,
    LossModel,
    delay_model,
    link_rate_bps,
    loss_model,
    round_trip_loss,
    rtt_model,
)
from squall.calibration.observations import Link, RoundTrip, TransferObservation, UdpObservation
from squall.calibration.plan import TransferPlan, fan_out_rate_bps
from squall.calibration.stalls import StallPolicy
from squall.calibration.stats import Moments, interquartile_range, pool
from squall.calibration.verdicts import (
    LOSS_RESOLUTION,
    Check,
    check_delay,
    check_jitter,
    check_loss,
    check_rate,
)
from squall.shaping.base import LinkState


@dataclass(frozen=True)
class Baseline:
    """The probe on the unshaped cluster: what the path costs without any shaping (microseconds)."""

    one_way_mean_us: float  # pooled one-way legs (0 without a shared clock)
    one_way_sd_us: float  # their s.d.
    rtt_mean_us: float  # pooled round trips
    rtt_sd_us: float  # their s.d.
    samples: int  # round trips behind it
    stalled: float = 0.0  # the largest share of one link's legs beyond the stall window of a link without jitter

    @classmethod
    def from_udp(cls, obs: UdpObservation | None, policy: StallPolicy) -> Baseline:
        """Pool every link and round trip of an unshaped probe (zeros when there is none).

        Means and s.d.s leave out host stalls (samples beyond the stall window of a link without
        jitter, :mod:`squall.calibration.stalls`), as the delay check does in the shaped probe; the
        s.d. is estimated from the quartiles of what is left (as normal noise) when raw samples are
        there, as the jitter check does. ``stalled`` says how much
        was left out on the worst link: a baseline that the host stalled as much as a shaped probe
        that could not be judged cannot correct one either (the judge then answers unknown). The
        window is ``policy``'s.
        """
        if obs is None:
            return cls(0.0, 0.0, 0.0, 0.0, 0)
        legs = pool(o.one_way for o in obs.links.values()) if obs.shared_clock else None
        trips = pool(t.rtt for t in obs.round_trips.values())
        leg_samples = [v for o in obs.links.values() for v in o.one_way_samples]
        trip_samples = [v for t in obs.round_trips.values() for v in t.rtt_samples]
        leg_sd = _robust_sd(leg_samples, legs, policy)
        trip_sd = _robust_sd(trip_samples, trips, policy)
        stalled = max((policy.split(o.one_way_samples, 0.0)[1] / len(o.one_way_samples)
                       for o in obs.links.values() if o.one_way_samples and obs.shared_clock), default=0.0)
        return cls(_mean(leg_samples, legs, policy), leg_sd, _mean(trip_samples, trips, policy), trip_sd,
                   trips.count if trips else 0, stalled)

    def to_dict(self) -> dict[str, float]:
        """Plain data for JSON."""
        return {"one_way_mean_us": self.one_way_mean_us, "one_way_sd_us": self.one_way_sd_us,
                "rtt_mean_us": self.rtt_mean_us, "rtt_sd_us": self.rtt_sd_us, "samples": self.samples,
                "stalled": self.stalled}


def _mean(samples: list[float], fallback: Moments | None, policy: StallPolicy) -> float:
    """The mean without host stalls (as the delay check takes it), from raw samples when there are some."""
    if samples:
        return policy.split(samples, 0.0)[0].mean
    return fallback.mean if fallback else 0.0


def _robust_sd(samples: list[float], fallback: Moments | None, policy: StallPolicy) -> float:
    """The s.d. as normal noise from the quartiles of the samples inside the stall window (no jitter)."""
    if len(samples) >= 2:
        kept = stalls.within(samples, policy.window_us(0.0))
        return interquartile_range(kept) / NORMAL_IQR_PER_SD if len(kept) >= 2 else 0.0
    return fallback.sd if fallback else 0.0


@dataclass(frozen=True)
class Evidence:
    """Everything measured in one calibration run."""

    baseline: Baseline  # unshaped probe
    udp: UdpObservation | None  # shaped UDP probe (None: it never ran)
    transfers: Mapping[Link, TransferObservation]  # bulk transfers, per link
    ceiling_bps: float | None = None  # wire rate of the path with no rate limit, when measured
    tcp_round_trips: Mapping[Link, RoundTrip] | None = None  # fallback round trips
    uplinks: Mapping[int, Mapping[Link, TransferObservation]] | None = None  # per node: its transfers at once


def judge(state: LinkState, links: tuple[Link, ...], evidence: Evidence, *, policy: StallPolicy,
          loss_confidence: float, loss_resolution: float = LOSS_RESOLUTION,
          uplinks: Sequence[Sequence[TransferPlan]] = ()) -> list[Check]:
    """Every check of every link in ``links``, in link order, then each shared uplink of ``uplinks``
    (the plan's groups); host stalls are counted and judged by ``policy``, loss counts at
    ``loss_confidence`` and must resolve ``loss_resolution`` of the mean (the plan's)."""
    loss = functools.partial(_loss_row, confidence=loss_confidence, resolution=loss_resolution)
    rows: list[Check] = []
    stalled = stalled_fraction(state, evidence.udp, policy) if evidence.udp is not None else 0.0
    for link in links:
        if link in state.blocked:
            rows.append(loss(link, LossModel(1.0, 0.0, True), evidence, state))
            continue
        rows += _delay_rows(link, state, evidence, policy)
        rows.append(loss(link, loss_model(state.links[link].loss), evidence, state))
        rate = link_rate_bps(link[0], link[1], state.links[link], state.node_links)
        if rate is not None:
            t = evidence.transfers.get(link)
            rows.append(check_rate(link, rate, t.goodput_bps if t else None, t.mss if t else None,
                                   policy=policy, ceiling_bps=evidence.ceiling_bps, host_stalls=stalled,
                                   error=t.error if t else "no transfer was scheduled"))
    for group in uplinks:
        rows.append(uplink_row(state, group, (evidence.uplinks or {}).get(group[0].link[0], {}), policy=policy,
                               host_stalls=stalled))
    return rows


def uplink_row(state: LinkState, group: Sequence[TransferPlan], seen: Mapping[Link, TransferObservation], *,
               policy: StallPolicy, host_stalls: float = 0.0) -> Check:
    """One node's transfers to every peer at once, added up, against its uplink (see the module docstring)."""
    src = group[0].link[0]
    expected = fan_out_rate_bps(state, group)
    got = [(t.link[1], seen.get(t.link)) for t in group]
    missing = [f"{dst}: {o.error if o else 'no result'}" for dst, o in got
               if o is None or o.goodput_bps is None or not o.mss]
    if missing:
        row = check_rate((src, src), expected, None, None, policy=policy, error="; ".join(missing))
    else:
        measured = [o for _, o in got if o is not None]
        rates = [o.goodput_bps or 0.0 for o in measured]
        row = check_rate((src, src), expected, sum(rates), min(o.mss or 0 for o in measured), policy=policy,
                         host_stalls=host_stalls)
        each = ", ".join(f"{r / 1e6:.2f}" for r in rates)
        peers = ", ".join(str(d) for d, _ in got)
        row = dataclasses.replace(row, why=f"node {src} to {peers} at once ({each} Mbit/s of payload): {row.why}")
    return dataclasses.replace(row, metric="uplink")


def _delay_rows(link: Link, state: LinkState, evidence: Evidence, policy: StallPolicy) -> list[Check]:
    spec, back = state.links[link], state.links[(link[1], link[0])]
    base = evidence.baseline
    udp = evidence.udp
    if udp is not None and udp.shared_clock:
        seen = udp.links.get(link)
        one_way = seen.one_way if seen else None
        model = delay_model(spec)
        legs = seen.one_way_samples if seen else ()
        stalled = max(stalled_fraction(state, udp, policy), base.stalled)
        return [check_delay(link, model, one_way, base.one_way_mean_us, policy=policy, samples=legs,
                            host_stalls=stalled),
                check_jitter(link, model, one_way, base.one_way_sd_us, policy=policy, samples=legs,
                             host_stalls=stalled)]
    trip = udp.round_trips.get(link) if udp else None
    rtt: Moments | None = trip.rtt if trip else None
    model = rtt_model(spec, back)
    if rtt is None and evidence.tcp_round_trips and link in evidence.tcp_round_trips:
        tcp = evidence.tcp_round_trips[link].rtt
        return [check_delay(link, model, tcp, base.rtt_mean_us, policy=policy, metric="rtt")]
    trips = trip.rtt_samples if trip else ()
    return [check_delay(link, model, rtt, base.rtt_mean_us, policy=policy, samples=trips, metric="rtt"),
            check_jitter(link, model, rtt, base.rtt_sd_us, policy=policy, samples=trips, metric="rtt_jitter")]


def _loss_row(link: Link, model: LossModel, evidence: Evidence, state: LinkState, *, confidence: float,
              resolution: float) -> Check:
    udp = evidence.udp
    seen = udp.links.get(link) if udp else None
    if seen is not None and seen.packets > 0:
        return check_loss(link, model, seen.packets, seen.lost, confidence=confidence, resolution=resolution,
                          host_dropped=seen.host_dropped)
    trip = udp.round_trips.get(link) if udp else None
    if trip is not None and trip.sent > 0 and link not in state.blocked:
        back = state.links[(link[1], link[0])].loss
        both = round_trip_loss(state.links[link].loss, back)
        return check_loss(link, both, trip.sent, trip.sent - trip.replies, confidence=confidence, metric="rtt_loss",
                          resolution=resolution, host_dropped=trip.host_dropped)
    return check_loss(link, model, 0, 0, confidence=confidence, resolution=resolution)


def stalled_fraction(state: LinkState, udp: UdpObservation, policy: StallPolicy) -> float:
    """The largest share of one link's delay samples that the delay and jitter checks leave out as
    host stalls by ``policy``'s window (0 without raw samples); above its limit those checks are unknown."""
    worst = 0.0
    for link, seen in udp.links.items():
        samples = seen.one_way_samples
        if samples and link in state.links and udp.shared_clock:
            model = delay_model(state.links[link])
            if not model.heavy_tailed:
                worst = max(worst, policy.split(samples, model.sd_us)[1] / len(samples))
    return worst
