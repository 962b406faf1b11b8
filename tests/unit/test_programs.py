"""A user's program, the pure parts: metric patterns and squall.log lines, targets, specs, the verdict, the
``--json`` object, and the matrix's programs: entries (squall/programs/, squall/record.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from squall import record
from squall.checks.convergence import bytes_to_target, time_to_target
from squall.checks.verdict import Verdict
from squall.experiment.matrix import MatrixError, build_matrix
from squall.programs.lines import (
    LOG_PREFIX,
    LineError,
    MetricPattern,
    decode_log_line,
    match_line,
    parse_patterns,
    patterns_from_json,
)
from squall.programs.result import ProgramResult, result_json
from squall.programs.spec import ProgramError, default_name, program_from_args, program_from_mapping, read_requirements
from squall.programs.verdict import RankRun, judge
from squall.run_meta import LinkCount, ProgramMeta, RunMeta
from squall.run_trace import RunTrace, build_trace
from squall.target import Target, TargetError

# -- metric patterns -------------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "line", "expected"), [
    (r"loss=loss (\S+)", "step 10 loss 2.31", (2.31, None)),
    (r"loss=step (?P<step>\d+) loss (?P<value>\S+)", "step 10 loss 2.31", (2.31, 10)),
    (r"acc=acc(?:uracy)?[:=] *(\S+)%?", "accuracy: 0.93", (0.93, None)),
    (r"loss=loss (\S+)", "epoch 1 loss 2.5e-3,", (2.5e-3, None)),  # a trailing comma is not part of the figure
    (r"throughput=\d+(?= samples/s)", "1250 samples/s", (1250.0, None)),  # no group: the whole match
    (r"loss=loss (\S+)", "loss nan", None),  # not a finite figure: no record
    (r"loss=loss (\S+)", "loss abc", None),
    (r"loss=loss (\S+)", "validation done", None),
])
def test_a_pattern_reads_the_first_group_or_value_and_an_optional_step(
        pattern: str, line: str, expected: tuple[float, int | None] | None) -> None:
    assert MetricPattern.parse(pattern).match(line) == expected


@pytest.mark.parametrize(("text", "says"), [
    ("loss", "expected NAME=REGEX"),
    ("=loss (\\S+)", "expected NAME=REGEX"),
    ("loss=loss (", "not a regular expression"),
    ("1loss=x(\\d)", "allowed: a letter or _"),
    ("step=step (\\d+)", "reserved"),
    ("wall=(\\d+)", "reserved"),
    ("loss=step (?P<step>\\d+)", "only the group 'step'"),
])
def test_a_bad_pattern_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(LineError, match=says):
        MetricPattern.parse(text)


def test_patterns_are_unique_and_a_line_can_carry_several() -> None:
    with pytest.raises(LineError, match=r"\['loss'\] are given more than once"):
        parse_patterns(["loss=loss (\\S+)", "loss=l (\\S+)"])
    pats = patterns_from_json({"loss": r"loss (\S+)", "acc": r"acc (\S+)"})
    hit = match_line("step 3 loss 1.5 acc 0.75", pats)
    assert hit is not None and dict(hit.figures) == {"loss": 1.5, "acc": 0.75}
    assert match_line("nothing here", pats) is None
    with pytest.raises(LineError, match="must map names"):
        patterns_from_json(["loss"])


# -- squall.log lines ------------------------------------------------------------------------------


def test_the_log_helper_and_the_runner_agree_on_the_prefix() -> None:
    assert record.PREFIX == LOG_PREFIX


def test_log_writes_one_line_only_under_squall(capfd: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(record.ENV, raising=False)
    assert record.log(step=3, loss=1.25) == {"step": 3, "loss": 1.25}
    assert capfd.readouterr().out == ""
    monkeypatch.setenv(record.ENV, "/tmp")
    record.log(step=4, loss=float("nan"), name="x", ok=True)
    out = capfd.readouterr().out
    assert out.startswith(LOG_PREFIX) and out.endswith("\n")
    assert decode_log_line(out.strip()) == {"step": 4, "loss": None, "name": "x", "ok": True}
    with pytest.raises(TypeError, match="not a number"):
        record.log(step=1, loss=[1.0])
    with pytest.raises(TypeError, match="step must be an int"):
        record.log(step=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("line", "says"), [
    (LOG_PREFIX + "not json", "not JSON"),
    (LOG_PREFIX + "[1, 2]", "must be a JSON object"),
    (LOG_PREFIX + '{"step": -1}', "step must be an integer >= 0"),
    (LOG_PREFIX + '{"step": 1.5}', "step must be an integer >= 0"),
    (LOG_PREFIX + '{"wall": 3}', "reserved"),
    (LOG_PREFIX + '{"loss": [1, 2]}', "allowed: numbers"),
    (LOG_PREFIX + '{"x y": 1}', "identifiers"),
    (LOG_PREFIX + json.dumps({"s": "x" * 500}), "strings of at most"),
    (LOG_PREFIX + json.dumps({f"f{i}": i for i in range(100)}), "at most 64"),
])
def test_a_malformed_log_record_is_refused_with_a_reason(line: str, says: str) -> None:
    with pytest.raises(LineError, match=says):
        decode_log_line(line)


# -- targets ---------------------------------------------------------------------------------------


def test_targets_parse_both_directions_and_refuse_anything_else() -> None:
    t = Target.parse(" loss <= 1.2 ")
    assert (t.metric, t.op, t.value) == ("loss", "<=", 1.2) and t.met(1.2) and not t.met(1.3)
    a = Target.parse("accuracy>=0.9")
    assert a.met(0.95) and not a.met(0.5) and a.best([0.1, 0.8]) == 0.8 and str(a) == "accuracy>=0.9"
    for bad in ("loss<1.2", "loss<=abc", "<=1", "loss<=nan", "loss==1"):
        with pytest.raises(TargetError):
            Target.parse(bad)


def test_a_target_without_a_direction_takes_the_figures_usual_one() -> None:
    assert Target.parse("accuracy=0.9") == Target("accuracy", 0.9, ">=") == Target("accuracy", 0.9)
    assert Target.parse("loss=1.2") == Target("loss", 1.2, "<=") == Target("loss", 1.2)
    assert Target.parse("error>=1e-6").op == ">="  # said explicitly: kept


@pytest.mark.parametrize("spelling", ["accuracy>=0.9", {"accuracy": 0.9}, {"metric": "accuracy", "value": 0.9},
                                      Target("accuracy", 0.9)])
def test_every_spelling_of_a_target_reads_the_same(spelling: object) -> None:
    target = Target.of(spelling)  # type: ignore[arg-type]
    assert target == Target("accuracy", 0.9, ">=") and Target.of(target.to_mapping()) == target


@pytest.mark.parametrize("bad", [{"accuracy": "high"}, {"a": 1, "b": 2}, 0.9, {"metric": "loss", "value": True}])
def test_a_malformed_target_is_refused_with_what_is_allowed(bad: object) -> None:
    with pytest.raises(TargetError):
        Target.of(bad)  # type: ignore[arg-type]


# -- specs -----------------------------------------------------------------------------------------


def test_a_program_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "req.txt").write_text("# deps\nhivemind==1.1.12  # the DHT\n\nnumpy\n")
    spec = program_from_args(["python", "train.py", "--lr", "0.1"], metrics=["loss=loss (\\S+)"],
                             target="loss<=1.0", requirements="req.txt", cwd=tmp_path)
    assert spec.name == "train" and spec.workdir == str(tmp_path.resolve()) and spec.metric_names == ("loss",)
    assert spec.requirements == ("hivemind==1.1.12", "numpy") and spec.requirements_source.endswith("req.txt")
    assert spec.to_json()["command"] == ["python", "train.py", "--lr", "0.1"]


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"metrics": ["loss"]}, "--metric: 'loss': expected NAME=REGEX"),
    ({"target": "loss<1"}, "--target: 'loss<1': expected NAME<=NUMBER"),
    ({"workdir": "nope"}, "--workdir: .*nope is not a directory"),
    ({"requirements": "missing.txt"}, "--requirements: cannot read"),
    ({"pip": ["-e ."]}, "only requirement specifiers"),
    ({"pip": ["git+https://x/y"]}, "only requirement specifiers"),
    ({"name": "bad name!"}, "--name: 'bad name!'"),
])
def test_bad_flags_are_named(tmp_path: Path, kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ProgramError, match=says):
        program_from_args(["python", "x.py"], cwd=tmp_path, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("raw", "says"), [
    ({"command": "python train.py"}, "command: give the command as a list of words"),
    ({"name": "x"}, "missing key 'command'"),
    ({"command": ["python"], "metric": {}}, r"unknown key\(s\) \['metric'\]"),
    ({"command": ["python"], "metrics": ["loss"]}, "metrics: expected a mapping"),
    ({"command": ["python"], "metrics": {"loss": "("}}, "not a regular expression"),
    ({"command": ["python"], "target": {"loss": 1}}, "target: expected a string"),
    ({"command": ["python"], "env": {"RANK": "3"}}, "RANK is set by Squall"),
    ({"command": ["python"], "pip": "hivemind"}, "pip: expected a list"),
])
def test_a_bad_entry_names_its_source_and_key(tmp_path: Path, raw: dict[str, object], says: str) -> None:
    with pytest.raises(ProgramError, match=f"m.yaml: programs\\[0\\]: .*{says}"):
        program_from_mapping(raw, source="m.yaml: programs[0]", base=tmp_path)


def test_default_names_and_requirement_lines() -> None:
    assert default_name(["python", "-u", "train.py", "--x"]) == "train"
    assert default_name(["./run.sh"]) == "run"
    assert default_name(["python", "-c", "print(1)"]) == "python"
    assert read_requirements("a==1\n  # c\nb[x]>=2 ; python_version>'3'\n", source="r") == (
        "a==1", "b[x]>=2 ; python_version>'3'")
    with pytest.raises(ProgramError, match=r"r:2: '-r other.txt'"):
        read_requirements("a\n-r other.txt\n", source="r")


def test_a_matrix_takes_programs_beside_protocols(tmp_path: Path) -> None:
    m = build_matrix({"protocols": ["ring"], "programs": [{"name": "ddp", "command": ["python", "train.py"],
                                                           "target": "loss<=1"}],
                      "profiles": ["lan"], "workers": [4]}, source="m.yaml", known_protocols=["ring"], base=tmp_path)
    cells = m.cells()
    assert [c.protocol for c in cells] == ["ring", "ddp"] and cells[0].program is None
    assert cells[1].program is not None and cells[1].program.workdir == str(tmp_path.resolve())
    assert m.ids() == ["ring-lan-w4", "ddp-lan-w4"]
    only = build_matrix({"programs": [{"command": ["python", "a.py"]}], "profiles": "lan", "workers": 2},
                        source="m.yaml", known_protocols=["ring"], base=tmp_path)
    assert only.ids() == ["a-lan-w2"]
    with pytest.raises(MatrixError, match=r"missing key\(s\) \['protocols \(or programs\)'\]"):
        build_matrix({"profiles": ["lan"], "workers": [2]}, source="m.yaml", known_protocols=["ring"])
    with pytest.raises(MatrixError, match="names \\['ring'\\] are also protocols"):
        build_matrix({"protocols": ["ring"], "programs": [{"name": "ring", "command": ["x"]}], "profiles": ["lan"],
                      "workers": [2]}, source="m.yaml", known_protocols=["ring"], base=tmp_path)
    with pytest.raises(MatrixError, match=r"m.yaml: programs\[0\]: missing key 'command'"):
        build_matrix({"programs": [{"name": "x"}], "profiles": ["lan"], "workers": [2]}, source="m.yaml",
                     known_protocols=["ring"], base=tmp_path)
    with pytest.raises(MatrixError, match="programs: duplicated entries"):
        build_matrix({"programs": [{"command": ["python", "a.py"]}, {"command": ["python", "a.py"]}],
                      "profiles": ["lan"], "workers": [2]}, source="m.yaml", known_protocols=["ring"], base=tmp_path)


# -- the verdict -----------------------------------------------------------------------------------


def _trace(per_rank: list[list[dict[str, object]]], survivors: tuple[int, ...] = ()) -> RunTrace:
    return build_trace(protocol="p", profile="lan", seed=0, backend="nfqueue", per_worker=per_rank, start_wall=100.0,
                       survivors=survivors)


def _records(*points: tuple[float, float]) -> list[dict[str, object]]:
    return [{"step": k + 1, "wall": 100.0 + t, "loss": v} for k, (t, v) in enumerate(points)]


OK = [RankRun(r, 0, "exited", 0, 10.0) for r in range(2)]
LOSS = Target.parse("loss<=1.0")


def test_a_failed_rank_fails_the_run_with_its_rank_code_and_stderr() -> None:
    runs = [RankRun(0, 0, "stopped", None, 3.0, ended_s=3.1),
            RankRun(1, 0, "exited", 3, 2.0, ("Traceback", "RuntimeError: boom"), ended_s=2.0)]
    v = judge(_trace([_records((1, 0.5)), _records((1, 0.5))]), runs, target=LOSS)
    assert v.passed is False and v.why.startswith("rank 1 exited with exit code 3; last lines of its stderr:")
    assert "RuntimeError: boom" in v.why
    crashed = judge(_trace([[], []]), [RankRun(0, 0, "exited", -9, 1.0, ended_s=1.0), OK[1]], target=None)
    assert "signal 9" in crashed.why


def test_with_a_target_never_read_is_unknown_reached_is_pass_else_fail() -> None:
    never = judge(_trace([[{"step": 1, "wall": 101.0, "acc": 0.3}], []]), OK, target=LOSS)
    assert never.passed is None and "no rank ever reported 'loss'" in never.why
    reached = judge(_trace([_records((1, 2.0), (3, 0.9)), _records((2, 0.8))]), OK, target=LOSS)
    assert reached.passed is True and reached.measured == pytest.approx(2.0)  # t = 0 at the first record
    short = judge(_trace([_records((1, 2.0), (3, 0.9)), _records((2, 1.5))]), OK, target=LOSS)
    assert short.passed is False and "rank 1 best 1.5" in short.why
    other = Target.parse("acc>=0.5")
    assert judge(_trace([[{"step": 1, "wall": 101.0, "acc": 0.6}]] * 2), OK, target=other).passed is True


def test_without_a_target_exits_decide_and_a_silent_pattern_is_unknown() -> None:
    assert judge(_trace([[], []]), OK, target=None).passed is True
    assert judge(_trace([[], []]), OK, target=None, metric_names=["loss"]).passed is None
    hung = [OK[0], RankRun(1, 0, "budget", -15, 30.0)]
    v = judge(_trace([[], []]), hung, target=None)
    assert v.passed is False and "ranks [1] were still running" in v.why


def test_a_pattern_that_never_matched_is_unknown_even_when_other_figures_were_read() -> None:
    """docs/your-own-program.md: a pattern that never matched makes the run unknown, naming it."""
    read = _trace([_records((1, 2.0), (3, 0.9)), _records((2, 0.8))])  # loss read, and the target met
    assert judge(read, OK, target=LOSS, metric_names=["loss"]).passed is True
    v = judge(read, OK, target=LOSS, metric_names=["loss", "acc"])
    assert v.passed is None and "['acc'] never matched" in v.why and "figures read: ['loss']" in v.why
    assert judge(read, OK, target=None, metric_names=["acc", "tps"]).why.startswith("the patterns for ['acc', 'tps']")
    # a squall.log record carrying a figure of its own does not stand in for the silent pattern
    logged = _trace([[{"step": 1, "wall": 101.0, "loss": 0.5, "tokens_per_s": 9.0}]] * 2)
    v = judge(logged, OK, target=None, metric_names=["acc"])
    assert v.passed is None and "figures read: ['loss', 'tokens_per_s']" in v.why
    # a failed rank is still named first: it says more than the silence it caused
    failed = [RankRun(0, 0, "exited", 1, 1.0, ("boom",), ended_s=1.0), OK[1]]
    assert judge(read, failed, target=LOSS, metric_names=["acc"]).passed is False


def test_churn_and_stops_are_not_failures_and_a_killed_rank_is_not_waited_for() -> None:
    runs = [RankRun(0, 0, "exited", 0, 9.0), RankRun(1, 0, "killed", None, 4.0), RankRun(1, 1, "exited", 0, 5.0)]
    trace = _trace([_records((1, 0.9)), _records((6, 0.8))])
    assert judge(trace, runs, target=LOSS).passed is True
    gone = _trace([_records((1, 0.9)), _records((1, 2.0))], survivors=(0,))
    assert time_to_target(gone, LOSS) == 0.0  # only the surviving rank counts
    with pytest.raises(ValueError, match="rank state 'weird'"):
        RankRun(0, 0, "weird", 0, 1.0)


# -- the --json object -----------------------------------------------------------------------------


def test_the_json_object_has_what_the_issue_asks() -> None:
    per = [[{"step": 1, "wall": 101.0, "loss": 2.0, "bytes_sent": 100},
            {"step": 2, "wall": 103.0, "loss": 0.9, "bytes_sent": 300}],
           [{"step": 1, "wall": 101.5, "loss": 0.5, "bytes_sent": 50}]]
    runs = [RankRun(0, 0, "exited", 0, 5.0, logs="/l/rank0"), RankRun(1, 0, "exited", 0, 5.0, logs="/l/rank1")]
    links = [[0, 1, 1000, 10, 0], [1, 0, 200, 5, 1]]
    meta = RunMeta(links=tuple(LinkCount.from_json(row) for row in links),
                   program=ProgramMeta(spec={"metrics": {"loss": "loss (\\S+)"}}, runs=tuple(runs)))
    trace = build_trace(protocol="ddp", profile="thin-20mbit", seed=0, backend="nfqueue", per_worker=per,
                        start_wall=100.0, meta=meta)
    verdict = judge(trace, runs, target=LOSS)
    obj = result_json(trace, verdict, target=LOSS)
    assert obj["verdict"] == "pass" and obj["profile"] == "thin-20mbit" and obj["backend"] == "nfqueue"
    assert obj["ranks"] == [{"rank": 0, "exit_code": 0, "state": "exited", "restarts": 0, "logs": "/l/rank0",
                             "stack": None},
                            {"rank": 1, "exit_code": 0, "state": "exited", "restarts": 0, "logs": "/l/rank1",
                             "stack": None}]
    assert obj["hung"] is False and obj["faults"] == [] and obj["agreement"] == []
    assert obj["bytes_sent"] == [1000, 200] and obj["bytes_received"] == [200, 1000]
    assert obj["metrics"]["loss"][0] == {"rank": 0, "t": 0.0, "value": 2.0, "step": 1}
    assert obj["time_to_target_s"] == pytest.approx(2.0) and obj["bytes_to_target"] == [300, 50]
    assert bytes_to_target(trace, Target.parse("loss<=0.1")) == [None, None]
    json.dumps(obj)  # plain data
    result = ProgramResult(trace, verdict, LOSS, tuple(runs))
    assert result.values("loss", rank=0) == [2.0, 0.9] and result.bytes_sent == [1000, 200]
    assert result.links[1] == (1, 0, 200, 5, 1) and result.time_to_target_s == pytest.approx(2.0)
    with pytest.raises(KeyError, match="rank 5 has no run 0"):
        result.run(5)
    unknown = result_json(trace, Verdict("program", None, None, "", "why"), target=None)
    assert unknown["verdict"] == "unknown" and unknown["time_to_target_s"] is None
