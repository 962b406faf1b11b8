"""Fidelity: did the emulated network do what its profile says? One answer per profile, from its calibration.

A session calibrates each profile it uses (:mod:`squall.experiment.fidelity` runs a quick
calibration and keeps its rows); a row is a :class:`CalibrationRow` (one per quantity per link,
with the ``profile`` and ``backend`` it measured), made from a calibration's checks by
:meth:`squall.calibration.report.CalibrationReport.fidelity_rows` and kept in ``results.json``
(:meth:`CalibrationRow.to_json`, :meth:`CalibrationRow.from_json`). A profile's fidelity is the
:func:`~squall.checks.verdict.merge` of its rows' validities: any row failed -> ``failed``; else any
row unknown (too little data, the host too busy or unable to carry a rate) -> ``unknown``; else
``faithful``. A profile without a row was ``not calibrated``: unknown as well. The report flags
every cell run on a profile whose fidelity failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from squall.checks.verdict import Validity, figure, merge

#: What a results file from before a key existed is read with (rows written before the profile,
#: backend and reason were kept have only link, quantity, configured, measured, tolerance, verdict).
MISSING = "-"


@dataclass(frozen=True)
class CalibrationRow:
    """One calibration check of one profile's link, in the words the report shows and ``results.json`` keeps."""

    profile: str  # the profile whose links were measured
    backend: str  # the shaping backend that carried them ("-": none was opened)
    link: str  # "src->dst", or "all" for a row about the whole calibration
    quantity: str  # delay, jitter, loss, rate (rtt, rtt_jitter, rtt_loss for round trips); calibration, shaper
    configured: str  # what the profile asks, with its unit ("5.000 ms"); "-" when nothing applies
    measured: str  # what was measured, with its unit; "-" when nothing was
    tolerance: str  # the accepted range ("4.500..5.500 ms"); "-" when there is none
    verdict: str  # the row's word: passed, failed, unknown or host-limited
    why: str  # the check's own sentence: figures, tolerance, caveats

    @property
    def validity(self) -> Validity:
        """The row's validity: host-limited and any word this version does not know are unknown."""
        return Validity.read(self.verdict)

    def to_json(self) -> dict[str, str]:
        """Plain data for ``results.json``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: object, where: str = "calibration row") -> CalibrationRow:
        """The row :meth:`to_json` wrote, or one of an older results file (a key it lacks reads ``-``, a
        missing verdict ``unknown``; numbers are written as figures). ``ValueError`` names ``where``,
        the key and what is allowed."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"{where}: expected an object with the keys {', '.join(FIELDS)}, "
                             f"got {type(obj).__name__}")
        unknown = sorted(str(k) for k in obj if k not in FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; allowed: {', '.join(FIELDS)}")
        text = {key: _text(obj[key], where, key) for key in FIELDS if key in obj}
        text.setdefault("verdict", Validity.UNKNOWN.past)
        return cls(**{key: text.get(key, MISSING) for key in FIELDS})


FIELDS = tuple(f.name for f in dataclasses.fields(CalibrationRow))


def _text(value: object, where: str, key: str) -> str:
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return figure(value)
    raise ValueError(f"{where}: {key!r} must be text or a number, got {type(value).__name__} {value!r:.60}")


def failed_row(profile: str, why: str, *, backend: str = MISSING, quantity: str = "calibration") -> CalibrationRow:
    """A failed row for all of a profile's links: its calibration (or its shaper) could not do its job."""
    return CalibrationRow(profile, backend, "all", quantity, MISSING, MISSING, MISSING, Validity.FAIL.past, why)


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


def fidelity(profile: str, calibration: Iterable[CalibrationRow]) -> Fidelity:
    """The :class:`Fidelity` of ``profile`` from every calibration row (rows of other profiles ignored)."""
    rows = [r for r in calibration if r.profile == profile]
    failed = tuple(f"{r.link} {r.quantity}: configured {r.configured}, measured {r.measured}"
                   for r in rows if r.validity is Validity.FAIL)
    unknown = sum(1 for r in rows if r.validity is Validity.UNKNOWN)
    return Fidelity(profile, len(rows), failed, unknown, tuple(sorted({r.backend for r in rows})))


def fidelity_by_profile(profiles: Iterable[str], calibration: Sequence[CalibrationRow]) -> dict[str, Fidelity]:
    """:func:`fidelity` of each profile."""
    return {p: fidelity(p, calibration) for p in sorted(set(profiles))}
