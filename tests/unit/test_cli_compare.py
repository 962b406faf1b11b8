"""``squall compare``'s usage: every malformed form is exit 2 before any container starts (no Docker engine
answers here), a well-formed one reaches the engine (exit 3 without one); and its printed table."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from squall.cli.compare import format_result, protocol_side, tolerance
from squall.cli.main import EXIT_ENVIRONMENT, EXIT_USAGE, main
from squall.compare.stats import Comparison, Sample
from squall.experiment.comparison import ComparePlan, CompareResult, MeasureResult, ProfileResult, Side
from squall.experiment.lab import RunSpec


@pytest.fixture(autouse=True)
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository with one commit of a script; the current directory."""
    (tmp_path / "train.py").write_text("print('step 1 loss 1.0')\n")
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "one"]):
        subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=tmp_path,
                       check=True, capture_output=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def code_of(*argv: str) -> int:
    try:
        return main(["compare", *argv])
    except SystemExit as exc:  # argparse
        return int(exc.code or 0)


@pytest.mark.parametrize("argv", [
    (),  # no form at all
    ("--baseline", "python train.py"),  # one side only
    ("--baseline", "python train.py", "--candidate", "python 'train.py"),  # unbalanced quote
    ("--baseline", "python train.py", "--candidate", ""),
    ("--baseline", "a", "--candidate", "b", "--ref", "HEAD", "--", "python", "train.py"),  # two forms
    ("--ref", "no-such-branch", "--", "python", "train.py"),  # a ref that does not exist
    ("--ref", "HEAD"),  # --ref without its command
    ("--baseline", "python train.py", "--candidate", "python train.py", "--", "python", "x.py"),
    ("--baseline-protocol", "ring", "--candidate-protocol", "no-such-protocol"),
    ("--baseline-protocol", "ring", "--candidate-protocol", "ring lr"),  # an option without its value
    ("--baseline-protocol", "ring", "--candidate-protocol", "ring", "--metric", "loss=loss (\\S+)"),
    ("--baseline", "python train.py", "--candidate", "python train.py", "--runs", "1"),
    ("--baseline", "python train.py", "--candidate", "python train.py", "--runs", "5", "--max-runs", "3"),
    ("--baseline", "python train.py", "--candidate", "python train.py", "--tolerance", "150%"),
    ("--baseline", "python train.py", "--candidate", "python train.py", "--tolerance", "lots"),
    ("--baseline", "python train.py", "--candidate", "python train.py", "--target", "loss<1"),
    ("--baseline", "python train.py", "--candidate", "python train.py", "--workers", "1", "--profile", "preemptible"),
    ("--baseline", "python train.py", "--candidate", "python train.py", "--gate", "speed"),
    ("--baseline", "python train.py", "--candidate", "python train.py", "--nproc-per-node", "0"),
    ("--baseline-protocol", "ring", "--candidate-protocol", "ring", "--nproc-per-node", "2"),  # a command's flag
])
def test_bad_usage_is_refused_before_anything_starts(project: Path, argv: tuple[str, ...],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    profile = () if "--profile" in argv else ("--profile", "lan")
    assert code_of(*profile, *argv) == EXIT_USAGE
    assert "starting cluster" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ("--baseline", "python train.py", "--candidate", "python train.py --fast"),
    ("--ref", "HEAD", "--", "python", "train.py"),
    ("--baseline-protocol", "ring", "--candidate-protocol", "ring lr=0.1"),
])
def test_each_well_formed_form_reaches_the_engine(project: Path, argv: tuple[str, ...]) -> None:
    assert code_of("--profile", "lan", *argv) == EXIT_ENVIRONMENT


