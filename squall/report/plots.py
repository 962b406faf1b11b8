"""Every plot of a report (the only module that draws, with matplotlib): the time-to-target heatmap,
bytes to target, loss against wall time and against bytes sent, drift, the claims' figures, for a
run whose links changed its configured trace, measured points and loss curve on one time axis, and the
compute-utilization heatmaps (measured, the alpha-beta prediction, their ratio).

Each function takes plain data (traces, a comparison, verdicts) and returns a PNG as base64 text
(for a data URI) or None when there is nothing to draw. The heatmap's colour is the ratio to the
best protocol of the same profile (log scale, 1x green), and each square says the seconds and the
ratio in words, so the figure reads without a legend. Panels are one per profile, at most 3 across.
"""

from __future__ import annotations

import base64
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from squall.checks import Validity, Verdict, drift_series
from squall.checks.drift import owner_drift_series
from squall.report.compare import Comparison, megabytes
from squall.report.utilization import Utilization
from squall.run_trace import RunTrace

DPI = 110


def png(fig: Any) -> str:
    """The figure as base64 PNG text; the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def plot_heatmap(c: Comparison, target: str) -> str | None:
    """Protocol x profile: seconds to ``target`` and the ratio to each profile's best."""
    if not c.protocols or not c.profiles or all(v is None for v in c.seconds.values()):
        return None
    grid = [[c.ratio(p, q) for q in c.profiles] for p in c.protocols]
    worst = max((r for row in grid for r in row if r is not None), default=1.0)
    top = max(math.log2(worst), 1.0)
    values = [[math.log2(r) if r is not None else math.nan for r in row] for row in grid]
    fig, ax = plt.subplots(figsize=(1.9 + 2.0 * len(c.profiles), 0.9 + 0.55 * len(c.protocols)))
    cmap = plt.get_cmap("RdYlGn_r").with_extremes(bad="#d9d9d9")
    image = ax.imshow(values, cmap=cmap, vmin=0.0, vmax=top, aspect="auto")
    for i, protocol in enumerate(c.protocols):
        for j, profile in enumerate(c.profiles):
            secs, ratio = c.seconds.get((protocol, profile)), grid[i][j]
            if (protocol, profile) not in c.seconds:
                text = "not run"
            elif secs is None:
                text = "not reached"
            else:
                shown = f"{secs:.2f} s" if secs < 10 else f"{secs:.1f} s"
                text = f"{shown}\n{ratio:.2f}x" if ratio is not None else shown
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color=_ink(image, values[i][j]))
    ax.set_xticks(range(len(c.profiles)), c.profiles)
    ax.set_yticks(range(len(c.protocols)), c.protocols)
    ax.set_title(f"time to {target} (ratio to the best of each profile)", fontsize=10)
    bar = fig.colorbar(image, ax=ax, fraction=0.04)
    ticks = [t for t in range(0, int(top) + 1)]
    bar.set_ticks(ticks, labels=[f"{2 ** t:g}x" for t in ticks])
    fig.tight_layout()
    return png(fig)


def _ink(image: Any, value: float) -> str:
    """Black or white, whichever reads better on the heatmap cell coloured for ``value``."""
    if math.isnan(value):
        return "black"
    r, g, b, _ = image.cmap(image.norm(value))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _median_by_step(trace: RunTrace) -> tuple[list[float], list[float]]:
    """Median over workers of (bytes sent, training loss) per step."""
    by_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in trace.records:
        if r.loss is not None:
            by_step[r.step].append((float(r.bytes_sent), r.loss))
    steps = sorted(by_step)
    return ([statistics.median(b for b, _ in by_step[s]) / 1e6 for s in steps],
            [statistics.median(v for _, v in by_step[s]) for s in steps])


