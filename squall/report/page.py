"""Reports: a Markdown summary and a self-contained HTML page with plots, from a results file.

Inputs are plain data (``results.json`` written by the plugin or ``squall matrix``): cells (a trace
and the verdicts of its checks), claims (paper figure, our figure, verdict) and calibration rows.
``squall report DIR`` rebuilds the pages from that file at any time. This module lays the pages
out; the plots are :mod:`squall.report.plots`' PNGs, embedded in the HTML as data URIs, so the
page is one file that can be attached to a CI run. A cell's verdict is its checks merged by the one
rule (:func:`squall.checks.merge`), a profile's fidelity :mod:`squall.checks.fidelity`'s.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from squall.checks import Target, Validity, Verdict, merge
from squall.checks.fidelity import CalibrationRow, Fidelity, fidelity_by_profile
from squall.checks.verdict import figure
from squall.report import utilization
from squall.report.compare import (
    COMPARE_HEAD,
    CellFigures,
    Comparison,
    cell_figures,
    compare,
    comparison_rows,
    megabytes,
    stats_tables,
    target_from,
)
from squall.report.comparison import comparison_section
from squall.report.comparison import markdown as comparison_markdown
from squall.report.network import LINK_HEAD, profile_sections
from squall.report.plots import (
    plot_bytes_to_target,
    plot_claims,
    plot_drift,
    plot_heatmap,
    plot_loss,
    plot_loss_vs_bytes,
    plot_owner_drift,
    plot_trace_fidelity,
    plot_utilization,
)
from squall.report.programs import RANKS_HEAD, cell_state, program_sections
from squall.report.reproduce import matrix_text, reproduce_rows
from squall.run_trace import RunTrace, trace_from_json, trace_to_json

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
#: A validity's word in the report's tables.
STATE = {Validity.PASS: "pass", Validity.FAIL: "FAIL", Validity.UNKNOWN: "unknown"}


@dataclass(frozen=True)
class CellResult:
    """One cell of a matrix: its trace and the verdicts of its checks."""

    cell_id: str  # e.g. "ring-wan_5ms-w8"
    trace: RunTrace  # what the run produced
    verdicts: tuple[Verdict, ...] = ()  # its checks


@dataclass(frozen=True)
class ClaimResult:
    """A paper's claim next to what we measured."""

    claim_id: str  # registry id
    paper: str  # short citation
    claim: str  # the claim in words
    paper_figure: str  # the paper's number and setting
    our_setting: str  # our scaled-down setting
    verdict: Verdict  # measured vs threshold


@dataclass(frozen=True)
class Results:
    """Everything a report shows."""

    title: str = "Squall report"  # page title
    cells: tuple[CellResult, ...] = ()  # matrix cells
    claims: tuple[ClaimResult, ...] = ()  # claims
    calibration: tuple[CalibrationRow, ...] = ()  # every profile's calibration checks
    meta: Mapping[str, Any] = field(default_factory=dict)  # machine, backend, duration...
    comparisons: tuple[Mapping[str, Any], ...] = ()  # a matrix's compare: entries, as squall compare --json prints


# -- persistence --------------------------------------------------------------------------------
def _verdict_json(v: Verdict) -> dict[str, Any]:
    return {"check": v.check, "passed": v.passed, "measured": v.measured, "expected": v.expected, "why": v.why}


def _verdict_from(obj: Mapping[str, Any]) -> Verdict:
    return Verdict(obj["check"], obj["passed"], obj["measured"], obj["expected"], obj["why"])


def results_to_json(results: Results) -> dict[str, Any]:
    """Plain data for ``results.json``."""
    return {
        "title": results.title, "meta": dict(results.meta), "calibration": [r.to_json() for r in results.calibration],
        "cells": [{"id": c.cell_id, "trace": trace_to_json(c.trace), "verdicts": [_verdict_json(v) for v in c.verdicts]}
                  for c in results.cells],
        "claims": [{"id": c.claim_id, "paper": c.paper, "claim": c.claim, "paper_figure": c.paper_figure,
                    "our_setting": c.our_setting, "verdict": _verdict_json(c.verdict)} for c in results.claims],
        "comparisons": [dict(c) for c in results.comparisons],
    }


