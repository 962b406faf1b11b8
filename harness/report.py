"""Reports: a Markdown summary and a self-contained HTML page with plots, from a results file.

Inputs are plain data (``results.json`` written by the plugin or ``squall matrix``): cells (a trace
and the verdicts of its checks), claims (paper figure, our figure, verdict) and calibration rows.
``squall report DIR`` rebuilds the pages from that file at any time. Plots are PNGs embedded in
the HTML as data URIs, so the page is one file that can be attached to a CI run.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from harness.checks import Verdict, drift_series
from harness.trace import RunTrace, trace_from_json, trace_to_json

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
STATE = {True: "pass", False: "FAIL", None: "unknown"}


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
    calibration: tuple[Mapping[str, Any], ...] = ()  # rows: link, quantity, configured, measured, verdict
    meta: Mapping[str, Any] = field(default_factory=dict)  # machine, backend, duration...


# -- persistence --------------------------------------------------------------------------------
def _verdict_json(v: Verdict) -> dict[str, Any]:
    return {"check": v.check, "passed": v.passed, "measured": v.measured, "expected": v.expected, "why": v.why}


def _verdict_from(obj: Mapping[str, Any]) -> Verdict:
    return Verdict(obj["check"], obj["passed"], obj["measured"], obj["expected"], obj["why"])


def results_to_json(results: Results) -> dict[str, Any]:
    """Plain data for ``results.json``."""
    return {
        "title": results.title, "meta": dict(results.meta), "calibration": [dict(r) for r in results.calibration],
        "cells": [{"id": c.cell_id, "trace": trace_to_json(c.trace), "verdicts": [_verdict_json(v) for v in c.verdicts]}
                  for c in results.cells],
        "claims": [{"id": c.claim_id, "paper": c.paper, "claim": c.claim, "paper_figure": c.paper_figure,
                    "our_setting": c.our_setting, "verdict": _verdict_json(c.verdict)} for c in results.claims],
    }


def results_from_json(obj: Mapping[str, Any]) -> Results:
    """The inverse of :func:`results_to_json`."""
    cells = tuple(CellResult(c["id"], trace_from_json(c["trace"]), tuple(_verdict_from(v) for v in c["verdicts"]))
                  for c in obj.get("cells", []))
    claims = tuple(ClaimResult(c["id"], c["paper"], c["claim"], c["paper_figure"], c["our_setting"],
                               _verdict_from(c["verdict"])) for c in obj.get("claims", []))
    return Results(title=obj.get("title", "Squall report"), cells=cells, claims=claims,
                   calibration=tuple(obj.get("calibration", [])), meta=dict(obj.get("meta", {})))


def save_results(results: Results, directory: Path) -> Path:
    """Write ``results.json`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RESULTS_FILE
    path.write_text(json.dumps(results_to_json(results), indent=1, default=str))
    return path


def load_results(directory: Path) -> Results:
    """Read ``results.json`` from ``directory``."""
    return results_from_json(json.loads((directory / RESULTS_FILE).read_text()))


# -- plots --------------------------------------------------------------------------------------
def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _median_curve(trace: RunTrace, metric: str) -> tuple[list[float], list[float]]:
    """Median over workers of ``metric`` per step, against the median time of that step."""
    by_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in trace.records:
        value = getattr(r, metric)
        if value is not None:
            by_step[r.step].append((r.t, value))
    steps = sorted(by_step)
    return ([statistics.median(t for t, _ in by_step[s]) for s in steps],
            [statistics.median(v for _, v in by_step[s]) for s in steps])


def _grid(panels: int) -> tuple[Any, list[Any]]:
    """A figure with one panel per profile, at most 3 across."""
    cols = min(3, panels)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[panels:]:
        ax.set_visible(False)
    return fig, flat[:panels]


def plot_loss(cells: Sequence[CellResult], metric: str = "loss") -> str | None:
    """Loss vs wall time: one panel per profile, one line per protocol (the lowest seed of each)."""
    profiles = sorted({c.trace.profile for c in cells})
    if not profiles:
        return None
    fig, axes = _grid(len(profiles))
    seed = min(c.trace.seed for c in cells)
    for ax, profile in zip(axes, profiles, strict=True):
        for c in cells:
            if c.trace.profile == profile and c.trace.seed == seed:
                t, v = _median_curve(c.trace, metric)
                if t:
                    ax.plot(t, v, label=f"{c.trace.protocol} (w{c.trace.workers})")
        ax.set_title(profile)
        ax.set_xlabel("wall time since training started (s)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def plot_speedups(claims: Sequence[ClaimResult]) -> str | None:
    """Measured figure vs threshold for every claim with a numeric measurement."""
    rows = [(c.claim_id, float(c.verdict.measured), c.verdict.passed) for c in claims
            if isinstance(c.verdict.measured, int | float)]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(rows)))
    colors = {True: "#2e7d32", False: "#c62828", None: "#9e9e9e"}
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color=[colors[r[2]] for r in rows])
    ax.set_xlabel("measured (see the claims table for each threshold)")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def plot_drift(cells: Sequence[CellResult]) -> str | None:
    """Max pairwise parameter distance over time per profile, churn events as vertical lines."""
    series = [(c, drift_series(c.trace)) for c in cells]
    series = [(c, s) for c, s in series if s]
    if not series:
        return None
    profiles = sorted({c.trace.profile for c, _ in series})
    fig, axes = _grid(len(profiles))
    floor = 1e-12  # identical parameters: drawn at the floor of the log axis
    for ax, profile in zip(axes, profiles, strict=True):
        marks: dict[tuple[float, str], None] = {}
        for c, s in series:
            if c.trace.profile == profile:
                label = f"{c.trace.protocol} (w{c.trace.workers})"
                ax.plot([t for t, _ in s], [max(d, floor) for _, d in s], label=label)
                marks.update({(m.t, m.kind): None for m in c.trace.churn})
        for t, kind in marks:
            ax.axvline(t, color="#c62828", alpha=0.35, linestyle="--")
            ax.text(t, 0.98, f" {kind}", transform=ax.get_xaxis_transform(), fontsize=7, rotation=90, va="top")
        ax.set_title(profile)
        ax.set_xlabel("wall time since training started (s)")
        ax.set_ylabel("max pairwise distance")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


# -- pages --------------------------------------------------------------------------------------
def _summary_rows(results: Results) -> list[list[str]]:
    rows = []
    for c in results.cells:
        states = [v.passed for v in c.verdicts]
        overall = False if False in states else None if None in states else True
        final = next((r.loss for r in reversed(c.trace.records) if r.loss is not None), None)
        rows.append([c.cell_id, c.trace.backend, STATE[overall], f"{c.trace.duration:.1f}",
                     "-" if final is None else f"{final:.4g}", "; ".join(v.line() for v in c.verdicts)])
    return rows


def figure(value: Any) -> str:
    """A measured figure in words: numbers as they are, mappings as ``key value`` pairs, lists comma-separated."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {figure(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "[" + ", ".join(figure(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _claim_rows(results: Results) -> list[list[str]]:
    return [[c.claim_id, c.paper, c.claim, c.paper_figure, c.our_setting, figure(c.verdict.measured),
             c.verdict.expected, STATE[c.verdict.passed], c.verdict.why] for c in results.claims]


SUMMARY_HEAD = ["cell", "backend", "verdict", "duration s", "final loss", "checks"]
CLAIM_HEAD = ["claim", "paper", "what", "paper's figure", "our setting", "measured", "threshold", "verdict", "why"]
CAL_HEAD = ["link", "quantity", "configured", "measured", "tolerance", "verdict"]


def _cal_rows(results: Results) -> list[list[str]]:
    return [[str(r.get(k, "")) for k in ("link", "quantity", "configured", "measured", "tolerance", "verdict")]
            for r in results.calibration]


def markdown(results: Results) -> str:
    """The Markdown page."""
    def table(head: list[str], rows: list[list[str]]) -> list[str]:
        esc = [[cell.replace("|", "\\|") for cell in row] for row in rows]
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in esc)]

    out = [f"# {results.title}", ""]
    out += [f"- {k}: {v}" for k, v in results.meta.items()] + [""]
    if results.cells:
        out += ["## Summary", "", *table(SUMMARY_HEAD, _summary_rows(results)), ""]
    if results.claims:
        out += ["## Claims", "", *table(CLAIM_HEAD, _claim_rows(results)), ""]
    if results.calibration:
        out += ["## Calibration", "", *table(CAL_HEAD, _cal_rows(results)), ""]
    return "\n".join(out)


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    cls = {"pass": "pass", "FAIL": "fail", "unknown": "unknown", "passed": "pass", "failed": "fail"}
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f'<td class="{cls.get(c, "")}">{html.escape(c)}</td>' for c in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}.pass{color:#2e7d32;font-weight:600}.fail{color:#c62828;font-weight:600}
.unknown{color:#757575;font-weight:600}img{max-width:100%;border:1px solid #eee;margin:.5em 0}"""


def html_page(results: Results) -> str:
    """The self-contained HTML page."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(results.title)}</title>",
             f"<style>{CSS}</style></head><body><h1>{html.escape(results.title)}</h1>"]
    if results.meta:
        parts.append("<ul>" + "".join(f"<li>{html.escape(str(k))}: {html.escape(str(v))}</li>"
                                      for k, v in results.meta.items()) + "</ul>")
    if results.cells:
        parts += ["<h2>Summary</h2>", _html_table(SUMMARY_HEAD, _summary_rows(results))]
        for title, png in (("Loss vs wall time", plot_loss(results.cells)),
                           ("Drift between workers", plot_drift(results.cells))):
            if png:
                parts.append(f"<h2>{title}</h2><img alt='{title}' src='data:image/png;base64,{png}'>")
    if results.claims:
        parts += ["<h2>Claims</h2>", _html_table(CLAIM_HEAD, _claim_rows(results))]
        png = plot_speedups(results.claims)
        if png:
            parts.append(f"<img alt='claims' src='data:image/png;base64,{png}'>")
    if results.calibration:
        parts += ["<h2>Calibration</h2>", _html_table(CAL_HEAD, _cal_rows(results))]
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
