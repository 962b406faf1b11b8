"""Fidelity over time: each segment of a traced (or phased) profile judged against its own settings.

A run's link timeline (:func:`squall.shaping.link_timeline`) cuts time into segments, each holding
one link state. :func:`calibrate_segments` replays the timeline the way a run does (planned ahead,
sent by the real-time executor) while probing, then judges each segment it can with the verdict
functions of :mod:`.verdicts` (the same :class:`~.verdicts.Check` rows as ``squall calibrate``):

* **delay** per segment and direction: the probes sent inside the segment, away from its edges
  (:data:`EDGE_S` plus the slower side's delay, so no probe straddles a change), against the
  segment's delay, corrected by the unshaped baseline;
* **loss** per segment, round trip (a probe or its echo lost; the sequence numbers that never came
  back), against ``1 - (1 - forward)(1 - back)``, at the quick calibration's resolution (+-100 %
  of the mean); a segment with fewer probes than that needs is ``too short``;
* **rate** per segment of at least :data:`MIN_RATE_SEGMENT_S`: a TCP transfer as long as the
  segment with the segment's state held (a transfer needs a second to fill the pipe and one to
  measure); shorter segments are ``too short``.

Segments too short for a quantity are listed as such, never judged: :class:`SegmentReport` says
which. The pure part (:func:`segments_of`, :func:`judge_segment`) takes what the probes saw.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from squall.calibration.expected import LossModel, delay_model
from squall.calibration.judge import Baseline
from squall.calibration.observations import Sample, raw_samples
from squall.calibration.plan import TransferPlan
from squall.calibration.probing import finish_udp, run_tcp, run_udp, start_udp
from squall.calibration.stalls import HOST, StallPolicy
from squall.calibration.stats import Moments
from squall.calibration.verdicts import (
    Check,
    check_delay,
    check_loss,
    check_rate,
    loss_packets_needed,
    overall,
)
from squall.checks.verdict import Validity
from squall.profiles import load_profile
from squall.shaping import LinkState, Shaper, TimedState, link_timeline
from squall.shaping.base import SchedulingShaper

Link = tuple[int, int]
EDGE_S: Final = 0.02  # probes this close to a change (plus the delay in force) belong to neither side
MIN_DELAY_PROBES: Final = 30  # fewer probes in a segment: its delay is too short to judge
MIN_RATE_SEGMENT_S: Final = 2.0  # rate only on segments this long (1 s to fill the pipe, 1 s measured)
RATE_WARMUP_S: Final = 1.0
LOSS_RESOLUTION: Final = 1.0  # the quick calibration's: the count resolves +-100 % of the mean
PROBE_RATE_PPS: Final = 500.0


@dataclass(frozen=True)
class Segment:
    """One stretch of the timeline with one link state."""

    index: int  # position in the timeline
    start_s: float  # from the start of the run
    end_s: float  # the next change, or the end of the calibration
    label: str  # what started it
    state: LinkState  # what holds in it

    @property
    def length_s(self) -> float:
        """How long it lasts."""
        return self.end_s - self.start_s


@dataclass(frozen=True)
class SegmentReport:
    """Every check of every segment, and which segments were too short for what."""

    segments: tuple[Segment, ...]
    checks: tuple[tuple[int, Check], ...]  # (segment index, check)
    too_short: tuple[tuple[int, str, str], ...]  # (segment index, quantity, why)
    notes: tuple[str, ...] = field(default=())

    def outcome(self, metric: str) -> dict[str, int]:
        """How many checks of ``metric`` ended how."""
        counts: dict[str, int] = {}
        for _, check in self.checks:
            if check.metric == metric:
                counts[check.verdict] = counts.get(check.verdict, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON and the report's plot."""
        return {
            "segments": [{"index": s.index, "start_s": s.start_s, "end_s": s.end_s, "label": s.label}
                         for s in self.segments],
            "checks": [{"segment": i, **c.to_dict()} for i, c in self.checks],
            "too_short": [{"segment": i, "quantity": q, "why": w} for i, q, w in self.too_short],
            "notes": list(self.notes),
        }


def segments_of(timeline: Sequence[TimedState], end_s: float) -> list[Segment]:
    """The timeline cut into segments ending at ``end_s``."""
    found = []
    for index, timed in enumerate(timeline):
        stop = timeline[index + 1].at_s if index + 1 < len(timeline) else end_s
        if stop > timed.at_s:
            found.append(Segment(index, timed.at_s, min(stop, end_s), timed.label, timed.state))
    return found