def results_from_json(obj: Mapping[str, Any]) -> Results:
    """The inverse of :func:`results_to_json`; calibration rows of older files too
    (:meth:`~squall.checks.fidelity.CalibrationRow.from_json`)."""
    cells = tuple(CellResult(c["id"], trace_from_json(c["trace"]), tuple(_verdict_from(v) for v in c["verdicts"]))
                  for c in obj.get("cells", []))
    claims = tuple(ClaimResult(c["id"], c["paper"], c["claim"], c["paper_figure"], c["our_setting"],
                               _verdict_from(c["verdict"])) for c in obj.get("claims", []))
    return Results(title=obj.get("title", "Squall report"), cells=cells, claims=claims,
                   calibration=tuple(CalibrationRow.from_json(r, f"calibration[{i}]")
                                     for i, r in enumerate(obj.get("calibration", []))),
                   meta=dict(obj.get("meta", {})), comparisons=tuple(obj.get("comparisons", [])))


def save_results(results: Results, directory: Path) -> Path:
    """Write ``results.json`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RESULTS_FILE
    path.write_text(json.dumps(results_to_json(results), indent=1, default=str))
    return path


def load_results(directory: Path) -> Results:
    """Read ``results.json`` from ``directory``; ``ValueError`` names the file and what in it is wrong."""
    path = directory / RESULTS_FILE
    try:
        return results_from_json(json.loads(path.read_text()))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


# -- pages --------------------------------------------------------------------------------------
#: Keys of ``Results.meta`` that have sections of their own (not listed in the page's header).
STRUCTURED_META = frozenset({"provenance", "profiles", "run", "target"})


@dataclass(frozen=True)
class _View:
    """What the page sections share, computed once per page."""

    results: Results
    target: Target | None
    figures: tuple[CellFigures, ...]
    comparison: Comparison
    fidelity: Mapping[str, Fidelity]
    profiles: tuple[Mapping[str, Any], ...]

    @property
    def target_text(self) -> str:
        return self.target.describe() if self.target else "no target"


def _view(results: Results) -> _View:
    target = target_from(results.meta)
    ran = [c for c in results.cells if c.trace.records]
    figures = tuple(cell_figures(c.trace, target) for c in ran)
    used = [(c.trace.profile, c.trace.nodes) for c in results.cells]
    given = results.meta.get("profiles")
    return _View(results, target, figures, compare(figures),
                 fidelity_by_profile([p for p, _ in used], results.calibration),
                 tuple(profile_sections(used, given if isinstance(given, Mapping) else {})))


def cell_validity(c: CellResult) -> Validity:
    """A cell's checks merged by the one rule (a cell without checks passes: nothing was asked of it)."""
    return merge(v.validity for v in c.verdicts)


def _network_flag(fid: Fidelity | None) -> str:
    if fid is None:
        return "not calibrated"
    return "FLAGGED: calibration failed" if fid.validity is Validity.FAIL else fid.state


UTILIZATION_TEXT = ("Runs on an emulated device: the emulated compute time over the time the steps took, in whole "
                    "periods between averages, beside the alpha-beta model's prediction (one average costs hops x "
                    "one-way delay + its bytes on the busiest link / the link's rate; U = P t_c / (P t_c + max(0, "
                    f"T - overlap t_c))). A difference over {100 * utilization.FINDING:.0f} % is a finding.")

SUMMARY_HEAD = ["cell", "backend", "verdict", "network", "duration s", "time to target s", "steps",
                "sent per worker", "final loss", "checks"]


def _summary_rows(view: _View) -> list[list[str]]:
    figs = {(f.protocol, f.profile, f.workers, f.seed): f for f in view.figures}
    rows = []
    for c in view.results.cells:
        t = c.trace
        f = figs.get((t.protocol, t.profile, t.workers, t.seed))
        tt = "-" if f is None or view.target is None else (
            "not reached" if f.seconds_to_target is None else f"{f.seconds_to_target:.2f}")
        rows.append([c.cell_id, t.backend, cell_state(t, STATE[cell_validity(c)]),
                     _network_flag(view.fidelity.get(t.profile)),
                     f"{t.duration:.1f}", tt, "-" if f is None else str(f.steps),
                     "-" if f is None else megabytes(f.bytes_per_worker),
                     "-" if f is None or f.final_loss is None else f"{f.final_loss:.4g}",
                     "; ".join(v.line() for v in c.verdicts)])
    return rows


def _claim_rows(results: Results) -> list[list[str]]:
    return [[c.claim_id, c.paper, c.claim, c.paper_figure, c.our_setting, figure(c.verdict.measured),
             c.verdict.expected, STATE[c.verdict.validity], c.verdict.why] for c in results.claims]


CLAIM_HEAD = ["claim", "paper", "what", "paper's figure", "our setting", "measured", "threshold", "verdict", "why"]
CAL_HEAD = ["profile", "link", "quantity", "configured", "measured", "tolerance", "verdict", "why"]
FIDELITY_HEAD = ["profile", "backend", "checks", "failed", "undecided", "state", "cells run on it"]


