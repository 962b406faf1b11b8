"""A session's calibration keeps typed rows: one failed row when a profile's calibration cannot run."""

from __future__ import annotations

from squall.calibration.stalls import HOST
from squall.checks.fidelity import CalibrationRow, fidelity
from squall.checks.verdict import Validity
from squall.experiment.fidelity import SessionCalibration, links_for


def test_a_calibration_that_cannot_run_is_one_failed_row_and_is_not_tried_again() -> None:
    said: list[str] = []
    session = SessionCalibration(progress=said.append)
    assert session.policy is HOST  # the quiet host's policy unless the session is given another
    session.ensure("no-such-profile", None, 4)
    (row,) = session.rows
    assert isinstance(row, CalibrationRow)
    assert (row.profile, row.link, row.quantity, row.validity) == ("no-such-profile", "all", "calibration",
                                                                   Validity.FAIL)
    assert row.why.startswith("the calibration could not run: ") and "no-such-profile" in row.why
    assert session.verdicts == {"no-such-profile": "failed"} and session.failures["no-such-profile"] == [row.why]
    assert fidelity("no-such-profile", session.rows).state == "failed"
    session.ensure("no-such-profile", None, 4)  # once per profile per session
    assert len(session.rows) == 1 and said[-1].startswith("calibration no-such-profile: could not run")


def test_a_disabled_session_or_a_single_worker_calibrates_nothing() -> None:
    off = SessionCalibration(enabled=False)
    off.ensure("lan", None, 4)
    one = SessionCalibration()
    one.ensure("lan", None, 1)
    assert off.rows == one.rows == [] and links_for(2) == ((0, 1), (1, 0))
