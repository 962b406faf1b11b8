"""Per-segment fidelity (squall/calibration/segments.py) on made-up probes, and the trace plot."""

from __future__ import annotations

import random

from squall.calibration.judge import Baseline
from squall.calibration.observations import Sample
from squall.calibration.segments import SegmentReport, judge_segment, segments_of, summary_table
from squall.calibration.stalls import HOST
from squall.profiles import LinkSpec, Loss
from squall.report.plots import configured_series, plot_trace_fidelity
from squall.run_meta import RunMeta
from squall.run_trace import RunTrace, StepRecord
from squall.shaping import LinkState, TimedState

BASE = Baseline(one_way_mean_us=40.0, one_way_sd_us=10.0, rtt_mean_us=80.0, rtt_sd_us=14.0, samples=300)
RATE = 500.0


def state(delay_ms: float, loss_pct: float = 0.0) -> LinkState:
    spec = LinkSpec(delay_us=int(delay_ms * 1000), loss=Loss(probability=loss_pct / 100))
    return LinkState({(0, 1): spec, (1, 0): spec})


def probes(timeline: list[TimedState], end_s: float, *, lie_ms: float = 0.0, lose: float = 0.0,
           seed: int = 1) -> tuple[list[Sample], list[tuple[int, float]]]:
    """What a correct (or, with ``lie_ms``, a wrong) link shows the probe of 0 -> 1, sent from t = 0."""
    rng = random.Random(seed)
    samples, sent = [], []
    for seq in range(int(end_s * RATE)):
        at = seq / RATE
        sent.append((seq, at))
        current = [t for t in timeline if t.at_s <= at][-1].state.links[(0, 1)]
        if rng.random() < lose:
            continue
        forward = current.delay_us + 40 + rng.gauss(0, 10) + lie_ms * 1000
        samples.append(Sample(seq, at, forward, current.delay_us + 40.0, 2 * forward))
    return samples, sent


TIMELINE = [TimedState(0.0, "start", state(20)), TimedState(1.0, "trace", state(5)),
            TimedState(1.3, "trace", state(50)), TimedState(3.5, "trace", state(10))]


def test_segments_cover_the_timeline() -> None:
    segments = segments_of(TIMELINE, 5.0)
    assert [(s.start_s, s.end_s) for s in segments] == [(0.0, 1.0), (1.0, 1.3), (1.3, 3.5), (3.5, 5.0)]


def judge_all(samples: list[Sample], sent: list[tuple[int, float]]) -> list[tuple[int, list, list]]:
    segments = segments_of(TIMELINE, 5.0)
    out = []
    for i, segment in enumerate(segments):
        checks, short = judge_segment(segment, segments[i - 1] if i else None, (0, 1), samples, sent_seqs=sent,
                                      start_wall=0.0, baseline=BASE, policy=HOST)
        out.append((segment.index, checks, short))
    return out


def test_a_correct_link_passes_every_segment_it_can_judge() -> None:
    samples, sent = probes(TIMELINE, 5.0)
    results = judge_all(samples, sent)
    delays = [(i, c.verdict) for i, checks, _ in results for c in checks if c.metric == "delay"]
    assert delays == [(0, "passed"), (1, "passed"), (2, "passed"), (3, "passed")]
    losses = [c.verdict for _, checks, _ in results for c in checks if c.metric == "rtt_loss"]
    assert losses and set(losses) == {"passed"}


def test_a_wrong_delay_fails_its_segments() -> None:
    samples, sent = probes(TIMELINE, 5.0, lie_ms=3.0)
    results = judge_all(samples, sent)
    assert {c.verdict for _, checks, _ in results for c in checks if c.metric == "delay"} == {"failed"}


def test_a_short_segment_is_listed_not_judged() -> None:
    samples, sent = probes(TIMELINE, 5.0)
    lossy = [TimedState(t.at_s, t.label, state(t.state.links[(0, 1)].delay_us / 1000, 1.0)) for t in TIMELINE]
    segments = segments_of(lossy, 5.0)
    checks, short = judge_segment(segments[1], segments[0], (0, 1), samples, sent_seqs=sent, start_wall=0.0,
                                  baseline=BASE, policy=HOST)
    assert ("loss" in {q for q, _ in short}) and not [c for c in checks if c.metric == "rtt_loss"]
    report = SegmentReport(tuple(segments), tuple((1, c) for c in checks), tuple((1, q, w) for q, w in short))
    assert "too short to judge: delay in 0 segments, loss in 1 segments" in summary_table(report)


def test_the_plot_draws_the_configured_trace_and_the_loss() -> None:
    timeline = {"duration_s": 4.0, "changes": [
        {"index": 0, "at_s": 0.0, "applied_s": 0.0, "links": [{"links": ["0->1"], "settings": {"delay_us": 20000,
                                                                                              "rate_bps": 10**7}}]},
        {"index": 1, "at_s": 2.0, "applied_s": 2.001, "links": [{"links": ["0->1", "1->0"],
                                                                 "settings": {"delay_us": 5000, "rate_bps": None}}]}]}
    assert configured_series(timeline, "0->1", "delay_us") == ([0.0, 2.001], [20000.0, 5000.0])
    records = tuple(StepRecord(w, s, s * 0.1, loss=1.0 / (s + 1)) for w in range(2) for s in range(40))
    trace = RunTrace("ring", "p", 2, 0, "nfqueue", records, meta=RunMeta.from_json({"timeline": timeline}))
    segments = {"segments": [{"index": 0, "start_s": 0.0, "end_s": 2.0}],
                "checks": [{"segment": 0, "metric": "delay", "measured": 20.1, "verdict": "passed"}]}
    assert plot_trace_fidelity(trace, segments)
    assert plot_trace_fidelity(RunTrace("ring", "p", 2, 0, "nfqueue", records)) is None