def _cal_rows(results: Results) -> list[list[str]]:
    return [[r.profile, r.link, r.quantity, r.configured, r.measured, r.tolerance, r.verdict, r.why]
            for r in results.calibration]


def _fidelity_rows(view: _View) -> list[list[str]]:
    rows = []
    for name, fid in view.fidelity.items():
        cells = [c.cell_id for c in view.results.cells if c.trace.profile == name]
        rows.append([name, ", ".join(fid.backends) or "-", str(fid.checked), str(len(fid.failed)), str(fid.unknown),
                     _network_flag(fid), ", ".join(cells)])
    return rows


def _flagged(view: _View) -> list[str]:
    """One line per profile whose calibration failed, naming its cells."""
    out = []
    for name, fid in view.fidelity.items():
        if fid.validity is Validity.FAIL:
            cells = ", ".join(c.cell_id for c in view.results.cells if c.trace.profile == name)
            out.append(f"{cells}: {fid.line()}")
    return out


def _headline(view: _View) -> str:
    r = view.results
    protocols = sorted({c.trace.protocol for c in r.cells})
    profiles = sorted({c.trace.profile for c in r.cells})
    workers = sorted({c.trace.nodes for c in r.cells})
    if not r.cells:
        return f"{len(r.claims)} claims." if r.claims else "No runs."
    return (f"{len(r.cells)} runs: {len(protocols)} protocols ({', '.join(protocols)}) on {len(profiles)} profiles "
            f"({', '.join(profiles)}), {', '.join(map(str, workers))} workers; target {view.target_text}.")


def _meta_items(results: Results) -> list[tuple[str, str]]:
    return [(str(k), figure(v)) for k, v in results.meta.items() if k not in STRUCTURED_META]


def _stats(view: _View) -> dict[str, tuple[list[str], list[list[str]]]]:
    return stats_tables([(c.cell_id, c.trace) for c in view.results.cells])


def _programs(view: _View) -> list[tuple[str, str, list[list[str]], tuple[list[str], list[list[str]]], list[str]]]:
    return program_sections([(c.cell_id, c.trace) for c in view.results.cells])


def _html_programs(view: _View) -> list[str]:
    parts: list[str] = []
    for cell_id, command, ranks, (link_head, links), marks in _programs(view):
        parts += [f"<h4>{html.escape(cell_id)}: <code>{html.escape(command)}</code></h4>",
                  "<p>Each rank (bytes counted in the kernel by the shaping backend, IP headers included):</p>",
                  _html_table(RANKS_HEAD, ranks), "<p>Bytes per directed link (row: sender):</p>",
                  _html_table(link_head, links)]
        if marks:
            parts.append("<ul>" + "".join(f"<li>{html.escape(m)}</li>" for m in marks) + "</ul>")
    return ["<h3>Programs: ranks and links</h3>", *parts] if parts else []


def _traces(results: Results) -> list[RunTrace]:
    return [c.trace for c in results.cells]


def markdown(results: Results) -> str:
    """The Markdown page: the same four questions as the HTML page, without the plots."""
    def table(head: list[str], rows: list[list[str]]) -> list[str]:
        esc = [[cell.replace("|", "\\|") for cell in row] for row in rows]
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in esc),
                ""]

    view = _view(results)
    out = [f"# {results.title}", "", _headline(view), ""]
    out += [f"- {k}: {v}" for k, v in _meta_items(results)] + [""]
    if results.cells:
        out += ["## What network?", ""]
        for p in view.profiles:
            out += [f"### {p.get('name')}", "", f"{p.get('description')}", "",
                    f"Source: `{p.get('source')}`; links as {p.get('workers')} workers saw them:", ""]
            out += table(LINK_HEAD, [list(map(str, row)) for row in p.get("links", [])])
        out += ["## Was the emulation faithful?", "", *table(FIDELITY_HEAD, _fidelity_rows(view))]
        out += [f"- **flagged** {line}" for line in _flagged(view)]
        out += [f"- **flagged** {line}" for line in utilization.emulation_flags(_traces(results))] + [""]
        out += ["## How do the protocols compare?", ""]
        if view.target is not None:
            out += [f"Time to {view.target_text} (median over seeds) and the ratio to each profile's best:", "",
                    *table(COMPARE_HEAD, comparison_rows(view.comparison))]
        out += ["### Summary", "", *table(SUMMARY_HEAD, _summary_rows(view))]
        for protocol, (head, rows) in _stats(view).items():
            out += [f"### {protocol}: its own figures", "", *table(head, rows)]
        used = utilization.utilizations(_traces(results))
        if used:
            out += ["### Compute utilization", "", UTILIZATION_TEXT, "",
                    *table(utilization.HEAD, utilization.rows(used))]
            out += [f"- **finding** {line}" for line in utilization.findings(used)] + [""]
        for cell_id, command, ranks, (link_head, links), marks in _programs(view):
            out += [f"### {cell_id}: `{command}`", "", "Each rank (bytes counted in the kernel, IP headers included):",
                    "", *table(RANKS_HEAD, ranks), "Bytes per directed link:", "", *table(link_head, links)]
            out += [f"- {m}" for m in marks] + ([""] if marks else [])
    if results.claims:
        out += ["## Claims", "", *table(CLAIM_HEAD, _claim_rows(results))]
    for c in results.comparisons:
        out += [comparison_markdown(c).replace("# Squall compare", "## Comparison", 1), ""]
    if results.calibration:
        out += ["## Calibration", "", *table(CAL_HEAD, _cal_rows(results))]
    if results.cells:
        out += ["## How do I reproduce it?", "", *(f"- {k}: {v}" for k, v in reproduce_rows(results.meta,
                                                                                                _traces(results))),
                "", "As a matrix file (save it as `runs.yaml`, then `squall matrix runs.yaml`):", "", "```yaml",
                matrix_text(_traces(results), _run_of(results)), "```", ""]
    return "\n".join(out)


