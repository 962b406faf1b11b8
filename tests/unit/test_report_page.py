"""The report answers a user's four questions, on synthetic results whose figures are known exactly.

:func:`realistic_results` (also rendered in headless Chromium by
``tests/integration/test_report_browser.py``): four protocols on three contrasting profiles, four
workers, two seeds; protocol ``k`` makes a step every ``STEP_S[k]`` seconds and sends
``BYTES_PER_STEP[k]`` bytes a step, so its time and bytes to target follow from arithmetic. The
calibration of ``lossy-1pct`` failed on one link; ``wan-50ms-100mbit`` was never calibrated.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import warnings
from pathlib import Path

import pytest
import yaml

from squall.checks import Target, Validity, Verdict
from squall.checks.fidelity import CalibrationRow, fidelity
from squall.report import provenance
from squall.report.compare import SCHEMA_FIELDS, cell_figures, compare, own_fields
from squall.report.network import describe_profiles
from squall.report.page import CellResult, Results, html_page, load_results, markdown, write_report
from squall.run_meta import RunMeta
from squall.run_trace import RunTrace, StepRecord
from squall.training.run.records import RESERVED

PROFILES = ("lan", "wan-50ms-100mbit", "lossy-1pct")
PROTOCOLS = ("ring", "dpsgd", "local_sgd", "randk")
STEP_S = {"ring": 0.10, "dpsgd": 0.05, "local_sgd": 0.04, "randk": 0.08}  # seconds per step on lan
SLOWER = {"lan": 1.0, "wan-50ms-100mbit": 4.0, "lossy-1pct": 2.0}  # each profile's factor on step time
BYTES_PER_STEP = {"ring": 12_000, "dpsgd": 8_000, "local_sgd": 3_000, "randk": 1_200}
TARGET_STEP = 20  # accuracy reaches 0.9 at this step on every worker (worker w one step later per w)
WORKERS = 4
OWN: dict[str, dict[str, float]] = {
    "ring": {"chunks": 3}, "randk": {"density": 0.1, "kept": 650}, "dpsgd": {}, "local_sgd": {"sync_every": 4}}


def synthetic_trace(protocol: str, profile: str, seed: int) -> RunTrace:
    """Worker ``w`` meets the target at step ``TARGET_STEP + w``; the last worker decides the run's time."""
    step_s = STEP_S[protocol] * SLOWER[profile] * (1.0 + 0.01 * seed)
    recs = []
    for w in range(WORKERS):
        for k in range(TARGET_STEP + WORKERS + 5):
            acc = 0.5 + 0.4 * min(1.0, k / (TARGET_STEP + w))
            recs.append(StepRecord(worker=w, step=k, t=k * step_s, loss=2.0 / (1 + k) + 0.01 * w, accuracy=acc,
                                   bytes_sent=(k + 1) * BYTES_PER_STEP[protocol], projection=(1.0 + 0.1 / (1 + k) * w,),
                                   extra={"step_s": step_s, **OWN[protocol]}))
    summaries = [{"steps": TARGET_STEP + WORKERS + 4, "stopped_by": "seconds", "final_eval": {"accuracy": 0.9},
                  "compute_s": 1.0, "bytes_sent": 1, "param_hash": "ab", "norm": 1.0, "projection": [1.0],
                  **{k: v + w for k, v in OWN[protocol].items()}} for w in range(WORKERS)]
    return RunTrace(protocol, profile, WORKERS, seed, "netem", tuple(sorted(recs, key=lambda r: (r.t, r.worker))),
                    meta=RunMeta.from_json({"task": "logreg_digits", "lr": 0.5, "batch_size": 32, "budget_s": 20.0,
                          "summaries": summaries}))