def test_the_workers_limit_is_the_chosen_engines(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """300 workers are more than the local engine takes (usage, naming the engine) but within a swarm's."""
    monkeypatch.setenv("SQUALL_ENGINE", "local")  # select_engine writes it; the test's end restores it
    sides = ("--baseline-protocol", "ring", "--candidate-protocol", "ring lr=0.1", "--profile", "lan")
    assert code_of(*sides, "--workers", "300") == EXIT_USAGE
    assert "needs 2..250 workers on the local engine, got 300" in caplog.text
    assert code_of(*sides, "--workers", "300", "--engine", "swarm") == EXIT_ENVIRONMENT


def test_a_ref_snapshot_leaves_no_files_behind(project: Path) -> None:
    before = set(Path("/tmp").glob("squall-compare-*"))
    code_of("--profile", "lan", "--ref", "HEAD", "--", "python", "train.py")
    assert set(Path("/tmp").glob("squall-compare-*")) == before


@pytest.mark.parametrize(("text", "value"), [("2%", 0.02), ("0.05", 0.05), (" 10% ", 0.1), ("0", 0.0)])
def test_tolerance(text: str, value: float) -> None:
    assert tolerance(text) == pytest.approx(value)


def test_a_protocol_side_reads_its_options_as_yaml_scalars() -> None:
    assert protocol_side("topk k=0.05 ef=ef21m momentum=true steps=3", flag="--x") == (
        "topk", {"k": 0.05, "ef": "ef21m", "momentum": True, "steps": 3})


def _measure(name: str, verdict: str, ratio: float, *, gating: bool = True) -> MeasureResult:
    comparison = Comparison(ratio=ratio, ci_low=ratio * 0.9, ci_high=ratio * 1.1, verdict=verdict,  # type: ignore[arg-type]
                            why="w", n_pairs=3, n_used=3, confidence=0.95, baseline_failed=0, candidate_failed=0,
                            baseline_censored=0, candidate_censored=0)
    return MeasureResult(name, False, Sample((1.0, 1.1, 1.2), (False,) * 3), Sample((2.0, 2.1, 2.2), (False,) * 3),
                         comparison, gating)


def test_one_worse_gating_measure_is_a_regression_and_the_gate_can_narrow_it() -> None:
    side = Side("baseline", "ring", protocol=RunSpec("ring", "lan"))
    plan = ComparePlan(side, Side("candidate", "ring", protocol=RunSpec("ring", "lan")), ("lan",), 4, runs=3)
    profile = ProfileResult("lan", (_measure("time_to_target_s", "same", 1.0), _measure("bytes_sent", "worse", 2.0)),
                            ())
    result = CompareResult(plan, (profile,))
    assert result.regression and result.verdict == "worse"
    obj = result.to_json()
    assert obj["regression"] is True and obj["profiles"][0]["measures"]["bytes_sent"]["verdict"] == "worse"
    assert {"baseline", "candidate", "ratio", "ci_low", "ci_high", "verdict"} <= set(
        obj["profiles"][0]["measures"]["time_to_target_s"])
    narrowed = ProfileResult("lan", (_measure("time_to_target_s", "same", 1.0),
                                     _measure("bytes_sent", "worse", 2.0, gating=False)), ())
    gated = CompareResult(plan, (narrowed,))
    assert not gated.regression and gated.verdict == "same"
    text = format_result(result)
    assert "REGRESSION" in text and "bytes_sent" in text and "2.000 [1.800, 2.200]" in text


def test_the_gate_is_the_time_to_target_by_default_and_shares_the_confidence() -> None:
    from squall.target import Target

    side = Side("baseline", "ring", protocol=RunSpec("ring", "lan"))
    plan = ComparePlan(side, side, ("lan", "wan-5ms"), 4, runs=3, target=Target("loss", 1.0))
    names = ["time_to_target_s", "bytes_sent", "final_loss"]
    assert plan.gating(names) == ["time_to_target_s"]
    assert ComparePlan(side, side, ("lan",), 4, runs=3).gating(names) == names  # no target: every measure
    assert ComparePlan(side, side, ("lan",), 4, runs=3, gate=("bytes_sent",)).gating(names) == ["bytes_sent"]
    assert plan.each(2) == pytest.approx(0.975) and plan.each(1) == pytest.approx(0.95)


# -- a matrix file's compare: entries --------------------------------------------------------------------


def _matrix(tmp_path: Path, compare: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text("protocols: [ring, dpsgd]\nprofiles: [lan, wan-5ms]\nworkers: [4]\n"
                    "run: {seconds: 5, target: {accuracy: 0.85}, config: {eval_every: 5}}\n" + compare)
    return path


def test_a_matrix_compare_entry_becomes_a_plan_over_its_profiles(tmp_path: Path) -> None:
    from squall.experiment.comparison import matrix_plans
    from squall.experiment.matrix import load_matrix_file
    from squall.protocols.catalog import PROTOCOLS
    from squall.target import Target

    path = _matrix(tmp_path, "compare: {baseline: ring, candidate: 'dpsgd lr=0.3', runs: 4, tolerance: 2%}\n")
    spec = load_matrix_file(path, known_protocols=PROTOCOLS)
    (plan,) = matrix_plans(spec, where=str(path), base=tmp_path, staging=tmp_path / "staging")
    assert plan.profiles == ("lan", "wan-5ms") and plan.workers == 4 and plan.runs == 4
    assert plan.tolerance == pytest.approx(0.02) and plan.target == Target("accuracy", 0.85)
    assert plan.candidate.protocol is not None and plan.candidate.protocol.protocol == "dpsgd"
    assert dict(plan.candidate.protocol.config) == {"eval_every": 5, "lr": 0.3}


@pytest.mark.parametrize(("compare", "says"), [
    ("compare: {baseline: ring}\n", r"missing key\(s\) \['candidate'\]"),
    ("compare: {baseline: ring, candidate: nope}\n", "candidate"),
    ("compare: {baseline: ring, candidate: dpsgd, runs: 1}\n", "--runs must be at least 2"),
    ("compare: {baseline: ring, candidate: dpsgd, speed: 3}\n", r"unknown key\(s\) \['speed'\]"),
    ("compare: [ring, dpsgd]\n", "compare: expected a comparison"),
])
def test_a_bad_compare_entry_is_a_usage_error_naming_it(tmp_path: Path, compare: str, says: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    path = _matrix(tmp_path, compare)
    assert main(["matrix", str(path)]) == EXIT_USAGE
    assert any(re.search(says, r.getMessage()) for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_comparisons_round_trip_through_results_json(tmp_path: Path) -> None:
    from squall.report.page import Results, load_results, write_report

    obj = {"regression": True, "verdict": "worse", "baseline": "ring", "candidate": "dpsgd", "tolerance": 0.01,
           "gate": ["time_to_target_s"], "profiles": [{"profile": "lan", "pairs": 3, "runs": [], "measures": {
               "time_to_target_s": {"baseline": [1.0, 1.1, 1.0], "candidate": [2.0, 2.1, 2.0], "ratio": 2.0,
                                    "ci_low": 1.8, "ci_high": 2.2, "verdict": "worse", "why": "w"}}}]}
    _, page = write_report(Results(title="m", comparisons=(obj,)), tmp_path)
    assert load_results(tmp_path).comparisons == (obj,)
    assert "Comparison: dpsgd against ring" in page.read_text() and "REGRESSION" in page.read_text()
