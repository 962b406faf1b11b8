"""Reports: results round-trip through JSON; Markdown and self-contained HTML with plots and tables."""

from __future__ import annotations

import math
import re
from pathlib import Path

from squall.checks import Verdict
from squall.checks.fidelity import CalibrationRow
from squall.report.page import CellResult, ClaimResult, Results, load_results, markdown, write_report
from squall.run_trace import ChurnMark, RunTrace, StepRecord


def synthetic_trace(protocol: str, profile: str, speed: float) -> RunTrace:
    recs = []
    for w in range(3):
        for k in range(40):
            t = k * 0.1 / speed
            spread = 0.01 * math.exp(-k / 10) * (w - 1)
            recs.append(StepRecord(worker=w, step=k, t=t, loss=2.0 * math.exp(-k / 12) + 0.05,
                                   accuracy=min(0.97, 0.1 + k / 40), projection=(1.0 + spread, -spread)))
    return RunTrace(protocol, profile, 3, 0, "nfqueue", tuple(sorted(recs, key=lambda r: r.t)),
                    churn=(ChurnMark(1.0, "kill", (2,)), ChurnMark(2.0, "restart", (2,))))


def synthetic_results() -> Results:
    cells = []
    for profile in ("lan", "wan-5ms"):
        for protocol, speed in (("ring", 1.0), ("butterfly", 2.0)):
            verdicts = (Verdict("converged", True, 1.2, "accuracy >= 0.9", "all reached it"),
                        Verdict("drift_bounded", protocol == "ring", 0.02, "<= 0.1", "peak 0.02 | fine"))
            cells.append(CellResult(f"{protocol}-{profile}-w3", synthetic_trace(protocol, profile, speed), verdicts))
    claims = (ClaimResult("sesgd-wan", "SESGD", "butterfly beats ring", "up to 5x at 5 ms", "8 workers, wan-5ms",
                          Verdict("speedup", True, 2.3, ">= 2", "median over 3 seeds")),)
    calibration = (CalibrationRow("wan-5ms", "nfqueue", "0->1", "delay", "5 ms", "5.02 ms", "0.5 ms", "pass", "-"),)
    return Results(title="test report", cells=tuple(cells), claims=claims, calibration=calibration,
                   meta={"backend": "nfqueue"})


def test_report_pages_and_round_trip(tmp_path: Path) -> None:
    results = synthetic_results()
    md, page = write_report(results, tmp_path)
    text = page.read_text()
    assert len(re.findall(r"data:image/png;base64,[A-Za-z0-9+/=]{1000,}", text)) == 3  # loss, drift, claims
    assert "http://" not in text and "https://" not in text  # self-contained
    for needle in ("ring-wan-5ms-w3", "butterfly beats ring", "5.02 ms", 'class="pass"', 'class="fail"'):
        assert needle in text
    md_text = md.read_text()
    assert "| butterfly-lan-w3 | nfqueue | FAIL |" in md_text
    assert "| ring-lan-w3 | nfqueue | pass |" in md_text and "peak 0.02 \\| fine" in md_text
    again = load_results(tmp_path)
    assert markdown(again) == md_text
    assert again.cells[0].trace.churn[0].kind == "kill"


def test_an_empty_report_still_renders(tmp_path: Path) -> None:
    _, page = write_report(Results(title="empty"), tmp_path)
    assert "<h1>empty</h1>" in page.read_text()


def test_a_claims_figures_show_in_words_with_the_reason() -> None:
    verdict = Verdict("straggler_robustness", False, {"step_speedup": 1.23456, "curve": [1.0, 2.5]}, ">= 1.6x",
                      "step speed-up short: 1.23x")
    page = markdown(Results(title="t", cells=(), claims=(ClaimResult("c", "p", "w", "f", "s", verdict),)))
    assert "step_speedup: 1.235, curve: [1, 2.5]" in page and "step speed-up short: 1.23x" in page
    assert "{'" not in page  # no Python repr
