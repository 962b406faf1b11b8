"""The report's compute utilization (measured over whole periods, the alpha-beta prediction, findings, emulation
flags) and the low-communication claim kinds, on hand-made traces."""

from __future__ import annotations

from typing import Any

import pytest

from squall.claims.kinds.base import Claim
from squall.claims.kinds.lowcomm import bytes_ratio, loss_and_bytes, normalised_peak, peak_bandwidth
from squall.report.page import CellResult, Results, html_page, markdown
from squall.report.utilization import emulation_flags, utilization
from squall.run_meta import RunMeta
from squall.run_trace import RunTrace, StepRecord

T_C = 0.2


def trace(protocol: str, *, period: int, comm_every: float, steps: int, profile: str = "grid-100mbit-50ms",
          overlap: int = 0, per_sync: int = 1000, link: int = 6_000_384, hops: int = 6, loss: float = 2.0,
          valid: bool = True, workers: int = 2, seed: int = 0) -> RunTrace:
    """A lock-step run whose every ``period``-th step also waits ``comm_every`` s and sends ``per_sync`` bytes."""
    records, summaries = [], []
    for w in range(workers):
        sent = 100  # the start barrier
        records.append(StepRecord(w, 0, 0.0, bytes_sent=sent))
        for k in range(1, steps + 1):
            sync = k % period == overlap % period
            sent += per_sync if sync else 0
            records.append(StepRecord(w, k, float(k), loss=loss, bytes_sent=sent,
                                      extra={"step_s": T_C + (comm_every if sync else 0.0)}))
        summaries.append({"rank": w, "steps": steps, "bytes_sent": sent, "avg_bytes_total": sent - 100,
                          "final_eval": {"loss": loss}, "avg_every": period, "overlap_steps": overlap,
                          "avg_link_bytes": link, "avg_hops": hops,
                          "device": {"step_time_s": T_C, "valid": valid, "overrun_s": 0.0 if valid else 3.0}})
    return RunTrace(protocol, profile, workers, seed, "nfqueue", tuple(records),
                    meta=RunMeta(summaries=tuple(summaries)))


def test_utilization_is_measured_over_whole_periods_and_predicted_by_alpha_beta() -> None:
    u = utilization(trace("diloco_h10", period=10, comm_every=0.5, steps=105))
    assert u is not None
    assert u.measured == pytest.approx(10 * T_C / (10 * T_C + 0.5))  # window (10, 100]: 9 whole periods
    assert u.steps == 90
    t = 6 * 0.05 + 6_000_384 * 8 / 100e6  # 6 one-way delays + the link's bytes at 100 Mbit/s
    assert u.comm_s == pytest.approx(t)
    assert u.predicted == pytest.approx(10 * T_C / (10 * T_C + t))
    assert u.measured is not None and u.predicted is not None
    assert u.finding == (abs(u.measured / u.predicted - 1) > 0.15)


def test_overlap_hides_communication_up_to_tau_steps() -> None:
    u = utilization(trace("streaming_diloco", period=50, overlap=1, comm_every=0.1, steps=210, link=10_000, hops=2))
    assert u is not None and u.predicted == 1.0  # 2 x 50 ms + 10 kB at 100 Mbit/s < one 200 ms step
    assert u.measured is not None and u.measured < 1


def test_runs_without_an_emulated_device_have_no_utilization() -> None:
    t = trace("ddp_adamw", period=1, comm_every=0.1, steps=5)
    for s in t.meta.summaries:
        del s["device"]
    assert utilization(t) is None


def test_the_report_draws_the_surface_and_flags_invalid_emulation() -> None:
    cells = [trace("ddp_adamw", period=1, comm_every=2.0, steps=20, valid=False),
             trace("diloco_h10", period=10, comm_every=2.0, steps=40)]
    results = Results(cells=tuple(CellResult(f"{c.protocol}-x-w2", c) for c in cells))
    md = markdown(results)
    assert "### Compute utilization" in md and "**finding** ddp_adamw on grid-100mbit-50ms" in md
    assert "the emulated device is INVALID on workers [0, 1]" in md
    assert "Compute utilization: measured, predicted, ratio" in html_page(results)
    assert emulation_flags([cells[1]]) == []


def claim(check: str, **kw: Any) -> Claim:
    base: dict[str, Any] = {"id": "x", "paper": "p", "claim": "c", "paper_figure": "f", "our_setting": "s",
                            "check": check, "profiles": ("lan",), "workers": 2, "seeds": (0,),
                            "run": {"steps": 40}}
    return Claim(**{**base, **kw})


def runner(traces: dict[str, RunTrace]) -> Any:
    return lambda spec, workers: traces[spec.protocol]


def test_bytes_ratio_is_exact_and_checks_the_formula() -> None:
    c = claim("bytes_ratio", fast="diloco_h10", slow="ddp_adamw", params={"ratio": 10})
    runs = {"diloco_h10": trace("diloco_h10", period=10, comm_every=0, steps=40, per_sync=1000),
            "ddp_adamw": trace("ddp_adamw", period=1, comm_every=0, steps=40, per_sync=1000)}
    assert bytes_ratio(c, runner(runs)).passed
    runs["ddp_adamw"] = trace("ddp_adamw", period=1, comm_every=0, steps=40, per_sync=1001)
    verdict = bytes_ratio(c, runner(runs))
    assert verdict.passed is False and "40040 / 4000" in verdict.why


def test_loss_and_bytes_takes_one_threshold_per_candidate() -> None:
    c = claim("loss_and_bytes", slow="ddp_adamw", protocols=("demo", "sparta"),
              params={"margin": {"demo": 0.15, "sparta": 0.05}, "min_bytes_ratio": {"demo": 5}})
    runs = {"ddp_adamw": trace("ddp_adamw", period=1, comm_every=0, steps=40, per_sync=6000, loss=2.0),
            "demo": trace("demo", period=1, comm_every=0, steps=40, per_sync=1000, loss=2.2),
            "sparta": trace("sparta", period=1, comm_every=0, steps=40, per_sync=30, loss=2.2)}
    verdict = loss_and_bytes(c, runner(runs))
    assert verdict.passed is False and "sparta: loss 2.2000 is +10.0 %" in verdict.why and "demo" not in verdict.why
    assert verdict.measured["demo"]["bytes_ratio"] == 6.0


def test_peak_bandwidth_compares_peaks_at_equal_mean_bytes() -> None:
    diloco = trace("diloco", period=20, comm_every=0, steps=80, per_sync=2000)
    streaming = trace("streaming_diloco", period=10, comm_every=0, steps=80, per_sync=200)
    assert normalised_peak(diloco) == pytest.approx(20.0)
    assert normalised_peak(streaming) == pytest.approx(10.0)
    c = claim("peak_bandwidth", fast="streaming_diloco", slow="diloco", params={"peak_max": 0.55})
    verdict = peak_bandwidth(c, runner({"diloco": diloco, "streaming_diloco": streaming}))
    assert verdict.passed and verdict.measured["peak_ratio"] == 0.5
