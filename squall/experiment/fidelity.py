"""Measuring fidelity: a quick calibration of each profile a session uses, once per profile.

``squall matrix``, ``squall run``, the pytest plugin and the demo call
:meth:`SessionCalibration.ensure` before a profile's first cell: it measures two disjoint links of
that profile on the cell's own cluster (with the lab's shaper, cleared before and after, so no
second shaper ever touches the containers) and keeps the rows for the report. What the rows mean,
a profile's fidelity, is :mod:`squall.checks.fidelity`'s; the report flags every cell run on a
profile whose fidelity failed. A calibration that cannot run is a failed row that says why, never
an exception that stops the session: the cells still run, flagged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from squall.calibration.stalls import HOST, StallPolicy
from squall.checks.fidelity import CalibrationRow, failed_row
from squall.checks.verdict import Validity

logger = logging.getLogger(__name__)

#: The directed links each profile's quick calibration probes: two disjoint ones, so the two probes
#: do not share a sender or a receiver (four nodes); on smaller clusters one link in both directions.
LINKS_4 = ((0, 1), (2, 3))
LINKS_2 = ((0, 1), (1, 0))

Progress = Callable[[str], None]


def links_for(workers: int) -> tuple[tuple[int, int], ...]:
    """The links a quick calibration probes on a cluster of ``workers`` nodes."""
    if workers < 2:
        raise ValueError(f"calibration needs at least 2 workers, got {workers}")
    return LINKS_4 if workers >= 4 else LINKS_2


class SessionCalibration:
    """Each profile calibrated at most once per session; the rows of all of them, in order."""

    def __init__(self, *, enabled: bool = True, progress: Progress = logger.info,
                 policy: StallPolicy = HOST) -> None:
        self.enabled = enabled
        self.progress = progress
        self.policy = policy  # the host-stall policy every calibration of the session judges by
        self.rows: list[CalibrationRow] = []  # every profile's rows, in the order they were calibrated
        self.verdicts: dict[str, str] = {}  # profile -> its calibration's word: passed, failed, unknown, host-limited
        self.failures: dict[str, list[str]] = {}  # profile -> why each of its failed checks failed

    def ensure(self, profile: str, cluster: Any, workers: int, *, shaper: Any = None) -> None:
        """Calibrate ``profile`` on ``cluster`` (and the shaper open on it) unless done or disabled."""
        if not self.enabled or profile in self.verdicts or workers < 2:
            return
        from squall.calibration import calibrate

        t = time.monotonic()
        self.progress(f"calibrating {profile} (quick, links {', '.join(f'{a}->{b}' for a, b in links_for(workers))})")
        try:
            report = calibrate(profile, workers=workers, quick=True, cluster=cluster, shaper=shaper,
                               pairs=list(links_for(workers)), policy=self.policy)
        except Exception as exc:  # the page says the calibration could not run; the session goes on
            logger.warning("calibration of %s could not run: %s", profile, exc)
            row = failed_row(profile, f"the calibration could not run: {exc}")
            self.rows.append(row)
            self.verdicts[profile] = row.verdict
            self.failures[profile] = [f"the calibration could not run: {exc}"]
            self.progress(f"calibration {profile}: could not run ({exc})")
            return
        rows = report.fidelity_rows()
        self.rows += rows
        self.failures[profile] = [f"{r.link} {r.quantity}: {r.why}" for r in rows if r.validity is Validity.FAIL]
        self.verdicts[profile] = report.verdict
        counts = ", ".join(f"{n} {v}" for v, n in report.counts().items() if n)
        self.progress(f"calibration {profile}: {report.verdict} in {time.monotonic() - t:.1f} s ({counts})")
