"""The pure parts of issue 38: py-spy's dump read, the quiet rule of the hang watch, agreement, fault
windows and their recovery, a cell's outcome, the parameter fingerprint, text figures, and the typed
records' round trip through results.json."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
import torch

import squall
from squall.checks.agreement import Agree, AgreeError, agree_verdict, agreement, check_names
from squall.checks.liveness import fault_outcome, hang_verdict, outcome
from squall.checks.recovery import fault_events, fault_windows
from squall.cluster.stacks import HostProcess, parse_dump, rank_pid, read_dump
from squall.experiment.hangs import DEFAULT_AFTER_S, default_after, quiet_since
from squall.programs.lines import MetricPattern
from squall.run_meta import Agreement, FaultEvent, Hang, ProgramMeta, RankRun, RankStack, RunMeta
from squall.run_trace import RunTrace, StepRecord, step_records, trace_from_json, trace_to_json

DUMP = """Process 4242: python train.py
Python v3.11.2 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    allreduce (torch/distributed/distributed_c10d.py:2950)
    wrapper (torch/distributed/c10d_logger.py:81)
    main (train.py:40)
    <module> (train.py:60)
Thread 4250 (active+gil): "Thread-1 (watch)"
    run (watch.py:12)
"""

NO_NAMES = """Process 7: python peer.py
Python v3.11.2 (/usr/bin/python3.11)

Thread 0x7F00AA (idle)
    select (selectors.py:468)
"""

SUBPROCESSES = DUMP + """
Process 4300: python helper.py
Python v3.11.2 (/usr/bin/python3.11)

Thread 4300 (idle): "MainThread"
    sleep (helper.py:3)
"""


@pytest.mark.parametrize(("text", "pids", "threads", "blocked"), [
    (DUMP, (4242,), 2, "allreduce (torch/distributed/distributed_c10d.py:2950)"),
    (NO_NAMES, (7,), 1, "select (selectors.py:468)"),  # no thread names: the first thread is the main one
    (SUBPROCESSES, (4242, 4300), 3, "allreduce (torch/distributed/distributed_c10d.py:2950)"),
    ("", (), 0, ""),
    ("Error: Failed to find python version from target process\n", (), 0, ""),
])
def test_parse_dump_reads_every_thread_and_the_main_threads_innermost_frame(
        text: str, pids: tuple[int, ...], threads: int, blocked: str) -> None:
    dump = parse_dump(text)
    assert dump.pids == pids and len(dump.threads) == threads and dump.blocked_in == blocked


def test_parse_dump_keeps_frames_innermost_first_and_thread_states() -> None:
    main, other = parse_dump(DUMP).threads
    assert main.name == "MainThread" and main.state == "idle" and len(main.frames) == 4
    assert main.frames[-1] == "<module> (train.py:60)"
    assert other.state == "active+gil" and other.name == "Thread-1 (watch)"


def test_rank_pid_walks_below_the_agent() -> None:
    procs = [HostProcess(10, 1, 1, 0, "docker-init"), HostProcess(11, 10, 7, 0, "agent"),
             HostProcess(20, 11, 30, 0, "job"), HostProcess(21, 20, 31, 65534, "python train.py"),
             HostProcess(22, 21, 32, 65534, "python helper.py")]
    assert rank_pid(procs, 10, 1) == 20 and rank_pid(procs, 10, 2) == 21 and rank_pid(procs, 10, 3) == 22
    assert rank_pid(procs, 10, 4) is None and rank_pid(procs[:2], 10, 1) is None


def test_rank_pid_finds_a_forked_in_agent() -> None:
    """An agent the fork server placed has a parent outside the namespace; init's child is the stand-in."""
    procs = [HostProcess(10, 1, 1, 0, "docker-init"), HostProcess(11, 10, 7, 0, "stand-in"),
             HostProcess(15, 900, 8, 0, "agent"), HostProcess(20, 15, 30, 0, "job"),
             HostProcess(21, 20, 31, 65534, "python train.py")]
    assert rank_pid(procs, 10, 1) == 20 and rank_pid(procs, 10, 2) == 21 and rank_pid(procs, 10, 3) is None


