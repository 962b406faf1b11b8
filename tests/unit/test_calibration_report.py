"""The report (verdict, JSON, table) and ``squall calibrate`` (arguments, output, exit codes)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest

from squall.calibration import runner, stalls
from squall.calibration.judge import Baseline
from squall.calibration.plan import plan_probes
from squall.calibration.report import CalibrationReport
from squall.calibration.verdicts import HOST_LIMITED, Check
from squall.checks.fidelity import CalibrationRow, fidelity
from squall.checks.verdict import Validity
from squall.cli import calibrate as cli_calibrate
from squall.profiles import load_profile
from squall.shaping import state_at

PASSED, FAILED, UNKNOWN = "passed", "failed", "unknown"  # a row's words


def _report(*verdicts: str, errors: tuple[str, ...] = ()) -> CalibrationReport:
    rows = tuple(Check((0, i + 1), "delay", "ms", 5.0, 5.1 if v != UNKNOWN else None,
                       4.5 if v != UNKNOWN else math.nan,
                       5.5 if v != UNKNOWN else math.nan, Validity.read(v),
                       f"row {i}", host_limited=v == HOST_LIMITED) for i, v in enumerate(verdicts))
    plan = plan_probes(state_at(load_profile("wan-5ms"), 4, 0.0), 4)
    return CalibrationReport("wan-5ms", 4, "nfqueue", 0.0, False, rows, Baseline(40, 30, 80, 50, 3600), plan,
                             errors, ("a note",), 42.0)


@pytest.mark.parametrize("verdicts, errors, overall, strict, lenient", [
    ((PASSED, PASSED), (), PASSED, True, True),
    ((PASSED, HOST_LIMITED), (), HOST_LIMITED, False, True),
    ((PASSED, UNKNOWN), (), UNKNOWN, False, False),
    ((FAILED, HOST_LIMITED), (), FAILED, False, False),
    ((PASSED,), ("the daemon died",), FAILED, False, False),
    ((), (), UNKNOWN, False, False),
])
def test_report_verdict(verdicts: tuple[str, ...], errors: tuple[str, ...],
                        overall: str, strict: bool, lenient: bool) -> None:
    report = _report(*verdicts, errors=errors)
    assert report.verdict == overall
    assert report.passed() is strict
    assert report.passed(allow_host_limited=True) is lenient


def test_report_json_and_table() -> None:
    report = _report(PASSED, UNKNOWN, HOST_LIMITED)
    data = json.loads(report.to_json())
    assert data["verdict"] == "unknown" and data["backend"] == "nfqueue"
    assert data["counts"] == {"passed": 1, "failed": 0, "unknown": 1, "host-limited": 1}
    assert data["rows"][1]["low"] is None and data["rows"][0]["link"] == [0, 1]
    assert data["plan"]["udp_count"] == 1000 and len(data["plan"]["transfers"]) == 12
    assert data["stall_policy"] == stalls.HOST.to_dict()  # the policy the run judged by, in its record
    text = report.format()
    assert text.splitlines()[0] == "calibration of wan-5ms on 4 workers, backend nfqueue: UNKNOWN in 42.0 s"
    assert "0->1  delay   5.000 ms    5.100 ms  4.500..5.500 ms  passed" in text
    assert "note: a note" in text and "host-limited checks were NOT verified" in text


def test_fidelity_rows_are_the_checks_in_the_tables_words() -> None:
    """What a session keeps of a calibration (typed rows for results.json): one per check, with the
    table's figures, and one failed row for an error of the whole run."""
    report = _report(PASSED, UNKNOWN, HOST_LIMITED, errors=("the shaper died",))
    rows = report.fidelity_rows()
    assert rows[0] == CalibrationRow("wan-5ms", "nfqueue", "0->1", "delay", "5.000 ms", "5.100 ms",
                                     "4.500..5.500 ms", PASSED, "row 0")
    assert (rows[1].measured, rows[1].tolerance, rows[1].validity) == ("-", "-", Validity.UNKNOWN)
    assert (rows[2].verdict, rows[2].validity) == (HOST_LIMITED, Validity.UNKNOWN)
    assert rows[3] == CalibrationRow("wan-5ms", "nfqueue", "all", "shaper", "-", "-", "-", FAILED, "the shaper died")
    assert [CalibrationRow.from_json(r.to_json()) for r in rows] == rows
    assert fidelity("wan-5ms", rows).state == "failed"


def _args(**kw: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_calibrate.add_subparser(parser.add_subparsers(dest="command"))
    argv = ["calibrate", "--profile", kw.pop("profile", "wan-5ms")]
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return parser.parse_args(argv)


def test_arguments() -> None:
    args = _args(workers=3, backend="nfqueue", pairs="0->1,2->0", quick=True)
    assert (args.workers, args.backend, args.pairs, args.quick) == (3, "nfqueue", [(0, 1), (2, 0)], True)
    with pytest.raises(SystemExit):
        _args(pairs="0-1")
    with pytest.raises(SystemExit):
        _args(backend="tbf")


class _NoCluster:
    """Stands in for the cluster ``squall calibrate`` starts: these tests fake the calibration itself."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def __enter__(self) -> _NoCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture(autouse=True)
def _no_containers(monkeypatch: pytest.MonkeyPatch) -> None:
    import squall.cluster.backend

    monkeypatch.setattr(squall.cluster.backend, "open_cluster", _NoCluster)  # what the command opens
    # nor is the machine asked whether a run could start (tests/integration/test_preflight.py does that)
    monkeypatch.setattr(cli_calibrate, "preflight", lambda backend, *, engine: None)


@pytest.mark.parametrize("case", [
    ((PASSED,), False, 0),
    ((PASSED, FAILED), False, 1),
    ((PASSED, HOST_LIMITED), False, 1),
    ((PASSED, HOST_LIMITED), True, 0),
])
def test_exit_codes_and_json_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  case: tuple[tuple[str, ...], bool, int]) -> None:
    verdicts, allow, code = case
    seen: dict[str, Any] = {}

    def fake(profile: Any, **kw: Any) -> CalibrationReport:
        seen.update(kw, profile=profile.name)
        return _report(*verdicts)

    monkeypatch.setattr(runner, "calibrate", fake)
    out = tmp_path / "r.json"
    args = _args(json=out, allow_host_limited=True) if allow else _args(json=out)
    assert cli_calibrate.cmd_calibrate(args) == code
    assert isinstance(seen.pop("cluster"), _NoCluster)  # the command's own cluster, passed in
    assert seen.pop("policy") is stalls.HOST  # the command builds the run's stall policy and passes it
    assert seen == {"profile": "wan-5ms", "workers": 4, "backend": None, "pairs": None, "quick": False, "at": 0.0}
    assert json.loads(out.read_text())["profile"] == "wan-5ms"
    assert "calibration of wan-5ms" in capsys.readouterr().out


def test_json_to_stdout(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "calibrate", lambda profile, **kw: _report(PASSED))
    assert cli_calibrate.main(["calibrate", "--profile", "wan-5ms", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "passed"


def test_unknown_profile_is_a_usage_error() -> None:
    assert cli_calibrate.cmd_calibrate(_args(profile="no-such-profile")) == 2


def test_bad_backend_and_cluster_size_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        runner.calibrate("wan-5ms", workers=2, backend="tbf")
    with pytest.raises(ValueError, match="at least 2 workers"):
        runner.calibrate("wan-5ms", workers=1)
