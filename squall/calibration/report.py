"""The result of one calibration: per-link rows, the run's context, JSON, a text table and the rows a
results file keeps (:meth:`CalibrationReport.fidelity_rows`)."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from squall.calibration.judge import Baseline
from squall.calibration.plan import ProbePlan
from squall.calibration.stalls import HOST, StallPolicy
from squall.calibration.verdicts import HOST_LIMITED, WORDS, Check, outcome
from squall.checks.fidelity import CalibrationRow, failed_row
from squall.checks.verdict import Validity


@dataclass(frozen=True)
class CalibrationReport:
    """Configured against measured for every checked link of one profile on one backend."""

    profile: str  # profile name
    workers: int  # cluster size
    backend: str  # the shaping backend that was measured ("netem" or "nfqueue")
    at_s: float  # the profile time whose links were applied
    quick: bool  # the reduced budget was used
    rows: tuple[Check, ...]  # one per quantity per link
    baseline: Baseline  # the unshaped probe that delays were corrected by
    plan: ProbePlan  # what was probed, and why (sampling, budgets)
    errors: tuple[str, ...] = ()  # what invalidates the run as a whole (the shaper died): it fails
    notes: tuple[str, ...] = ()  # what went wrong on the way without invalidating everything
    duration_s: float = 0.0  # wall time of the whole calibration
    policy: StallPolicy = HOST  # the host-stall policy the run probed again by and judged by

    @property
    def verdict(self) -> str:
        """``failed`` if any row failed or the run had errors; else ``unknown``, ``host-limited`` (every
        unknown row is) or ``passed``: the rows merged by the one rule (:func:`~squall.checks.verdict.merge`)."""
        return Validity.FAIL.past if self.errors else outcome(self.rows)

    @property
    def validity(self) -> Validity:
        """The calibration's validity: :attr:`verdict` without the host-limited word (which is unknown)."""
        return Validity.read(self.verdict)

    def passed(self, *, allow_host_limited: bool = False) -> bool:
        """Every row passed (or, when allowed, could not be verified because of the host's limits)."""
        return self.validity is Validity.PASS or (allow_host_limited and self.verdict == HOST_LIMITED)

    def counts(self) -> dict[str, int]:
        """Rows per word."""
        found = Counter(r.verdict for r in self.rows)
        return {word: found.get(word, 0) for word in WORDS}

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        plan = self.plan
        return {
            "profile": self.profile, "workers": self.workers, "backend": self.backend, "at_s": self.at_s,
            "quick": self.quick, "verdict": self.verdict, "counts": self.counts(),
            "duration_s": round(self.duration_s, 3), "baseline": self.baseline.to_dict(),
            "plan": {"links": [list(link) for link in plan.links], "udp_count": plan.udp_count,
                     "udp_rate_pps": plan.udp_rate_pps, "udp_wait_s": plan.udp_wait_s,
                     "loss_confidence": plan.loss_confidence,
                     "transfers": [t.to_config() for t in plan.transfers],
                     "uplinks": [[t.to_config() for t in group] for group in plan.uplinks], "notes": list(plan.notes)},
            "errors": list(self.errors), "notes": list(self.notes), "stall_policy": self.policy.to_dict(),
            "rows": [_finite(r.to_dict()) for r in self.rows],
        }

    def fidelity_rows(self) -> list[CalibrationRow]:
        """One :class:`~squall.checks.fidelity.CalibrationRow` per check, figures in the table's words, and a
        failed row for each error of the run as a whole (the shaper died): what a session keeps for
        its report, matched to cells by profile and backend."""
        rows = [CalibrationRow(self.profile, self.backend, link_text(r), r.metric,
                               _num(r.configured, r.unit), _num(r.measured, r.unit), _range(r), r.verdict, r.why)
                for r in self.rows]
        errors = [failed_row(self.profile, error, backend=self.backend, quantity="shaper") for error in self.errors]
        return rows + errors

    def to_json(self) -> str:
        """The report as indented JSON (NaN written as null)."""
        return json.dumps(self.to_dict(), indent=2)

    def format(self) -> str:
        """A human-readable table with one line per check."""
        b = self.baseline
        head = [f"calibration of {self.profile} on {self.workers} workers, backend {self.backend}"
                f"{' (quick)' if self.quick else ''}: {self.verdict.upper()} in {self.duration_s:.1f} s",
                f"baseline (unshaped probe): one way {b.one_way_mean_us / 1e3:.3f} ms (s.d. "
                f"{b.one_way_sd_us / 1e3:.3f}), round trip {b.rtt_mean_us / 1e3:.3f} ms (s.d. {b.rtt_sd_us / 1e3:.3f})",
                f"probes: {self.plan.udp_count} UDP per link at {self.plan.udp_rate_pps:g}/s, "
                f"{len(self.plan.transfers)} TCP transfers; " + "; ".join(self.plan.notes), ""]
        table = [["LINK", "METRIC", "CONFIGURED", "MEASURED", "ACCEPTED", "VERDICT", "WHY"]]
        for r in self.rows:
            table.append([link_text(r), r.metric, _num(r.configured, r.unit), _num(r.measured, r.unit),
                          _range(r),
                          r.verdict, r.why])
        tail = [""] + [f"error: {e}" for e in self.errors] + [f"note: {n}" for n in self.notes]
        counts = ", ".join(f"{n} {v}" for v, n in self.counts().items() if n)
        tail.append(f"{len(self.rows)} checks: {counts or 'none'}")
        if self.counts()[HOST_LIMITED]:
            tail.append("host-limited checks were NOT verified: this host cannot carry those rates through the "
                        f"{self.backend} path")
        return "\n".join([*head, _table(table), *tail])


def _num(value: float | None, unit: str, *, with_unit: bool = True) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    digits = 3 if unit in ("ms", "%") else 1
    return f"{value:.{digits}f}" + (f" {unit}" if with_unit else "")


def _range(row: Check) -> str:
    if not (math.isfinite(row.low) and math.isfinite(row.high)):
        return "-"
    return f"{_num(row.low, row.unit, with_unit=False)}..{_num(row.high, row.unit)}"


def _finite(row: dict[str, object]) -> dict[str, object]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)), row[-1]]).rstrip()
                     for row in rows)


def link_text(row: Check) -> str:
    """``0->1``, or ``0->*`` for a node's shared uplink (sent to every peer at once)."""
    return f"{row.link[0]}->*" if row.metric == "uplink" else f"{row.link[0]}->{row.link[1]}"