def _run_of(results: Results) -> Mapping[str, Any]:
    run = results.meta.get("run")
    return run if isinstance(run, Mapping) else {}


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    cls = {"pass": "pass", "FAIL": "fail", "unknown": "unknown", "passed": "pass", "failed": "fail",
           "faithful": "pass", "FLAGGED: calibration failed": "fail", "not calibrated": "unknown",
           "partly verified": "unknown", "unverified": "unknown", "not reached": "unknown"}
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f'<td class="{cls.get(c, "")}">{html.escape(c)}</td>' for c in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _img(title: str, data: str | None) -> str:
    if not data:
        return ""
    return f"<h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>"


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}.pass{color:#2e7d32;font-weight:600}.fail{color:#c62828;font-weight:600}
.unknown{color:#757575;font-weight:600}img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.flag{background:#fdecea;border-left:4px solid #c62828;padding:.5em 1em;margin:.5em 0}
.lead{font-size:15px}pre{background:#f6f8fa;padding:1em;overflow-x:auto;font-size:12px}
nav a{margin-right:1.2em}dl.repro{display:grid;grid-template-columns:max-content auto;gap:2px 1.5em;font-size:13px}
dl.repro dt{font-weight:600}dl.repro dd{margin:0;font-family:ui-monospace,monospace}"""


def _html_network(view: _View) -> list[str]:
    parts = ["<h2 id='network'>1. What network?</h2>"]
    for p in view.profiles:
        parts += [f"<h3>{html.escape(str(p.get('name')))}</h3>",
                  f"<p>{html.escape(str(p.get('description')))}<br>source: <code>{html.escape(str(p.get('source')))}"
                  f"</code>; links as {html.escape(str(p.get('workers')))} workers saw them:</p>",
                  _html_table(LINK_HEAD, [list(map(str, row)) for row in p.get("links", [])])]
        for phase in p.get("phases", []):
            parts += [f"<p>from {html.escape(figure(phase.get('at_s')))} s "
                      f"({html.escape(str(phase.get('name') or 'phase'))}):</p>",
                      _html_table(LINK_HEAD, [list(map(str, row)) for row in phase.get("links", [])])]
    return parts


def _html_fidelity(view: _View) -> list[str]:
    parts = ["<h2 id='fidelity'>2. Was the emulation faithful?</h2>",
             "<p>Each profile's links were measured from inside the containers (delay, jitter, loss, rate) "
             "against what the profile says. A run on a profile whose calibration failed is flagged: its "
             "figures describe the network that was there, not the one that was asked for.</p>",
             _html_table(FIDELITY_HEAD, _fidelity_rows(view))]
    parts += [f"<div class='flag'><b>Flagged:</b> {html.escape(line)}</div>" for line in _flagged(view)]
    parts += [f"<div class='flag'><b>Flagged:</b> {html.escape(line)}</div>"
              for line in utilization.emulation_flags(_traces(view.results))]
    if view.results.calibration:
        parts += ["<details><summary>every calibration check</summary>",
                  _html_table(CAL_HEAD, _cal_rows(view.results)), "</details>"]
    return parts


def _html_compare(view: _View) -> list[str]:
    parts = ["<h2 id='compare'>3. How do the protocols compare?</h2>"]
    if view.target is not None:
        parts += [f"<p>Every run is measured at the same target, {html.escape(view.target_text)}: the seconds until "
                  "every surviving worker met it (median over seeds), the ratio to the best protocol of the "
                  "same profile, and the bytes each worker had sent by then.</p>",
                  _img("Time to target", plot_heatmap(view.comparison, view.target_text)),
                  _html_table(COMPARE_HEAD, comparison_rows(view.comparison)),
                  _img("Bytes to target", plot_bytes_to_target(view.comparison, view.target_text))]
    cells = view.results.cells
    traces = _traces(view.results)
    parts.append(_img("Loss against wall time", plot_loss(traces)))
    if any(r.bytes_sent for c in cells for r in c.trace.records):
        parts.append(_img("Loss against bytes sent", plot_loss_vs_bytes(traces)))
    parts.append(_img("Drift between workers", plot_drift(traces)))
    parts.append(_img("Drift from the owners", plot_owner_drift(traces)))
    for cell in cells:  # runs whose links changed: the trace as applied, the measured segments, the loss
        parts.append(_img(f"Links over time: {cell.cell_id}",
                          plot_trace_fidelity(cell.trace, cell.trace.meta.segments)))
    used = utilization.utilizations(traces)
    if used:
        parts += ["<h3>Compute utilization</h3>", f"<p>{html.escape(UTILIZATION_TEXT)}</p>",
                  _img("Compute utilization: measured, predicted, ratio", plot_utilization(used)),
                  _html_table(utilization.HEAD, utilization.rows(used))]
        parts += [f"<div class='flag'><b>Finding:</b> {html.escape(line)}</div>" for line in utilization.findings(used)]
    parts += ["<h3>Every run</h3>", _html_table(SUMMARY_HEAD, _summary_rows(view))]
    stats = _stats(view)
    if stats:
        parts.append("<h3>Each protocol's own figures</h3><p>The fields of its <code>stats()</code> "
                     "(median over workers of the end summaries, else of the last step record).</p>")
        for protocol, (head, rows) in stats.items():
            parts += [f"<h4>{html.escape(protocol)}</h4>", _html_table(head, rows)]
    parts += _html_programs(view)
    return parts


def _html_reproduce(view: _View) -> list[str]:
    rows = reproduce_rows(view.results.meta, _traces(view.results))
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in rows)
    return ["<h2 id='reproduce'>4. How do I reproduce it?</h2>", f"<dl class='repro'>{items}</dl>",
            "<p>The runs as a matrix file (save it as <code>runs.yaml</code>, then "
            "<code>squall matrix runs.yaml</code>):</p>",
            f"<pre>{html.escape(matrix_text(_traces(view.results), _run_of(view.results)))}</pre>"]


def html_page(results: Results) -> str:
    """The self-contained HTML page: what network, was it faithful, how do the protocols compare, how to
    reproduce it; then the claims and every calibration check."""
    view = _view(results)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(results.title)}</title>",
             f"<style>{CSS}</style></head><body><h1>{html.escape(results.title)}</h1>",
             f"<p class='lead'>{html.escape(_headline(view))}</p>"]
    items = _meta_items(results)
    if items:
        parts.append("<ul>" + "".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in items) + "</ul>")
    if results.cells:
        parts.append("<nav><a href='#network'>What network?</a><a href='#fidelity'>Was it faithful?</a>"
                     "<a href='#compare'>How do they compare?</a><a href='#reproduce'>How to reproduce</a>"
                     + ("<a href='#claims'>Claims</a>" if results.claims else "") + "</nav>")
        parts += _html_network(view) + _html_fidelity(view) + _html_compare(view)
    if results.claims:
        parts += ["<h2 id='claims'>Claims</h2>", _html_table(CLAIM_HEAD, _claim_rows(results))]
        png = plot_claims([(c.claim_id, c.verdict) for c in results.claims])
        if png:
            parts.append(f"<img alt='claims' src='data:image/png;base64,{png}'>")
    for c in results.comparisons:
        parts += comparison_section(c)
    if results.calibration and not results.cells:
        parts += ["<h2>Calibration</h2>", _html_table(CAL_HEAD, _cal_rows(results))]
    if results.cells:
        parts += _html_reproduce(view)
    parts.append("</body></html>")
    return "".join(parts)


def write_report(results: Results, directory: Path) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.html`` (and ``results.json``) into ``directory``."""
    save_results(results, directory)
    md, page = directory / "report.md", directory / "report.html"
    md.write_text(markdown(results))
    page.write_text(html_page(results))
    logger.info("report written to %s", page)
    return md, page