def calibration() -> list[CalibrationRow]:
    """Calibration rows as a session keeps them (``CalibrationReport.fidelity_rows``): lan passed, lossy-1pct
    failed once."""
    def row(*cells: str) -> CalibrationRow:  # profile, link, quantity, configured, measured, tolerance, verdict
        profile, link, metric, configured, measured, tolerance, verdict = cells
        return CalibrationRow(profile, "netem", link, metric, configured, measured, tolerance, verdict,
                              f"{metric} checked")

    return [row("lan", "0->1", "delay", "0.100 ms", "0.102 ms", "0.090..0.110 ms", "passed"),
            row("lan", "2->3", "rate", "1000.0 Mbit/s", "980.0 Mbit/s", "900.0..1100.0 Mbit/s", "passed"),
            row("lossy-1pct", "0->1", "delay", "5.000 ms", "5.010 ms", "4.500..5.500 ms", "passed"),
            row("lossy-1pct", "0->1", "loss", "1.000 %", "3.200 %", "0.900..1.100 %", "failed"),
            row("lossy-1pct", "2->3", "loss", "1.000 %", "1.100 %", "0.900..1.100 %", "unknown")]


def realistic_results() -> Results:
    cells = []
    for profile in PROFILES:
        for protocol in PROTOCOLS:
            for seed in (0, 1):
                trace = synthetic_trace(protocol, profile, seed)
                verdict = Verdict("converged", True, round(trace.duration, 3), "accuracy >= 0.9",
                                  "all 4 surviving workers reached it")
                cells.append(CellResult(f"{protocol}-{profile}-w4-s{seed}", trace, (verdict,)))
    prov = provenance.finish(provenance.collect(["squall", "matrix", "--file", "matrices/demo.yaml"]))
    meta = {"cells": len(cells), "shaping backend": "netem", "duration_s": 95.5, "provenance": prov,
            "run": {"seconds": 20, "lr": 0.5, "target": {"accuracy": 0.9}, "config": {"eval_every": 5}},
            "profiles": describe_profiles((p, WORKERS) for p in PROFILES)}
    return Results(title="Squall demo", cells=tuple(cells), calibration=tuple(calibration()), meta=meta)


def pngs(page: str) -> list[tuple[int, int]]:
    """(width, height) of every embedded PNG, read from its IHDR chunk."""
    out = []
    for data in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page):
        raw = base64.b64decode(data)
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
        out.append(struct.unpack(">II", raw[16:24]))
    return out


@pytest.fixture(scope="module")
def results() -> Results:
    return realistic_results()


@pytest.fixture(scope="module")
def page(results: Results) -> str:
    return html_page(results)


def test_time_and_bytes_to_target_follow_from_the_records() -> None:
    trace = synthetic_trace("ring", "wan-50ms-100mbit", 0)
    f = cell_figures(trace, Target("accuracy", 0.9))
    last = TARGET_STEP + WORKERS - 1  # the slowest worker's first step at the target
    assert f.seconds_to_target == pytest.approx(last * 0.10 * 4.0)
    assert f.bytes_to_target == pytest.approx((last + 1) * BYTES_PER_STEP["ring"])  # every worker, by then
    assert f.steps == TARGET_STEP + WORKERS + 4
    assert cell_figures(trace, Target("accuracy", 0.99)).seconds_to_target is None  # never reached


def test_the_comparison_gives_each_profiles_best_ratio_one(results: Results) -> None:
    target = Target("accuracy", 0.9)
    c = compare([cell_figures(cell.trace, target) for cell in results.cells])
    for profile in PROFILES:
        assert c.ratio("local_sgd", profile) == pytest.approx(1.0)  # the fastest everywhere
        assert c.ratio("ring", profile) == pytest.approx(0.10 / 0.04)
        assert c.reached[("ring", profile)] == (2, 2)
    # the median over the two seeds: step time x (1 + 0.005)
    assert c.seconds[("dpsgd", "lan")] == pytest.approx(23 * 0.05 * 1.005)


def test_the_page_answers_what_network(page: str) -> None:
    for name in PROFILES:
        assert f"<h3>{name}</h3>" in page
    assert "Continental WAN, 50 ms one-way delay" in page and "netem_profiles/wan-50ms-100mbit.yaml" in page
    assert "<td class=\"\">all 12</td><td class=\"\">50ms</td><td class=\"\">2ms normal (correlation 25%)</td>" in page
    assert "<td class=\"\">1%</td>" in page  # lossy-1pct's loss