@pytest.mark.parametrize(("lines", "samples", "since"), [
    ([], [], 100.0),  # nothing yet: quiet since the start
    ([105.0], [(100.0, 0), (101.0, 500), (102.0, 900)], 105.0),  # a trickle does not count
    ([103.0], [(100.0, 0), (101.0, 0), (106.0, 10_000), (107.0, 10_100)], 106.0),  # 2 KB/s up to 106
    ([], [(100.0, 5000), (101.0, 0), (102.0, 100)], 100.0),  # a counter going down counts as nothing
    ([110.0], [(100.0, 0), (105.0, 1_000_000)], 110.0),
])
def test_quiet_since_needs_both_witnesses(lines: list[float], samples: list[tuple[float, int]],
                                          since: float) -> None:
    assert quiet_since(100.0, lines, samples, trickle_bps=1000.0) == since


def test_the_default_threshold_leaves_short_runs_to_their_budget() -> None:
    assert default_after(60.0) is None and default_after(DEFAULT_AFTER_S) is None
    assert default_after(600.0) == DEFAULT_AFTER_S


def _trace(rows: Sequence[tuple[int, float, Mapping[str, float | str]]], *, meta: RunMeta | None = None,
           workers: int = 3, survivors: tuple[int, ...] = ()) -> RunTrace:
    def loss(f: Mapping[str, float | str]) -> float | None:
        value = f.get("loss")
        return value if isinstance(value, float) else None

    records = tuple(StepRecord(worker=w, step=k, t=t, loss=loss(f),
                               extra={n: v for n, v in f.items() if isinstance(v, float) and n != "loss"},
                               texts={n: v for n, v in f.items() if isinstance(v, str)})
                    for k, (w, t, f) in enumerate(rows))
    return RunTrace("p", "lan", workers, 0, "netem", records, survivors=survivors, meta=meta or RunMeta())


@pytest.mark.parametrize(("values", "agree", "passed", "odd"), [
    ({0: "aa", 1: "aa", 2: "aa"}, "params", True, ()),
    ({0: "aa", 1: "bb", 2: "aa"}, "params", False, (1,)),
    ({0: "aa", 1: "bb"}, "params", False, (1, 2)),  # a tie: the lowest rank's group; rank 2 printed none
    ({0: 1.0, 1: 1.0 + 1e-9, 2: 1.0}, "loss~1e-6", True, ()),
    ({0: 1.0, 1: 1.0 + 1e-9, 2: 1.0}, "loss", False, (1,)),
    ({0: 1.0, 1: 2.0, 2: 2.0}, "loss~0.1", False, (0,)),
    ({0: "aa", 1: "aa"}, "params", False, (2,)),  # rank 2 finished without printing it
])
def test_agreement_names_the_odd_ranks(values: dict[int, float | str], agree: str, passed: bool,
                                       odd: tuple[int, ...]) -> None:
    spec = Agree.parse(agree)
    trace = _trace([(r, 1.0 + r, {spec.name: v}) for r, v in values.items()])
    result = agreement(trace, spec, finished=[0, 1, 2])
    assert result.passed is passed and result.odd == odd, result.why
    if odd:
        assert f"ranks {list(odd)}" in result.why and spec.name in result.why


def test_agreement_compares_the_last_value_and_only_finished_ranks() -> None:
    trace = _trace([(0, 1.0, {"params": "old"}), (1, 1.0, {"params": "new"}), (0, 2.0, {"params": "new"}),
                    (2, 2.0, {"params": "odd"})])
    assert agreement(trace, Agree("params"), finished=[0, 1]).passed is True
    assert agreement(trace, Agree("params"), finished=[0, 1, 2]).odd == (2,)


def test_a_figure_no_rank_printed_is_unknown_naming_it() -> None:
    result = agreement(_trace([(0, 1.0, {"loss": 1.0})]), Agree("params"), finished=[0])
    assert result.passed is None and "'params'" in result.why
    verdict = agree_verdict([result])
    assert verdict is not None and verdict.passed is None and "params" in verdict.why


@pytest.mark.parametrize("text", ["", "1abc", "params~x", "params~-1", "a b", "log:"])
def test_bad_agree_values_say_what_is_allowed(text: str) -> None:
    with pytest.raises(AgreeError, match=r"expected NAME|tolerance"):
        Agree.parse(text)


def test_agree_names_must_be_defined_unless_logged() -> None:
    check_names([Agree("params"), Agree.parse("log:digest")], ["params", "loss"], flag="--agree", what="x")
    with pytest.raises(AgreeError, match=r"--agree digest: x defines no figure 'digest'.*log:digest"):
        check_names([Agree("digest")], ["params"], flag="--agree", what="x")
    assert str(Agree.parse("log:loss~1e-06")) == "log:loss~1e-06"