def _legend(ax: Any) -> None:
    """The panel's legend, or a "no points" note when nothing in it has a label (an empty legend only warns)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no points", transform=ax.transAxes, ha="center", va="center", fontsize=8, color="#757575")


def _grid(panels: int) -> tuple[Any, list[Any]]:
    """A figure with one panel per profile, at most 3 across."""
    cols = min(3, panels)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[panels:]:
        ax.set_visible(False)
    return fig, flat[:panels]


def plot_loss_vs_bytes(traces: Sequence[RunTrace]) -> str | None:
    """Training loss against MB sent per worker: one panel per profile, one line per protocol (lowest seed); None
    when no trace has a loss."""
    curves = [(t, xy) for t in traces if (xy := _median_by_step(t))[0]]
    if not curves:
        return None
    profiles = sorted({t.profile for t, _ in curves})
    fig, flat = _grid(len(profiles))
    seed = min(t.seed for t, _ in curves)
    for ax, profile in zip(flat, profiles, strict=True):
        for t, (x, y) in curves:
            if t.profile == profile and t.seed == seed:
                ax.plot(x, y, label=f"{t.protocol} (w{t.workers})")
        ax.set_title(profile)
        ax.set_xlabel("MB sent per worker (median)")
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.tight_layout()
    return png(fig)


def plot_bytes_to_target(c: Comparison, target: str) -> str | None:
    """Grouped bars: MB per worker sent until ``target``, per profile, one bar per protocol."""
    if all(v is None for v in c.bytes.values()):
        return None
    fig, ax = plt.subplots(figsize=(1.5 + 2.2 * len(c.profiles), 3.4))
    width = 0.8 / max(1, len(c.protocols))
    for k, protocol in enumerate(c.protocols):
        xs = [j + (k - (len(c.protocols) - 1) / 2) * width for j in range(len(c.profiles))]
        ys = [(c.bytes.get((protocol, q)) or 0.0) / 1e6 for q in c.profiles]
        bars = ax.bar(xs, ys, width=width, label=protocol)
        for bar, q in zip(bars, c.profiles, strict=True):
            value = c.bytes.get((protocol, q))
            label = megabytes(value) if value is not None else ("not reached" if (protocol, q) in c.seconds else "")
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=6, rotation=90, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(c.profiles)), c.profiles)
    ax.set_ylabel("MB sent per worker")
    ax.set_title(f"bytes sent until {target}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax.margins(y=0.25)
    fig.tight_layout()
    return png(fig)


def _median_curve(trace: RunTrace, metric: str) -> tuple[list[float], list[float]]:
    """Median over workers of ``metric`` per step, against the median time of that step."""
    by_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in trace.records:
        value = r.figure(metric)
        if value is not None:
            by_step[r.step].append((r.t, value))
    steps = sorted(by_step)
    return ([statistics.median(t for t, _ in by_step[s]) for s in steps],
            [statistics.median(v for _, v in by_step[s]) for s in steps])


def plot_loss(traces: Sequence[RunTrace], metric: str = "loss") -> str | None:
    """Loss vs wall time: one panel per profile, one line per protocol (the lowest seed of each); None when no
    trace has the metric (a program that reports another metric)."""
    curves = [(trace, tv) for trace in traces if (tv := _median_curve(trace, metric))[0]]
    if not curves:
        return None
    profiles = sorted({trace.profile for trace, _ in curves})
    fig, axes = _grid(len(profiles))
    seed = min(trace.seed for trace, _ in curves)
    for ax, profile in zip(axes, profiles, strict=True):
        for trace, (t, v) in curves:
            if trace.profile == profile and trace.seed == seed:
                ax.plot(t, v, label=f"{trace.protocol} (w{trace.workers})")
        ax.set_title(profile)
        ax.set_xlabel("wall time since training started (s)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.tight_layout()
    return png(fig)


#: Bar colours by validity.
COLOURS = {Validity.PASS: "#2e7d32", Validity.FAIL: "#c62828", Validity.UNKNOWN: "#9e9e9e"}


def plot_claims(claims: Sequence[tuple[str, Verdict]]) -> str | None:
    """Measured figure of every (claim id, verdict) with a numeric measurement, coloured by its validity."""
    rows = [(claim, float(v.measured), v.validity) for claim, v in claims if isinstance(v.measured, int | float)]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(rows)))
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color=[COLOURS[r[2]] for r in rows])
    ax.set_xlabel("measured (see the claims table for each threshold)")
    ax.grid(axis="x", alpha=0.3)
    return png(fig)


def plot_drift(traces: Sequence[RunTrace]) -> str | None:
    """Max pairwise parameter distance over time per profile, churn events as vertical lines."""
    series = [(t, s) for t in traces if (s := drift_series(t))]
    if not series:
        return None
    profiles = sorted({t.profile for t, _ in series})
    fig, axes = _grid(len(profiles))
    floor = 1e-12  # identical parameters: drawn at the floor of the log axis
    for ax, profile in zip(axes, profiles, strict=True):
        marks: dict[tuple[float, str], None] = {}
        for trace, s in series:
            if trace.profile == profile:
                label = f"{trace.protocol} (w{trace.workers})"
                ax.plot([t for t, _ in s], [max(d, floor) for _, d in s], label=label)
                marks.update({(m.t, m.kind): None for m in trace.churn})
        for t, kind in marks:
            ax.axvline(t, color="#c62828", alpha=0.35, linestyle="--")
            ax.text(t, 0.98, f" {kind}", transform=ax.get_xaxis_transform(), fontsize=7, rotation=90, va="top")
        ax.set_title(profile)
        ax.set_xlabel("wall time since training started (s)")
        ax.set_ylabel("max pairwise distance")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.tight_layout()
    return png(fig)


def plot_owner_drift(traces: Sequence[RunTrace]) -> str | None:
    """Mean drift from the owners against the iteration, one panel per profile (protocols whose owners record it,
    e.g. training under packet loss, with their no-resync control beside them); None when no trace has it."""
    series = [(t, s) for t in traces if (s := owner_drift_series(t))]
    if not series:
        return None
    profiles = sorted({t.profile for t, _ in series})
    fig, axes = _grid(len(profiles))
    floor = 1e-12  # zero drift (no loss yet): drawn at the floor of the log axis
    for ax, profile in zip(axes, profiles, strict=True):
        for trace, s in series:
            if trace.profile == profile:
                ax.plot([t for t, _ in s], [max(d, floor) for _, d in s], label=f"{trace.protocol} (s{trace.seed})")
        ax.set_title(profile)
        ax.set_xlabel("iteration")
        ax.set_ylabel("mean ||x_i - x_owner||^2")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.tight_layout()
    return png(fig)


# ----------------------------------------------------------------------------- traced runs


def configured_series(timeline: Mapping[str, Any], link: str, field: str) -> tuple[list[float], list[float]]:
    """A step series (time s, value) of one link's setting from a run's realised timeline
    (``meta["timeline"]``): each change that names the link sets its value; a cut link reads as None."""
    times: list[float] = []
    values: list[float] = []
    for change in timeline.get("changes", []):
        for group in change.get("links", []):
            if link not in group.get("links", []):
                continue
            settings = group.get("settings")
            value = None if not isinstance(settings, Mapping) else settings.get(field)
            times.append(float(change.get("applied_s", change.get("at_s", 0.0))))
            values.append(math.nan if value is None else float(value))
    return times, values


def plot_trace_fidelity(trace: RunTrace, segments: Mapping[str, Any] | None = None,
                        link: tuple[int, int] = (0, 1)) -> str | None:
    """Left: link ``link``'s configured delay and rate over the run (as the timeline applied them),
    with the measured delay and rate of each judged segment (``segments``: a segment calibration's
    :meth:`~squall.calibration.segments.SegmentReport.to_dict`) as points on the same time axis;
    right: the run's training loss against time (median over workers). None without a timeline."""
    timeline = trace.meta.timeline
    if len(timeline.get("changes", [])) < 2:
        return None
    label = f"{link[0]}->{link[1]}"
    end = float(timeline.get("duration_s", trace.duration) or trace.duration)
    fig, (ax, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    t, delay = configured_series(timeline, label, "delay_us")
    if t:
        ax.step([*t, end], [d / 1e3 for d in [*delay, delay[-1]]], where="post", color="tab:blue",
                label=f"{label} delay configured")
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("one-way delay (ms)", color="tab:blue")
    rate_ax = ax.twinx()
    t_rate, rate = configured_series(timeline, label, "rate_bps")
    if t_rate and any(not math.isnan(r) for r in rate):
        rate_ax.step([*t_rate, end], [r / 1e6 for r in [*rate, rate[-1]]], where="post", color="tab:orange",
                     label=f"{label} rate configured")
    rate_ax.set_ylabel("rate (Mbit/s)", color="tab:orange")
    if segments:
        starts = {s["index"]: (s["start_s"] + s["end_s"]) / 2 for s in segments.get("segments", [])}
        for metric, axis, scale, colour in (("delay", ax, 1.0, "tab:blue"), ("rate", rate_ax, 1.0, "tab:orange")):
            points = [(starts[c["segment"]], c["measured"] * scale, c["verdict"]) for c in segments.get("checks", [])
                      if c["metric"] == metric and c.get("measured") is not None and c["segment"] in starts]
            for verdict, marker in (("passed", "o"), ("failed", "x"), ("unknown", "s")):
                chosen = [(x, y) for x, y, v in points if v == verdict]
                if chosen:
                    axis.scatter([x for x, _ in chosen], [y for _, y in chosen], marker=marker, color=colour,
                                 edgecolors="black", linewidths=0.5, zorder=3, s=22,
                                 label=f"{metric} measured ({verdict})")
    handles = ax.get_legend_handles_labels()[0] + rate_ax.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + rate_ax.get_legend_handles_labels()[1]
    if handles:
        ax.legend(handles, labels, fontsize=7, loc="upper left")
    ax.set_title(f"{trace.profile}: link {label}, configured and measured")
    ax.grid(alpha=0.3)
    by_time: dict[float, list[float]] = defaultdict(list)
    for record in trace.records:
        if record.loss is not None:
            by_time[round(record.t, 1)].append(record.loss)
    if by_time:
        xs = sorted(by_time)
        right.plot(xs, [statistics.median(by_time[x]) for x in xs], color="tab:green")
    right.set_xlim(ax.get_xlim())
    right.set_xlabel("seconds since the start")
    right.set_ylabel("training loss (median over workers)")
    right.set_title(f"{trace.protocol}: loss on the same time axis")
    right.grid(alpha=0.3)
    fig.tight_layout()
    return png(fig)


def plot_utilization(cells: Sequence[Utilization]) -> str | None:
    """Protocol x profile heatmaps: measured compute utilization, the alpha-beta prediction, and their ratio.

    Utilization runs 0 (all waiting) to 1 (all compute); the ratio's colour is log2(measured / predicted), white
    at 1, with the cells off by more than the report's finding threshold outlined. A run whose emulated
    device did not hold is marked with "!".
    """
    if not cells:
        return None
    protocols = list(dict.fromkeys(u.protocol for u in cells))
    profiles = sorted({u.profile for u in cells}, key=lambda p: _profile_order(cells, p))
    by = {(u.protocol, u.profile): u for u in cells}
    fig, axes = plt.subplots(3, 1, figsize=(2.4 + 1.3 * len(profiles), 3 * (1.1 + 0.45 * len(protocols))),
                             squeeze=False)
    panels = [("measured U", lambda u: u.measured, "viridis", 0.0, 1.0),
              ("alpha-beta prediction", lambda u: u.predicted, "viridis", 0.0, 1.0),
              ("measured / predicted", lambda u: None if u.ratio is None else math.log2(u.ratio), "RdBu_r", -1.0, 1.0)]
    for ax, (title, value, cmap_name, low, high) in zip(axes[:, 0], panels, strict=True):
        grid = [[_value(by.get((p, q)), value) for q in profiles] for p in protocols]
        image = ax.imshow(grid, cmap=plt.get_cmap(cmap_name).with_extremes(bad="#d9d9d9"), vmin=low, vmax=high,
                          aspect="auto")
        for i, p in enumerate(protocols):
            for j, q in enumerate(profiles):
                u = by.get((p, q))
                ax.text(j, i, _cell_text(u, title), ha="center", va="center", fontsize=7,
                        color=_ink(image, grid[i][j]))
                if u is not None and title.startswith("measured /") and u.finding:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.5))
        ax.set_xticks(range(len(profiles)), profiles, rotation=35, ha="right", fontsize=7)
        ax.set_yticks(range(len(protocols)), protocols, fontsize=8)
        ax.set_title(title, fontsize=9)
    fig.suptitle("compute utilization: emulated compute time / step time", fontsize=10)
    fig.tight_layout()
    return png(fig)


