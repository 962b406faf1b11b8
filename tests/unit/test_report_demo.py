"""The demo's matrix and printed summary (its run in containers is ``make demo``; its page is checked by
``test_report_page.py`` and ``tests/integration/test_report_browser.py``)."""

from __future__ import annotations

from pathlib import Path

from squall.checks import Target
from squall.cli.demo import DEMO_MATRIX, summary_text
from squall.experiment.matrix import load_matrix_file
from squall.profiles import load_profile
from squall.protocols.catalog import PROTOCOLS
from squall.report.compare import cell_figures, compare
from tests.unit.test_report_page import realistic_results


def test_the_demo_matrix_is_at_least_four_protocols_on_three_contrasting_profiles() -> None:
    spec = load_matrix_file(DEMO_MATRIX, known_protocols=PROTOCOLS)
    assert len(spec.matrix.protocols) >= 4 and spec.matrix.workers == (4,)
    assert len(spec.matrix.profiles) >= 3
    links = [load_profile(p).link(0, 1, 4) for p in spec.matrix.profiles]
    assert len({(s.delay_us, s.loss.probability, s.rate_bps) for s in links}) == len(links)  # all different
    assert spec.run.get("target") and spec.run.get("seconds", 99) <= 10  # short runs, to a target


def test_the_summary_lists_each_pair_with_its_ratio_and_bytes() -> None:
    results = realistic_results()
    target = Target("accuracy", 0.9)
    c = compare([cell_figures(cell.trace, target) for cell in results.cells])
    text = summary_text(results, c, target, Path("results/demo/report.html"))
    lines = text.splitlines()
    assert lines[-1] == "report: results/demo/report.html"
    rows = [line.split() for line in lines if line.startswith(("lan", "lossy", "wan"))]
    assert len(rows) == 12
    lossy = next(line for line in lines if line.startswith("lossy-1pct"))
    assert "failed" in lossy  # its calibration, on the first row of the profile
    ring_wan = next(line for line in lines if " ring " in line and "9.25 s" in line)
    assert "2.50x" in ring_wan and "288 KB" in ring_wan