def test_the_page_flags_cells_run_on_links_that_failed_calibration(results: Results, page: str) -> None:
    assert fidelity("lossy-1pct", results.calibration).state == "failed"
    assert fidelity("lan", results.calibration).state == "faithful"
    assert fidelity("wan-50ms-100mbit", results.calibration).state == "not calibrated"
    flags = re.findall(r"<div class='flag'><b>Flagged:</b> ([^<]*)</div>", page)
    assert len(flags) == 1 and "ring-lossy-1pct-w4-s0" in flags[0] and "0-&gt;1 loss" in flags[0]
    assert "lan-w4" not in flags[0]
    rows = re.findall(r"<tr><td class=\"\">([a-z_]+-[a-z0-9-]+-w4-s[01])</td><td class=\"\">netem</td>"
                      r"<td class=\"pass\">pass</td><td class=\"(\w*)\">([^<]*)</td>", page)
    network = {cell: state for cell, _, state in rows}
    assert len(network) == 24
    assert {network[f"{p}-lossy-1pct-w4-s0"] for p in PROTOCOLS} == {"FLAGGED: calibration failed"}
    assert {network[f"{p}-lan-w4-s1"] for p in PROTOCOLS} == {"faithful"}
    assert {network[f"{p}-wan-50ms-100mbit-w4-s0"] for p in PROTOCOLS} == {"not calibrated"}


def test_the_page_compares_protocols_with_plots(page: str) -> None:
    sizes = pngs(page)
    # heatmap, bytes to target, loss vs time, loss vs bytes, drift
    assert len(sizes) == 5 and all(w > 200 and h > 100 for w, h in sizes)
    for title in ("Time to target", "Bytes to target", "Loss against wall time", "Loss against bytes sent"):
        assert f"<img alt='{title}'" in page
    assert "<td class=\"\">2.50x (2 seeds)</td>" in page  # ring against local_sgd: too few seeds for an interval
    assert "<td class=\"\">1.00x (best)</td>" in page


def test_each_protocols_own_fields_are_shown_and_schema_fields_are_not(results: Results, page: str) -> None:
    ring = next(c.trace for c in results.cells if c.trace.protocol == "ring")
    assert own_fields(ring) == {"chunks": 4.5}  # median over the workers' summaries 3, 4, 5, 6
    randk = next(c.trace for c in results.cells if c.trace.protocol == "randk")
    assert own_fields(randk) == {"density": pytest.approx(1.6), "kept": 651.5}
    assert "<h4>randk</h4><table><thead><tr><th>cell</th><th>density</th><th>kept</th></tr>" in page
    assert "<h4>dpsgd</h4>" not in page  # no fields of its own
    assert "<th>compute_s</th>" not in page and "<th>step_s</th>" not in page


def test_the_schema_fields_the_report_skips_cover_the_record_schema() -> None:
    assert RESERVED <= SCHEMA_FIELDS


def test_the_page_says_how_to_reproduce_it(results: Results, page: str) -> None:
    repro = dict(re.findall(r"<dt>([^<]*)</dt><dd>([^<]*)</dd>", page))
    assert repro["command"] == "squall matrix --file matrices/demo.yaml"
    assert re.fullmatch(r"[0-9a-f]{40}( \(with local changes\))?", repro["commit"])
    assert repro["seeds"] == "0, 1" and repro["workers"] == "4" and repro["shaping backend"] == "netem"
    assert repro["Squall version"] not in ("", "not recorded") and repro["kernel"].startswith("Linux ")
    assert repro["host load before"].endswith("(1, 5, 15 min)") and repro["host load after"].endswith("(1, 5, 15 min)")
    assert "lr: 0.5" in repro["per-run settings"]
    matrix = re.search(r"<pre>([^<]*)</pre>", page)
    assert matrix is not None
    data = yaml.safe_load(matrix.group(1).replace("&#x27;", "'").replace("&quot;", '"'))
    assert data == {"protocols": sorted(PROTOCOLS), "profiles": sorted(PROFILES), "workers": [4], "seeds": [0, 1],
                    "run": {"seconds": 20, "lr": 0.5, "target": {"accuracy": 0.9}, "config": {"eval_every": 5}}}


def test_no_python_repr_reaches_either_page(results: Results, page: str) -> None:
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    md = markdown(results)
    for doc in (text, md):
        for repr_mark in ("{'", "['", "':", "',", "&#x27;:", "{&#x27;", "[&#x27;", "(0, 1)", "None"):
            assert repr_mark not in doc, repr_mark


