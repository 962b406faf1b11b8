"""Fidelity: did the emulated network do what its profile says? One answer per profile, from its calibration.

A session calibrates each profile it uses (:mod:`squall.experiment.fidelity` runs a quick
calibration and keeps its rows); the rows are plain data in ``results.json`` (one per quantity per
link, with the ``profile`` and ``backend`` they measured: :func:`calibration_rows`). A profile's
fidelity is the :func:`~squall.checks.verdict.merge` of its rows' validities: any row failed ->
``failed``; else any row unknown (too little data, the host too busy or unable to carry a rate) ->
``unknown``; else ``faithful``. A profile without a row was ``not calibrated``: unknown as well.
The report flags every cell run on a profile whose fidelity failed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from squall.checks.verdict import Validity, merge


def calibration_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``Results.calibration`` rows from a calibration's plain data (``CalibrationReport.to_dict()``).

    Each row keeps the profile, backend and link it measured so it can be matched to cells; an error
    of the run as a whole (the shaper died) is a failed row of its own."""
    rows = []
    for r in report.get("rows", []):
        low, high, unit = r.get("low"), r.get("high"), r.get("unit", "")
        link = r.get("link") or ["?", "?"]
        rows.append({
            "profile": report.get("profile", "?"), "backend": report.get("backend", "?"),
            "link": f"{link[0]}->{link[1]}", "quantity": r.get("metric", "?"),
            "configured": _amount(r.get("configured"), unit), "measured": _amount(r.get("measured"), unit),
            "tolerance": "-" if low is None or high is None else f"{_amount(low, '')}..{_amount(high, unit)}",
            "verdict": r.get("verdict", Validity.UNKNOWN.past), "why": r.get("why", ""),
        })
    for error in report.get("errors", []):
        rows.append(failed_row(str(report.get("profile", "?")), str(error), backend=str(report.get("backend", "?")),
                               quantity="shaper"))
    return rows


def failed_row(profile: str, why: str, *, backend: str = "-", quantity: str = "calibration") -> dict[str, Any]:
    """A failed row for all of a profile's links: its calibration (or its shaper) could not do its job."""
    return {"profile": profile, "backend": backend, "link": "all", "quantity": quantity, "configured": "-",
            "measured": "-", "tolerance": "-", "verdict": Validity.FAIL.past, "why": why}


def _amount(value: object, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, int | float):
        digits = 3 if unit in ("ms", "%") else 1
        return f"{value:.{digits}f}" + (f" {unit}" if unit else "")
    return str(value)


@dataclass(frozen=True)
class Fidelity:
    """How well one profile's links matched it, from its calibration rows."""

    profile: str  # profile name
    checked: int  # calibration rows for it
    failed: tuple[str, ...]  # "0->1 delay: configured 50.000 ms, measured 61.2 ms" for each failed row
    unknown: int  # rows that could not decide (unknown or host-limited)
    backends: tuple[str, ...]  # shaping backends calibrated

    @property
    def validity(self) -> Validity:
        """The rows merged (:func:`~squall.checks.verdict.merge`); unknown when there are none."""
        if not self.checked:
            return Validity.UNKNOWN
        passed = self.checked - len(self.failed) - self.unknown
        return merge([Validity.FAIL] * len(self.failed) + [Validity.UNKNOWN] * self.unknown
                     + [Validity.PASS] * passed)

    @property
    def state(self) -> str:
        """The validity in the report's words: ``failed``; ``faithful`` (every row passed); unknown as
        ``not calibrated`` (no row), ``unverified`` (no row passed) or ``partly verified`` (some did)."""
        validity = self.validity
        if validity is Validity.FAIL:
            return "failed"
        if validity is Validity.PASS:
            return "faithful"
        if not self.checked:
            return "not calibrated"
        return "unverified" if self.unknown == self.checked else "partly verified"

    def line(self) -> str:
        """One sentence for a cell's flag."""
        if not self.checked:
            return f"{self.profile} was not calibrated in this run: its emulation is unverified"
        if self.failed:
            return (f"{len(self.failed)} of {self.checked} calibration checks of {self.profile} failed: "
                    + "; ".join(self.failed))
        extra = f" ({self.unknown} could not decide)" if self.unknown else ""
        return f"{self.checked - self.unknown} of {self.checked} calibration checks of {self.profile} passed{extra}"


def fidelity(profile: str, calibration: Iterable[Mapping[str, Any]]) -> Fidelity:
    """The :class:`Fidelity` of ``profile`` from every calibration row (rows of other profiles ignored)."""
    rows = [r for r in calibration if r.get("profile") == profile]
    judged = [(r, Validity.read(r.get("verdict"))) for r in rows]
    failed = tuple(f"{r.get('link')} {r.get('quantity')}: configured {r.get('configured')}, measured "
                   f"{r.get('measured')}" for r, v in judged if v is Validity.FAIL)
    unknown = sum(1 for _, v in judged if v is Validity.UNKNOWN)
    return Fidelity(profile, len(rows), failed, unknown, tuple(sorted({str(r.get("backend", "?")) for r in rows})))


def fidelity_by_profile(profiles: Iterable[str], calibration: Sequence[Mapping[str, Any]]) -> dict[str, Fidelity]:
    """:func:`fidelity` of each profile."""
    return {p: fidelity(p, calibration) for p in sorted(set(profiles))}