def _change(index: int, at: float, label: str, links: list[dict[str, object]]) -> dict[str, object]:
    return {"index": index, "at_s": at, "applied_s": at, "label": label, "links": links}


BASE = {"delay_us": 1000}
TIMELINE = {
    "changes": [
        _change(0, 0.0, "start", [{"links": ["0->1", "1->0", "0->2", "2->0"], "settings": BASE}]),
        _change(1, 10.0, "phase loss", [{"links": ["0->1", "1->0"], "settings": {"delay_us": 1000, "loss": 20}}]),
        _change(2, 20.0, "phase 1", [{"links": ["0->1", "1->0"], "settings": BASE}]),
        _change(3, 30.0, "partition (churn.events[1])", [{"links": ["0->2", "2->0"], "settings": "cut"}]),
        _change(4, 45.0, "heal (churn.events[1])", [{"links": ["0->2", "2->0"], "settings": BASE}]),
        _change(5, 50.0, "link_down (churn.events[2])", [{"links": ["1->2"], "settings": "cut"}]),
    ],
    "churn": [{"at_s": 5.0, "applied_s": 5.1, "kind": "pause", "nodes": [1]},
              {"at_s": 8.0, "applied_s": 8.1, "kind": "resume", "nodes": [1]},
              {"at_s": 60.0, "applied_s": 60.0, "kind": "kill", "nodes": [2]},
              {"at_s": 65.0, "applied_s": 65.0, "kind": "restart", "nodes": [2]}],
}


def test_fault_windows_pair_each_fault_with_its_end() -> None:
    windows = [(w["kind"], tuple(w["nodes"]), w["at_s"], w["end_s"]) for w in fault_windows(TIMELINE)]
    assert windows == [("pause", (1,), 5.1, 8.1), ("phase", (0, 1), 10.0, 20.0), ("partition", (0, 2), 30.0, 45.0),
                       ("link_down", (1, 2), 50.0, None), ("kill", (2,), 60.0, 65.0)]


def test_recovery_is_the_slowest_survivors_first_line_after_the_end() -> None:
    # rank 0 prints throughout; rank 1 stops during its pause and prints again 0.5 s after it
    rows = [(0, t / 2, {"loss": 1.0}) for t in range(0, 140)] + [(1, t / 2, {"loss": 1.0}) for t in range(0, 10)]
    rows += [(1, 8.6 + t / 2, {"loss": 1.0}) for t in range(0, 120)]
    meta = RunMeta(timeline={"changes": TIMELINE["changes"][:3], "churn": TIMELINE["churn"][:2]}, startup_s=0.0)
    trace = _trace(rows, meta=meta, workers=2)
    pause, phase = fault_events(trace)
    assert pause.kind == "pause" and pause.recovered_after_s == pytest.approx(0.5) and pause.progressed
    assert pause.outcome == "survived"  # rank 0 went on while rank 1 was paused
    assert phase.kind == "phase" and phase.recovered_after_s is not None and phase.progressed


def test_a_fault_after_which_a_survivor_never_printed_never_recovered() -> None:
    meta = RunMeta(timeline={"changes": TIMELINE["changes"][:1], "churn": TIMELINE["churn"][:2]}, startup_s=1.0)
    trace = _trace([(0, t / 2, {"loss": 1.0}) for t in range(0, 6)] + [(1, 0.5, {"loss": 1.0})], meta=meta,
                   workers=2)
    (pause,) = fault_events(trace)  # records on the trace's clock + 1 s of start-up: the last at 3.5 s
    assert pause.recovered_after_s is None and not pause.progressed and pause.outcome == "never recovered"


