"""Calibrate one profile: start a cluster, measure it unshaped, shape it, probe it, judge, tear down.

Steps (each link's quantities are measured under the setting that concerns them):

1. a short UDP probe of the unshaped cluster: the baseline that delays are corrected by;
2. ``open_shaper`` and ``apply(state_at(profile, n, at))``; the UDP probe of every checked link
   (delay, jitter, loss per direction); a TCP round-trip probe only if UDP returned nothing;
3. for links with a rate: ``apply`` the same state with only its calm settings (delay, rate, queue
   limit: the ``calm`` column of :mod:`squall.profiles.settings`), one TCP transfer per link,
   one at a time; a transfer that falls short of its rate is measured once
   more (the better counts); if one is still short, one transfer with no rate limit at all
   measures what the host can carry (the ``host-limited`` ceiling);
4. ``check()`` the shaper after each phase (a dead nfqueue daemon lets packets through unshaped:
   the run then fails whatever the rows say), ``close()`` it, tear the cluster down.

A full calibration at 4 workers takes 30-60 s for the shipped profiles (about 1 s to start the
cluster without torch, 3 s of baseline, 2.5-16 s of UDP depending on the loss to resolve, 20-30 s
of transfers); see :mod:`squall.calibration.plan` for the sizes and the sampling above 4 workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from squall import shaping
from squall.calibration.expected import link_rate_bps, wire_bps
from squall.calibration.judge import Baseline, Evidence, judge, stalled_fraction
from squall.calibration.observations import Link, TransferObservation, UdpObservation, better
from squall.calibration.plan import ProbePlan, TransferPlan, plan_probes, reschedule
from squall.calibration.probing import run_tcp, run_tcp_rtt, run_udp
from squall.calibration.report import CalibrationReport
from squall.calibration.stalls import HOST, StallPolicy
from squall.calibration.verdicts import RATE_REL
from squall.cluster import Cluster, ClusterSpec
from squall.cluster.backend import ClusterBackend
from squall.cluster.spec import default_engine
from squall.profiles import Profile, load_profile
from squall.profiles.settings import calm
from squall.shaping.base import BACKENDS, LinkState, Shaper, ShapingError

logger = logging.getLogger(__name__)
T = TypeVar("T")

MEMORY = "256m"  # per container: the probes need a few MB, no torch is loaded
NO_RATE = frozenset({"rate_bps", "limit_packets"})  # :func:`unlimited` drops the rate and the buffer before it


def calibration_spec(workers: int) -> ClusterSpec:
    """The cluster a calibration starts: no torch preloaded (the probes need only the stdlib)."""
    return ClusterSpec(workers=workers, memory=MEMORY, preload=())


def calibrate(profile: Profile | str, *, workers: int, backend: str | None = None,
              pairs: Sequence[Link] | None = None, quick: bool = False, at: float = 0.0,
              cluster: ClusterBackend | None = None, shaper: Shaper | None = None,
              policy: StallPolicy = HOST) -> CalibrationReport:
    """Measure every checked link of ``profile`` (links in force at ``at`` seconds) on ``workers`` nodes.

    :param backend: "netem", "nfqueue" or None (netem where the kernel has it, else nfqueue).
    :param pairs: directed links to check; None checks all of them up to 12, else a sample.
    :param quick: a quarter of the packets for loss and shorter transfers (see the plan module).
    :param cluster: an existing, unshaped cluster of ``workers`` nodes to use instead of a new one.
    :param shaper: the shaper already open on ``cluster`` (a lab's, between its cells): it is cleared for
        the baseline, used for the probes and cleared again, not closed; None opens one and closes it.
    :param policy: the host-stall policy this run probes again by and judges by (:mod:`.stalls`), one
        for the whole run, in the report; :data:`~.stalls.HOST` for a host whose packet path is quiet.
    """
    if shaper is not None and cluster is None:
        raise ValueError("a shaper is passed only with the cluster it shapes")
    if workers < 2:
        raise ValueError(f"calibration needs at least 2 workers (it measures the links between them), got {workers}")
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    prof.runnable_for(workers, engine=cluster.engine if cluster is not None else default_engine())
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)} or none")
    state = shaping.state_at(prof, workers, at)
    plan = plan_probes(state, workers, pairs=pairs, quick=quick)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(Cluster(calibration_spec(workers)))
        elif len(cluster.nodes) != workers:
            raise ValueError(f"the cluster has {len(cluster.nodes)} nodes, not {workers}")
        run = _Run(cluster, plan, state, policy)
        load_before = os.getloadavg()[0]
        if shaper is not None:
            shaper.clear()
            stack.callback(shaper.clear)
        baseline = run.baseline()
        if shaper is None:
            shaper = cluster.open_shaper(backend)
            stack.callback(shaper.close)
        evidence = run.shaped(shaper, baseline)
        used = shaper.backend
        run.notes.append(_load_note(load_before, os.getloadavg()[0]))
    rows = judge(state, plan.links, evidence, policy=policy, loss_confidence=plan.loss_confidence,
                 loss_resolution=plan.loss_resolution, uplinks=plan.uplinks)
    return CalibrationReport(prof.name, workers, used, at, quick, tuple(rows), baseline, plan, tuple(run.errors),
                             tuple(run.notes), time.monotonic() - started, policy)


class _Run:
    """The measuring steps of one calibration, with what went wrong on the way."""

    def __init__(self, cluster: ClusterBackend, plan: ProbePlan, state: LinkState, policy: StallPolicy) -> None:
        self.cluster, self.plan, self.state, self.policy = cluster, plan, state, policy
        self.errors: list[str] = []
        self.notes: list[str] = []

    def baseline(self) -> Baseline:
        """The unshaped probe, tried again by the stall policy (:meth:`_least_stalled`): every delay and s.d.
        is corrected by it, so a stalled baseline would spoil every row."""

        def probe() -> tuple[Baseline, float]:
            obs, _ = run_udp(self.cluster, self.plan.links, count=self.plan.baseline_count,
                             rate_pps=self.plan.udp_rate_pps, wait_s=0.5, punch=self.plan.punch)
            self.notes += [f"baseline: {p}" for p in obs.problems]
            base = Baseline.from_udp(obs, self.policy)
            return base, base.stalled

        return self._least_stalled(probe, "baseline probe")

    def _udp_judgeable(self) -> UdpObservation:
        """The shaped UDP probe, tried again by the stall policy (:meth:`_least_stalled`) while the host
        stalled too many packets of some link to judge its delay and jitter."""

        def probe() -> tuple[UdpObservation, float]:
            udp, _ = run_udp(self.cluster, self.plan.links, count=self.plan.udp_count,
                             rate_pps=self.plan.udp_rate_pps, wait_s=self.plan.udp_wait_s, punch=self.plan.punch)
            return udp, stalled_fraction(self.state, udp, self.policy)

        return self._least_stalled(probe, "UDP probe")

    def _least_stalled(self, probe: Callable[[], tuple[T, float]], what: str) -> T:
        """``probe()`` (a result and the largest share of one link's packets the host stalled) up to the
        run's stall policy's ``tries``, until the share is at most its ``retry_share``
        (:mod:`squall.calibration.stalls`); the least stalled result, with a note for each probe that
        was too stalled."""
        policy = self.policy
        best: T | None = None
        best_stalled = math.inf
        for attempt in range(1, policy.tries + 1):
            result, stalled = probe()
            if stalled < best_stalled:
                best, best_stalled = result, stalled
            if stalled <= policy.retry_share:
                break
            self.notes.append(f"{what} {attempt}: the host stalled {100 * stalled:.1f} % of one link's packets "
                              f"(more than {100 * policy.retry_share:g} %)" +
                              ("; probing again" if attempt < policy.tries else ""))
        assert best is not None
        return best

    def shaped(self, shaper: Shaper, baseline: Baseline) -> Evidence:
        shaper.apply(self.state)
        udp = self._udp_judgeable()
        self.notes += list(udp.problems)
        tcp_trips = None
        if not udp.round_trips:
            self.notes.append("the UDP probe returned nothing: round trips measured over TCP instead")
            tcp_trips = run_tcp_rtt(self.cluster, self.plan.links)
        self._health(shaper, "UDP probe")
        transfers: dict[Link, TransferObservation] = {}
        ceiling = None
        if self.plan.transfers:
            shaper.apply(rate_only(self.state))
            transfers = run_tcp(self.cluster, self.plan.transfers)
            transfers = self._again(transfers)
            short = self._short(transfers)
            if short:
                ceiling = self._ceiling(shaper, short[0])
            self._health(shaper, "TCP transfers")
        uplinks: dict[int, dict[Link, TransferObservation]] = {}
        if self.plan.uplinks:
            shaper.apply(rate_only(self.state))
            for group in self.plan.uplinks:  # one node to every peer at once: its shared uplink
                uplinks[group[0].link[0]] = run_tcp(self.cluster, group)
            self._health(shaper, "uplink transfers")
        return Evidence(baseline, udp, transfers, ceiling, tcp_trips, uplinks)

    def _short(self, transfers: Mapping[Link, TransferObservation]) -> list[TransferPlan]:
        """The planned transfers whose wire rate came out below the accepted range."""
        out = []
        for plan in self.plan.transfers:
            seen = transfers.get(plan.link)
            rate = link_rate_bps(*plan.link, self.state.links[plan.link], self.state.node_links)
            if seen and seen.goodput_bps is not None and seen.mss and rate is not None and \
                    wire_bps(seen.goodput_bps, seen.mss) < (1 - RATE_REL) * rate:
                out.append(plan)
        return out

    def _again(self, transfers: dict[Link, TransferObservation]) -> dict[Link, TransferObservation]:
        """Measure the transfers that fell short once more; keep the better of the two."""
        short = self._short(transfers)
        if not short:
            return transfers
        again = run_tcp(self.cluster, reschedule(short))
        for plan in short:
            first = transfers[plan.link]
            transfers[plan.link] = better(first, again.get(plan.link))
            second = again.get(plan.link)
            self.notes.append(f"{plan.link[0]}->{plan.link[1]} fell short and was measured again: "
                              f"{_mbit(first)} then {_mbit(second)} Mbit/s of payload")
        return transfers

    def _ceiling(self, shaper: Shaper, plan: TransferPlan) -> float | None:
        """The wire rate of ``plan``'s link with no rate limit anywhere: what the host can carry."""
        shaper.apply(unlimited(self.state))
        seen = run_tcp(self.cluster, reschedule([plan])).get(plan.link)
        if seen is None or seen.goodput_bps is None or not seen.mss:
            self.notes.append(f"the unlimited transfer on {plan.link} failed: {seen and seen.error}")
            return None
        ceiling = wire_bps(seen.goodput_bps, seen.mss)
        self.notes.append(f"with no rate limit {plan.link[0]}->{plan.link[1]} carried {ceiling / 1e6:.1f} Mbit/s")
        return ceiling

    def _health(self, shaper: Shaper, phase: str) -> None:
        try:
            shaper.check()
        except ShapingError as exc:
            self.errors.append(f"the shaper stopped working during the {phase}: {exc}")


def _load_note(before: float, after: float) -> str:
    """Host load during the run: a busy host delays a userspace shaper and the probes alike."""
    cores = os.cpu_count() or 1
    note = f"host load average {before:.1f} before, {after:.1f} after, on {cores} cores"
    if max(before, after) > cores:
        note += ": other work competed for the CPU, expect stalls and late packets"
    return note


def _mbit(seen: TransferObservation | None) -> str:
    return f"{seen.goodput_bps / 1e6:.1f}" if seen and seen.goodput_bps is not None else "nothing"


def rate_only(state: LinkState) -> LinkState:
    """``state`` with only the settings table's ``calm`` settings kept (delay, rate, queue limit): what
    the rate transfers run under. Loss, jitter, duplication, reordering and any setting added later
    without ``calm`` are off."""
    return dataclasses.replace(state, links={k: calm(v) for k, v in state.links.items()})


def unlimited(state: LinkState) -> LinkState:
    """:func:`rate_only` without any rate (per link or per node) or the buffer in front of one: what the
    host itself can carry."""
    return dataclasses.replace(state, links={k: calm(v, drop=NO_RATE) for k, v in state.links.items()}, node_links={})