def _profile_order(cells: Sequence[Utilization], profile: str) -> tuple[float, float, str]:
    u = next(c for c in cells if c.profile == profile)
    return (float(u.rate_bps or math.inf), u.alpha_s or 0.0, profile)


def _value(u: Utilization | None, value: Any) -> float:
    v = None if u is None else value(u)
    return math.nan if v is None else float(v)


def _cell_text(u: Utilization | None, title: str) -> str:
    if u is None:
        return "not run"
    mark = "" if u.valid else " !"
    if title.startswith("measured /"):
        return "-" if u.ratio is None else f"{u.ratio:.2f}x{mark}"
    v = u.measured if title.startswith("measured") else u.predicted
    return ("-" if v is None else f"{v:.2f}") + (mark if title.startswith("measured") else "")


# -- squall compare ------------------------------------------------------------------------------------
SIDE_COLOURS = {"baseline": "#4c72b0", "candidate": "#dd8452"}
VERDICT_COLOURS = {"better": "#2e7d32", "worse": "#c62828", "same": "#757575", "unknown": "#bdbdbd"}


def plot_compare_samples(profile: str, measures: Mapping[str, Mapping[str, Any]]) -> str | None:
    """One panel per measure: every run's value, baseline and candidate side by side (a censored run as an
    open marker at its bound, a failed one not drawn), the verdict in the panel's title."""
    names = [n for n, m in measures.items() if any(v is not None for v in [*m["baseline"], *m["candidate"]])]
    if not names:
        return None
    fig, axes = _grid(len(names))
    for ax, name in zip(axes, names, strict=False):
        m = measures[name]
        for x, side in enumerate(("baseline", "candidate")):
            values, censored = m[side], m.get(f"{side}_censored") or [False] * len(m[side])
            for k, (v, cut) in enumerate(zip(values, censored, strict=True)):
                if v is None:
                    continue
                jitter = (k - (len(values) - 1) / 2) * 0.04
                ax.plot(x + jitter, v, "o", color=SIDE_COLOURS[side], markerfacecolor="none" if cut else
                        SIDE_COLOURS[side], markersize=6)
            known = [v for v in values if v is not None]
            if known:
                ax.hlines(statistics.median(known), x - 0.25, x + 0.25, color=SIDE_COLOURS[side], linewidth=2)
        ax.set_xticks([0, 1], ["baseline", "candidate"])
        ax.set_xlim(-0.6, 1.6)
        verdict = str(m.get("verdict"))
        ax.set_title(f"{name}: {verdict}", fontsize=9, color=VERDICT_COLOURS.get(verdict, "black"))
        ax.tick_params(labelsize=8)
    fig.suptitle(f"{profile}: every run (open markers: censored, a bound)", fontsize=10)
    fig.tight_layout()
    return png(fig)


