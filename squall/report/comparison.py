"""The page of ``squall compare``: where the candidate is better, worse or the same, and how sure we are.

Plain data in (the comparison's JSON object, as ``squall compare --json`` prints it, and the runs'
traces), ``comparison.json``, ``report.md`` and ``report.html`` out. Per profile: a table of every
measure (both sides' medians, the ratio candidate/baseline with its 95 % interval, the verdict), every
run's value side by side, and both sides' curves of the compared figure against time and against
bytes (median across runs with the interquartile band); above them, one chart of every ratio with
its interval, so the answer reads at a glance.
"""

from __future__ import annotations

import html
import json
import logging
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from squall.report.plots import plot_compare_curves, plot_compare_ratios, plot_compare_samples
from squall.run_trace import RunTrace

logger = logging.getLogger(__name__)

RESULT_FILE = "comparison.json"
HEAD = ["measure", "baseline (median)", "candidate (median)", "ratio", "95 % interval", "verdict", "why"]


def _median(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    return "-" if not known else f"{statistics.median(known):.4g}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def rows(profile: Mapping[str, Any]) -> list[list[str]]:
    """One table row per measure."""
    out = []
    for name, m in profile["measures"].items():
        interval = "-" if m["ci_low"] is None or m["ci_high"] is None else \
            f"{m['ci_low']:.3f} to {m['ci_high']:.3f}"
        out.append([name, _median(m["baseline"]), _median(m["candidate"]), _number(m["ratio"]), interval,
                    m["verdict"], m["why"]])
    return out


def _figure(result: Mapping[str, Any]) -> str:
    """The figure whose curves are drawn: the target's, else the first compared final figure, else loss."""
    target = result.get("target")
    if isinstance(target, str):
        for op in ("<=", ">="):
            if op in target:
                return str(target.split(op, 1)[0].strip())
    for profile in result["profiles"]:
        for name in profile["measures"]:
            if name.startswith("final_"):
                return str(name)[len("final_"):]
    return "loss"


def _ratio_rows(result: Mapping[str, Any]) -> list[tuple[str, float | None, float | None, float | None, str]]:
    return [(f"{p['profile']}: {name}", m["ratio"], m["ci_low"], m["ci_high"], m["verdict"])
            for p in result["profiles"] for name, m in p["measures"].items()]


def markdown(result: Mapping[str, Any]) -> str:
    """The comparison as Markdown."""
    word = "REGRESSION" if result["regression"] else result["verdict"]
    out = ["# Squall compare", "", f"- baseline: `{result['baseline']}`", f"- candidate: `{result['candidate']}`",
           f"- verdict: **{word}** (tolerance {result['tolerance']:.1%}; gating: "
           f"{', '.join(result['gate']) or 'every measure'})", ""]
    for profile in result["profiles"]:
        out += [f"## {profile['profile']} ({profile['pairs']} pairs"
                + (", decided early)" if profile.get("stopped_early") else ")"), "",
                "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
        out += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows(profile)]
        out.append("")
    return "\n".join(out)


def _table(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    lines = "".join("<tr>" + "".join(f"<td class='{_class(c)}'>{html.escape(c)}</td>" for c in row) + "</tr>"
                    for row in body)
    return f"<table><tr>{cells}</tr>{lines}</table>"


def _class(cell: str) -> str:
    return cell if cell in ("better", "worse", "same", "unknown") else ""


def _img(title: str, data: str | None) -> str:
    if not data:
        return ""
    return f"<h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>"


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}.better{color:#2e7d32;font-weight:600}.worse{color:#c62828;font-weight:600}
.same{color:#555}.unknown{color:#9e9e9e;font-weight:600}img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.lead{font-size:15px}code{font-size:12px}"""


def comparison_section(result: Mapping[str, Any]) -> list[str]:
    """A comparison inside a matrix's page: its verdict, each profile's table and every ratio with its interval."""
    word = "REGRESSION" if result["regression"] else result["verdict"]
    parts = [f"<h2>Comparison: {html.escape(result['candidate'])} against {html.escape(result['baseline'])}</h2>",
             f"<p>verdict: <b class='{html.escape(result['verdict'])}'>{html.escape(word)}</b></p>",
             _img("Every ratio candidate/baseline with its interval", plot_compare_ratios(_ratio_rows(result)))]
    for profile in result["profiles"]:
        parts += [f"<h3>{html.escape(profile['profile'])} ({profile['pairs']} pairs)</h3>", _table(HEAD, rows(profile))]
    return parts


def html_page(result: Mapping[str, Any], traces: Mapping[tuple[str, str, int], RunTrace]) -> str:
    """The comparison as one self-contained HTML page."""
    word = "REGRESSION" if result["regression"] else result["verdict"]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Squall compare</title>",
             f"<style>{CSS}</style></head><body><h1>Squall compare</h1>",
             f"<p class='lead'>baseline: <code>{html.escape(result['baseline'])}</code><br>candidate: "
             f"<code>{html.escape(result['candidate'])}</code><br>verdict: <b class='{html.escape(result['verdict'])}'>"
             f"{html.escape(word)}</b> (a measure is <i>worse</i> or <i>better</i> only when its 95 % interval "
             f"excludes no change and the tolerance of {result['tolerance']:.1%}; <i>same</i> means no detectable "
             "difference)</p>",
             _img("Every ratio candidate/baseline with its 95 % interval", plot_compare_ratios(_ratio_rows(result)))]
    figure = _figure(result)
    for profile in result["profiles"]:
        name = profile["profile"]
        parts += [f"<h2>{html.escape(name)}</h2>",
                  f"<p>{profile['pairs']} pairs of runs, baseline and candidate interleaved on the same containers"
                  + (", stopped early once decided" if profile.get("stopped_early") else "") + ".</p>",
                  _table(HEAD, rows(profile)),
                  _img(f"{name}: every run", plot_compare_samples(name, profile["measures"]))]
        ordered = sorted(traces.items(), key=lambda kv: kv[0][2])
        sides = {side: [t for (p, s, _), t in ordered if p == name and s == side] for side in ("baseline", "candidate")}
        parts.append(_img(f"{name}: {figure} against time and bytes", plot_compare_curves(name, figure, sides)))
        failed = [r for r in profile["runs"] if r["passed"] is False]
        if failed:
            parts.append("<p>Runs that failed (kept in the samples, censored or failed):</p><ul>"
                         + "".join(f"<li>{html.escape(r['side'])} pair {r['pair']}: {html.escape(r['why'])}</li>"
                                   for r in failed) + "</ul>")
    meta = result.get("meta", {})
    parts.append(f"<h2>How to reproduce</h2><pre>{html.escape(str(meta.get('command', '')))}</pre>")
    parts.append("</body></html>")
    return "".join(parts)


def write_comparison(result: Mapping[str, Any], traces: Mapping[tuple[str, str, int], RunTrace],
                     directory: Path) -> Path:
    """Write ``comparison.json``, ``report.md`` and ``report.html`` into ``directory``; the page's path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RESULT_FILE).write_text(json.dumps(result, indent=1))
    (directory / "report.md").write_text(markdown(result))
    page = directory / "report.html"
    page.write_text(html_page(result, traces))
    logger.info("comparison report written to %s", page)
    return page