def _loss_of(state: LinkState, link: Link) -> float:
    if link in state.blocked:
        return 1.0
    spec = state.links.get(link)
    return 0.0 if spec is None else spec.loss.mean


def _delay_of(state: LinkState, link: Link) -> int:
    spec = state.links.get(link)
    return 0 if spec is None else spec.delay_us + spec.jitter.amount_us


def inside(segment: Segment, previous: Segment | None, samples: Sequence[Sample], start_wall: float,
           link: Link) -> list[Sample]:
    """The probes of ``link`` sent well inside ``segment`` (away from its two changes)."""
    before = max(_delay_of(segment.state, link), _delay_of(previous.state, link) if previous else 0)
    reverse = (link[1], link[0])
    guard = EDGE_S + (before + max(_delay_of(segment.state, reverse), 0)) / 1e6
    lo, hi = start_wall + segment.start_s + guard, start_wall + segment.end_s - EDGE_S
    return [s for s in samples if lo <= s.send_wall < hi]


def judge_segment(segment: Segment, previous: Segment | None, link: Link, samples: Sequence[Sample], *,
                  sent_seqs: Sequence[tuple[int, float]], start_wall: float, baseline: Baseline,
                  policy: StallPolicy) -> tuple[list[Check], list[tuple[str, str]]]:
    """The delay and loss checks of one segment (the probes of ``link`` and their echoes), host stalls
    judged by ``policy``."""
    checks: list[Check] = []
    short: list[tuple[str, str]] = []
    kept = inside(segment, previous, samples, start_wall, link)
    spec = segment.state.links.get(link)
    if link in segment.state.blocked:
        short.append(("delay", "the link is cut"))
    elif len(kept) < MIN_DELAY_PROBES:
        short.append(("delay", f"{len(kept)} probes inside the segment, {MIN_DELAY_PROBES} needed"))
    elif spec is not None:
        forward = [s.forward_us for s in kept]
        checks.append(check_delay(link, delay_model(spec), Moments.of(forward), baseline.one_way_mean_us,
                                  policy=policy, samples=forward))
    lo = start_wall + segment.start_s + EDGE_S
    hi = start_wall + segment.end_s - EDGE_S - 2 * _delay_of(segment.state, link) / 1e6
    sent = [seq for seq, at in sent_seqs if lo <= at < hi]
    answered = {s.seq for s in samples}
    lost = sum(1 for seq in sent if seq not in answered)
    m = 1 - (1 - _loss_of(segment.state, link)) * (1 - _loss_of(segment.state, (link[1], link[0])))
    model = LossModel(m, m * (1 - m), True)
    need = loss_packets_needed(model, resolution=LOSS_RESOLUTION)
    if len(sent) < need:
        short.append(("loss", f"{len(sent)} probes inside the segment, {need} needed for {100 * m:g} %"))
    else:
        checks.append(check_loss(link, model, len(sent), lost, metric="rtt_loss", resolution=LOSS_RESOLUTION))
    return checks, short