def test_results_round_trip_and_the_markdown_answers_the_same_questions(tmp_path: Path, results: Results) -> None:
    md, _ = write_report(results, tmp_path)
    again = load_results(tmp_path)
    assert markdown(again) == md.read_text()
    text = md.read_text()
    for heading in ("## What network?", "## Was the emulation faithful?", "## How do the protocols compare?",
                    "## How do I reproduce it?"):
        assert heading in text
    assert "| lossy-1pct | netem | 3 | 1 | 1 | FLAGGED: calibration failed |" in text
    assert "| lossy-1pct | 0->1 | loss | 1.000 % | 3.200 % | 0.900..1.100 % | failed | loss checked |" in text
    assert again.calibration == results.calibration  # typed rows, back as they went


def test_a_results_file_from_before_typed_rows_still_loads(tmp_path: Path) -> None:
    """Rows written before the profile, backend and reason were kept (and numbers where text is now) load
    with ``-`` for what they lack; a row of the wrong shape is refused naming the file, row and key."""
    old = {"title": "old", "calibration": [
        {"link": "0->1", "quantity": "delay", "configured": "5 ms", "measured": 5.02, "tolerance": "0.5 ms",
         "verdict": "pass"},
        {"profile": "lan", "link": "all", "quantity": "calibration", "verdict": "failed", "why": "boom"}]}
    (tmp_path / "results.json").write_text(json.dumps(old))
    first, second = load_results(tmp_path).calibration
    assert first == CalibrationRow("-", "-", "0->1", "delay", "5 ms", "5.02", "0.5 ms", "pass", "-")
    assert first.validity is Validity.PASS and second.validity is Validity.FAIL
    assert fidelity("lan", [first, second]).state == "failed"
    for bad, message in (({"link": [0, 1]}, "calibration[0]: 'link' must be text or a number, got list"),
                         ({"metric": "delay"}, "calibration[0]: unknown keys ['metric']; allowed: profile, backend"),
                         ("0->1 delay", "calibration[0]: expected an object")):
        (tmp_path / "results.json").write_text(json.dumps({"calibration": [bad]}))
        with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'results.json'}: {message}")):
            load_results(tmp_path)


def test_provenance_is_plain_data() -> None:
    before = provenance.collect(["/venv/bin/squall", "run", "--profile", "my profile.yaml"])
    assert before["command"] == "squall run --profile 'my profile.yaml'"
    after = provenance.finish(before)
    json.dumps(after)  # plain data
    assert "_started" not in after and after["elapsed_s"] >= 0 and len(after["load_after"]) == 3
    assert set(after) >= {"squall_version", "commit", "dirty", "kernel", "python", "cpus", "docker", "load_before"}
    assert provenance.command_line(["/x/squall/__main__.py", "demo"]) == "python -m squall demo"


def test_an_unknown_profile_is_described_not_raised() -> None:
    info = describe_profiles([("no-such-profile-here", 4)])["no-such-profile-here"]
    assert info["links"] == [] and "not found" in info["description"]


def test_a_profile_given_by_path_is_described_under_its_own_name(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\ndescription: thirty ms and two percent\nlinks:\n  default: {delay: 30ms, loss: 2%}\n")
    info = describe_profiles([(str(path), 4)])["mine"]
    assert info["source"] == str(path) and info["description"] == "thirty ms and two percent"
    assert info["links"] == [["all 12", "30ms", "-", "2%", "-", "-", "unlimited", "auto"]]


def test_runs_without_a_loss_draw_no_empty_loss_figures() -> None:
    # a program that reports only its own metric (e.g. an averaging error): no loss curve to draw, and no empty
    # panel with a legend matplotlib would warn about
    from squall.report.plots import plot_loss, plot_loss_vs_bytes

    recs = tuple(StepRecord(worker=w, step=k, t=0.1 * k, bytes_sent=1000 * k) for w in range(2) for k in range(3))
    trace = RunTrace("peer", "lan", 2, 0, "nfqueue", recs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_loss([trace]) is None and plot_loss_vs_bytes([trace]) is None
        assert plot_loss([trace, synthetic_trace("ring", "lan", 0)]) is not None