def plot_compare_ratios(rows: Sequence[tuple[str, float | None, float | None, float | None, str]]) -> str | None:
    """Candidate/baseline of each (profile, measure) with its 95 % interval on a log axis; 1 is no change.
    ``rows``: (label, ratio, ci_low, ci_high, verdict)."""
    drawn = [r for r in rows if r[1] is not None]
    if not drawn:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 0.8 + 0.32 * len(drawn)))
    for y, (_label, ratio, low, high, verdict) in enumerate(reversed(drawn)):
        colour = VERDICT_COLOURS.get(verdict, "black")
        assert ratio is not None  # drawn rows have one
        if low is not None and high is not None:
            ax.plot([low, high], [y, y], color=colour, linewidth=2)
        ax.plot(ratio, y, "o", color=colour)
        ax.text(1.02, y, verdict, transform=ax.get_yaxis_transform(), fontsize=8, va="center", color=colour)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(drawn)), [r[0] for r in reversed(drawn)], fontsize=8)
    ax.set_xlabel("candidate / baseline (95 % interval); below 1 is less of the measure", fontsize=9)
    fig.tight_layout()
    return png(fig)


def _band(curves: Sequence[tuple[Sequence[float], Sequence[float]]], points: int = 60
          ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Median and interquartile band across runs of curves y(x), each interpolated on a common grid."""
    ends = [xs[-1] for xs, _ in curves if xs]
    if not ends:
        return [], [], [], []
    top = statistics.median(ends)
    grid = [top * k / (points - 1) for k in range(points)]
    med, low, high, kept = [], [], [], []
    for x in grid:
        ys = [_at(xs, vs, x) for xs, vs in curves if xs and xs[0] <= x <= xs[-1]]
        if len(ys) < max(1, len(curves) // 2):
            continue
        q = statistics.quantiles(ys, n=4) if len(ys) >= 2 else [ys[0], ys[0], ys[0]]
        kept.append(x)
        med.append(statistics.median(ys))
        low.append(q[0])
        high.append(q[2])
    return kept, med, low, high


def _at(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    for k in range(1, len(xs)):
        if xs[k] >= x:
            x0, x1 = xs[k - 1], xs[k]
            return ys[k] if x1 == x0 else ys[k - 1] + (ys[k] - ys[k - 1]) * (x - x0) / (x1 - x0)
    return ys[-1]


def plot_compare_curves(profile: str, figure: str, runs: Mapping[str, Sequence[RunTrace]]) -> str | None:
    """``figure`` (median over ranks) against time and against bytes sent: each side's median across its
    runs with the interquartile band."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    drew = False
    for side, traces in runs.items():
        by_time, by_bytes = [], []
        for trace in traces:
            xs, ys = _median_curve(trace, figure)
            if xs:
                by_time.append((xs, ys))
            sent = _figure_vs_bytes(trace, figure)
            if sent[0]:
                by_bytes.append(sent)
        for ax, curves, unit in ((left, by_time, 1.0), (right, by_bytes, 1e6)):
            x, med, low, high = _band(curves)
            if not x:
                continue
            drew = True
            xs = [v / unit for v in x]
            ax.plot(xs, med, color=SIDE_COLOURS.get(side), label=f"{side} ({len(curves)} runs)")
            ax.fill_between(xs, low, high, color=SIDE_COLOURS.get(side), alpha=0.2, linewidth=0)
    if not drew:
        plt.close(fig)
        return None
    left.set_xlabel("seconds of training")
    right.set_xlabel("MB sent per rank")
    for ax in (left, right):
        ax.set_ylabel(figure)
        _legend(ax)
    fig.suptitle(f"{profile}: {figure}, median across runs with the interquartile band", fontsize=10)
    fig.tight_layout()
    return png(fig)


def _figure_vs_bytes(trace: RunTrace, figure: str) -> tuple[list[float], list[float]]:
    """``figure`` (median over ranks at each step) against the mean bytes a rank had sent by then."""
    by_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in trace.records:
        value = r.figure(figure)
        if value is not None and r.worker in trace.alive:
            by_step[r.step].append((float(r.bytes_sent), value))
    xs, ys = [], []
    for step in sorted(by_step):
        pts = by_step[step]
        xs.append(statistics.fmean(b for b, _ in pts))
        ys.append(statistics.median(v for _, v in pts))
    order = sorted(range(len(xs)), key=lambda k: xs[k])
    return [xs[k] for k in order], [ys[k] for k in order]