def calibrate_segments(cluster: Any, shaper: Shaper, timeline: Sequence[TimedState], end_s: float, *,
                       link: Link = (0, 1), rate_pps: float = PROBE_RATE_PPS,
                       baseline: Baseline | None = None, policy: StallPolicy = HOST) -> SegmentReport:
    """Replay ``timeline`` twice on ``cluster`` (probes, then transfers) and judge every segment by the
    host-stall ``policy`` (one for the whole run; :data:`~.stalls.HOST` for a quiet host)."""
    if not isinstance(shaper, SchedulingShaper):
        raise TypeError(f"the {getattr(shaper, 'backend', '?')} shaper cannot schedule changes")
    links = (link, (link[1], link[0]))
    if baseline is None:
        shaper.apply(LinkState({}))
        obs, _ = run_udp(cluster, links, count=300, rate_pps=rate_pps, wait_s=0.5)
        baseline = Baseline.from_udp(obs, policy)
    segments = segments_of(timeline, end_s)
    notes: list[str] = []
    changes = shaper.schedule(timeline)
    run = start_udp(cluster, (link,), count=int(end_s * rate_pps), rate_pps=rate_pps, wait_s=1.0)
    changes.go(time.monotonic() + (run.start_wall - time.time()))
    _, results = finish_udp(run, (link,))
    applied = changes.finish()
    notes += [f"change {a.index}: {'; '.join(a.errors)}" for a in applied if a.errors]
    late = sorted(a.lateness_s for a in applied)
    if late:
        notes.append(f"{len(late)} changes done {1e3 * late[len(late) // 2]:.2f} ms after their due time "
                     f"(median; max {1e3 * late[-1]:.2f} ms)")
    samples = raw_samples([m for r in results for m in r.metrics()]).get(link, [])
    sent_seqs = [(seq, run.start_wall + seq / rate_pps) for seq in range(int(end_s * rate_pps))]
    checks: list[tuple[int, Check]] = []
    short: list[tuple[int, str, str]] = []
    for position, segment in enumerate(segments):
        previous = segments[position - 1] if position else None
        rows, too_short = judge_segment(segment, previous, link, samples, sent_seqs=sent_seqs,
                                          start_wall=run.start_wall, baseline=baseline, policy=policy)
        checks += [(segment.index, row) for row in rows]
        short += [(segment.index, q, why) for q, why in too_short]
    long_enough = [s for s in segments if s.length_s >= MIN_RATE_SEGMENT_S
                   and (spec := s.state.links.get(link)) is not None and spec.rate_bps is not None]
    short += [(s.index, "rate", f"{s.length_s:g} s long, {MIN_RATE_SEGMENT_S:g} s needed")
              for s in segments if s not in long_enough]
    if long_enough:
        checks += _rates(cluster, shaper, long_enough, link, policy)
    return SegmentReport(tuple(segments), tuple(checks), tuple(short), tuple(notes))


def calibrate_profile_over(profile: str, cluster: Any, shaper: Shaper, workers: int,
                           seconds: float, *, policy: StallPolicy = HOST) -> SegmentReport | None:
    """:func:`calibrate_segments` of profile ``profile`` (name or path) over its first ``seconds``, judged
    by ``policy``; None when its links hold still (nothing to judge over time)."""
    timeline = link_timeline(load_profile(profile), workers, seconds)
    if len(timeline) < 2:
        return None
    return calibrate_segments(cluster, shaper, timeline, seconds, policy=policy)


def _rates(cluster: Any, shaper: Any, segments: Sequence[Segment], link: Link,
           policy: StallPolicy) -> list[tuple[int, Check]]:
    """One TCP transfer per long segment, with the segment's state held for as long as the segment lasts."""
    rows = []
    for segment in segments:
        spec = segment.state.links[link]
        assert spec.rate_bps is not None
        shaper.apply(segment.state)
        plan = TransferPlan(link, 0.0, segment.length_s - RATE_WARMUP_S, RATE_WARMUP_S)
        seen = run_tcp(cluster, [plan]).get(link)
        rows.append((segment.index, check_rate(link, spec.rate_bps, seen.goodput_bps if seen else None,
                                               seen.mss if seen else None, policy=policy,
                                               error=seen.error if seen else "no transfer")))
    return rows


def summary_table(report: SegmentReport) -> str:
    """One line per segment: its times and label, then each quantity's measured value and verdict."""
    by_segment: dict[int, list[str]] = {}
    for index, check in report.checks:
        measured = "-" if check.measured is None or math.isnan(check.measured) else f"{check.measured:.3g}"
        by_segment.setdefault(index, []).append(
            f"{check.metric} {check.configured:.3g}/{measured} {check.unit} {check.verdict}")
    for index, quantity, _ in report.too_short:
        by_segment.setdefault(index, []).append(f"{quantity} too short")
    lines = []
    for segment in report.segments:
        lines.append(f"{segment.start_s:7.2f}-{segment.end_s:7.2f} s  " + "; ".join(by_segment.get(segment.index, [])))
    counts = {metric: report.outcome(metric) for metric in ("delay", "rtt_loss", "rate")}
    lines.append("outcomes: " + ", ".join(f"{m}: {c or 'none'}" for m, c in counts.items()))
    short = {q: sum(1 for _, quantity, _ in report.too_short if quantity == q) for q in ("delay", "loss", "rate")}
    lines.append("too short to judge: " + ", ".join(f"{q} in {k} segments" for q, k in short.items()))
    return "\n".join(lines)


def passed(report: SegmentReport) -> bool:
    """Whether every judged check passed (too-short segments are not failures; they are listed)."""
    return overall(check for _, check in report.checks) is Validity.PASS