def test_outcome_says_hung_crashed_diverged_or_what_the_faults_did() -> None:
    hang = Hang(30.0, 1000.0, 12.0, 42.5, 11.9, 2)
    stack = RankStack(1, 0, "hung", 42.0, "wait (x.py:3)", 2, "", "...")
    assert outcome(RunMeta(hang=hang, stacks=(stack,))) == "hung (blocked in wait)"
    runs = (RankRun(0, 0, "budget", None, 9.0, ("going on",)),
            RankRun(2, 0, "exited", 1, 5.0, ("Traceback", "  assert fut._fut", "AssertionError"), ended_s=44.0),
            RankRun(3, 0, "exited", 1, 5.0, ("AssertionError",), ended_s=44.5))
    crashed = outcome(RunMeta(program=ProgramMeta({}, runs), faults=(FaultEvent("kill", (1,), 40.0, 50.0, None),)))
    assert crashed == "crashed (rank 2 (exit code 1): AssertionError; 1 more)"
    assert fault_outcome(RunMeta(program=ProgramMeta({}, runs))) is None  # no fault, no hang: no phrase
    odd = Agreement("params", 0.0, ((0, "a"), (1, "b")), (1,), False, "")
    assert outcome(RunMeta(agreement=(odd,))) == "diverged (params: ranks [1])"
    slow = FaultEvent("pause", (1,), 5.0, 25.0, 3.25, False)
    through = FaultEvent("phase", (0, 1), 30.0, 40.0, 0.1, True)
    assert outcome(RunMeta(faults=(through,))) == "survived"
    assert outcome(RunMeta(faults=(slow, through))) == "recovered after 3.2 s"
    verdict = hang_verdict(RunMeta(hang=hang, stacks=(stack,)))
    assert verdict is not None and verdict.passed is False and "rank 2 printed last, at 11.9 s" in verdict.why
    assert "rank 1: wait (x.py:3)" in verdict.why and hang_verdict(RunMeta()) is None


def test_the_typed_records_round_trip_through_results_json() -> None:
    meta = RunMeta(hang=Hang(5.0, 1000.0, 3.0, 8.5, 2.9, 1), stacks=(RankStack(1, 0, "hung", 8.0, "f (a.py:1)", 3,
                                                                                  "/r/stack.txt", "text"),),
                   faults=(FaultEvent("kill", (2,), 1.0, 3.0, None, False, "kill"),),
                   agreement=(Agreement("params", 0.0, ((0, "a"), (1, 2.5)), (1,), False, "why"),))
    trace = _trace([(0, 1.0, {"loss": 1.0, "params": "abc"})], meta=meta)
    back = trace_from_json(trace_to_json(trace))
    assert back.meta == meta and back.records[0].texts == {"params": "abc"} and back.records[0].value("params") == "abc"


def test_text_figures_are_kept_from_records_and_patterns() -> None:
    (rec,) = step_records(0, [{"step": 1, "wall": 5.0, "loss": 0.5, "params": "ab12", "source": "stdout"}], 0.0)
    assert rec.value("params") == "ab12" and rec.value("loss") == 0.5 and "source" not in rec.texts
    pattern = MetricPattern("params", r"params (\S+)")
    assert pattern.match("params ab12") is None  # a number pattern ignores text
    assert MetricPattern("params", r"params (\S+)", text=True).match("params ab12") == ("ab12", None)
    assert MetricPattern("loss", r"loss (\S+)", text=True).match("loss 0.25") == (0.25, None)


def test_fingerprint_is_equal_for_equal_parameters_only() -> None:
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    assert squall.fingerprint(a) == squall.fingerprint(b) and len(squall.fingerprint(a)) == 16
    with torch.no_grad():
        b.weight[0, 0] += 1e-7
    assert squall.fingerprint(a) != squall.fingerprint(b)
    assert squall.fingerprint([a.weight, a.bias]) != squall.fingerprint([a.bias, a.weight])
    assert len(squall.fingerprint(b"bytes", digits=8)) == 8
    with pytest.raises(TypeError, match="cannot hash"):
        squall.fingerprint(object())


def test_a_dump_py_spy_printed_before_failing_on_a_child_that_is_not_python_is_kept() -> None:
    dump = ("Process 7: python peer.py\nPython v3.11.2 (/usr/bin/python3.11)\n\n"
            'Thread 1 (active): "MainThread"\n    wait (threading.py:320)\n    main (peer.py:80)\n'
            "\n" + "-" * 80 + "\n")
    backtrace = ("Error: Failed to find python version from target process\n\nStack backtrace:\n"
                 "   0: anyhow::error::<impl anyhow::Error>::msg\n   9: std::rt::lang_start::{{closure}}\n  11: main\n")
    kept = read_dump(7, 1, dump, backtrace)
    assert kept.error == "" and kept.text.startswith("Process 7") and "main (peer.py:80)" in kept.text
    assert "(py-spy exit 1 after this dump: Error: Failed to find python version" in kept.text
    failed = read_dump(7, 1, "", backtrace)
    assert failed.text == "" and failed.error == (
        "py-spy could not dump host pid 7 (exit 1): Error: Failed to find python version from target process")
    assert read_dump(7, 1, "", "Permission denied\n").error.endswith("(exit 1): Permission denied")
    assert read_dump(7, 0, dump, "").text == dump
