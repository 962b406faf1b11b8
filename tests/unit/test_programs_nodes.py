"""Several ranks per node on the host side (pure): a node's run split into its ranks' runs, the trace's nodes and
ranks, bytes per node and inside it, every consumer (--json, measures, recovery, report) reading kernel bytes
per node, and ``nproc_per_node`` refused when it is nonsense."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from squall.checks.measures import BYTES_SENT, measure
from squall.checks.recovery import fault_events
from squall.cluster.netdev import LoopbackMeter, NetDevError, parse_net_dev
from squall.cluster.stacks import HostProcess, rank_pid
from squall.experiment.matrix import MatrixError, load_matrix_file
from squall.programs.node_runs import split_node_run
from squall.programs.result import ProgramResult, result_json
from squall.programs.spec import MAX_NPROC, ProgramError, program_from_args, program_from_mapping
from squall.programs.verdict import judge
from squall.report.programs import link_matrix, node_lines, ranks_rows
from squall.run_meta import LinkCount, NodeBytes, ProgramMeta, RankRun, RunMeta
from squall.run_trace import RunTrace, build_trace, trace_from_json, trace_to_json
from squall.target import Target

LOGS = ["/l/rank2", "/l/rank3"]


# -- a node's run, split --------------------------------------------------------------------------------
def test_a_node_that_ended_by_itself_gives_each_rank_its_own_end() -> None:
    node = RankRun(1, 0, "exited", 4, 3.0, ("boom",), "", 9.5)
    rows = [{"state": "stopped", "exit_code": -15, "duration_s": 2.5, "stderr_tail": []},
            {"state": "exited", "exit_code": 4, "duration_s": 2.0, "stderr_tail": ["boom"]}]
    runs = split_node_run(node, 2, rows, LOGS)
    assert [(r.rank, r.state, r.exit_code, r.duration_s, r.logs, r.ended_s) for r in runs] == [
        (2, "stopped", -15, 2.5, "/l/rank2", 9.5), (3, "exited", 4, 2.0, "/l/rank3", 9.5)]
    assert [r.failed for r in runs] == [False, True] and runs[1].stderr_tail == ("boom",)


@pytest.mark.parametrize("state", ["killed", "lost", "stopped", "hung"])
def test_a_node_ended_from_outside_ends_every_rank_alike(state: str) -> None:
    node = RankRun(1, 2, state, None, 3.0, ("tail",), "", 9.5)
    runs = split_node_run(node, 2, [{"state": "exited", "exit_code": 0}], LOGS)
    assert [(r.rank, r.restart, r.state) for r in runs] == [(2, 2, state), (3, 2, state)]
    assert runs[0].stderr_tail == ("tail",) and runs[1].stderr_tail == ()


def test_a_rank_the_launcher_never_started_is_an_error_and_the_logs_must_match() -> None:
    runs = split_node_run(RankRun(0, 0, "exited", 0, 1.0), 2, [{"state": "exited", "exit_code": 0}], LOGS)
    assert [(r.state, r.failed) for r in runs] == [("exited", False), ("error", True)]
    with pytest.raises(ValueError, match="1 log folders for 2 local ranks"):
        split_node_run(RankRun(0, 0, "exited", 0, 1.0), 2, [], LOGS[:1])


# -- the trace of 2 nodes x 2 ranks ---------------------------------------------------------------------
def _trace(**meta: object) -> tuple[RunTrace, tuple[RankRun, ...]]:
    """2 nodes x 2 ranks: ranks 0, 1 on node 0 and 2, 3 on node 1; each record carries its node's bytes."""
    per = [[{"step": 1, "wall": 101.0 + r / 10, "loss": 2.0, "bytes_sent": 100 * (1 + r // 2)},
            {"step": 2, "wall": 103.0 + r / 10, "loss": 0.9, "bytes_sent": 300 * (1 + r // 2)}] for r in range(4)]
    runs = tuple(RankRun(r, 0, "exited", 0, 5.0, logs=f"/l/rank{r}") for r in range(4))
    links = (LinkCount(0, 1, 1000, 10, 0), LinkCount(1, 0, 3000, 20, 1))
    base = RunMeta(links=links, nproc_per_node=2, loopback=(5000, None),
                   program=ProgramMeta(spec={"metrics": {"loss": "loss (\\S+)"}, "nproc_per_node": 2}, runs=runs))
    return build_trace(protocol="ddp", profile="lan", seed=0, backend="nfqueue", per_worker=per, start_wall=100.0,
                       meta=base if not meta else RunMeta(**{**base.__dict__, **meta})), runs


def test_the_trace_holds_global_ranks_and_knows_their_nodes() -> None:
    trace, _ = _trace()
    assert (trace.workers, trace.nodes) == (4, 2)
    assert [trace.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert trace.meta.node_bytes(trace.nodes) == (NodeBytes(0, (0, 1), 1000, 3000, 5000),
                                                   NodeBytes(1, (2, 3), 3000, 1000, None))
    again = trace_from_json(json.loads(json.dumps(trace_to_json(trace))))
    assert again.meta.nproc_per_node == 2 and again.meta.loopback == (5000, None) and again.nodes == 2


def test_a_trace_of_one_rank_per_node_reads_as_before() -> None:
    trace = build_trace(protocol="p", profile="lan", seed=0, backend="none",
                        per_worker=[[{"step": 1, "wall": 1.0}]] * 3, start_wall=0.0)
    assert (trace.workers, trace.nodes, trace.node_of(2)) == (3, 3, 2)
    assert RunMeta.from_json({}).nproc_per_node == 1 and RunMeta.from_json({}).loopback == ()


def test_json_gives_bytes_per_node_and_each_nodes_ranks_and_inside_bytes() -> None:
    trace, runs = _trace()
    target = Target.parse("loss<=1.0")
    obj = result_json(trace, judge(trace, runs, target=target), target=target)
    assert obj["verdict"] == "pass" and obj["workers"] == 2 and obj["nproc_per_node"] == 2
    assert [r["rank"] for r in obj["ranks"]] == [0, 1, 2, 3]
    assert obj["bytes_sent"] == [1000, 3000] and obj["bytes_received"] == [3000, 1000]
    assert obj["nodes"] == [{"node": 0, "ranks": [0, 1], "sent": 1000, "received": 3000, "inside": 5000},
                            {"node": 1, "ranks": [2, 3], "sent": 3000, "received": 1000, "inside": None}]
    assert obj["bytes_to_target"] == [300, 300, 600, 600]  # each rank's record carries its node's count
    result = ProgramResult(trace, judge(trace, runs, target=target), target, runs)
    assert result.bytes_sent == [1000, 3000] and result.nodes[0].inside == 5000


def test_the_bytes_a_rank_sent_is_its_nodes_count_in_the_measures_and_the_report() -> None:
    trace, _ = _trace()
    sent = measure(trace, target=None, figures=(), budget_s=10.0)[BYTES_SENT]
    assert sent.value == pytest.approx((1000 + 1000 + 3000 + 3000) / 4)
    rows = ranks_rows(trace)
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
    assert [row[5] for row in rows] == ["1 KB", "1 KB", "3 KB", "3 KB"]
    head, matrix = link_matrix(trace)
    assert head == ["from \\ to", "0", "1"] and len(matrix) == 2 and matrix[1][1] == "3 KB (1 dropped)"
    assert node_lines(trace)[0].startswith("node 0 (ranks 0, 1): 1 KB sent to other nodes, 3 KB received")
    assert "inside not read" in node_lines(trace)[1]


def test_a_kill_strikes_a_nodes_ranks_and_the_others_must_go_on_through_it() -> None:
    timeline = {"changes": [], "churn": [{"at_s": 1.0, "applied_s": 1.0, "kind": "kill", "nodes": [1]},
                                         {"at_s": 10.0, "applied_s": 10.0, "kind": "restart", "nodes": [1]}]}
    per = [[{"step": s, "wall": 100.0 + s} for s in range(1, 13)] if r < 2 else
           [{"step": 1, "wall": 100.5}, {"step": 2, "wall": 111.0}] for r in range(4)]
    trace = build_trace(protocol="ddp", profile="lan", seed=0, backend="none", per_worker=per, start_wall=100.0,
                        meta=RunMeta(nproc_per_node=2, timeline=timeline))
    (fault,) = fault_events(trace)
    assert fault.kind == "kill" and fault.nodes == (1,)
    assert fault.progressed  # ranks 0 and 1 (node 0) printed through it; 2 and 3 were on the killed node


# -- bad input ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -2, MAX_NPROC + 1, True, 1.5, "2"])
def test_nproc_per_node_nonsense_is_refused_naming_the_flag_or_key(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ProgramError, match=f"--nproc-per-node: ranks per node must be an integer in 1..{MAX_NPROC}"):
        program_from_args(["python", "x.py"], cwd=tmp_path, nproc_per_node=bad)  # type: ignore[arg-type]
    with pytest.raises(ProgramError, match=r"m.yaml: programs\[0\]: nproc_per_node: ranks per node"):
        program_from_mapping({"command": ["python"], "nproc_per_node": bad}, source="m.yaml: programs[0]",
                             base=tmp_path)


def test_nproc_per_node_reaches_the_spec_and_its_record(tmp_path: Path) -> None:
    spec = program_from_mapping({"command": ["python", "t.py"], "nproc_per_node": 2}, source="m", base=tmp_path)
    assert spec.nproc_per_node == 2 and spec.to_json()["nproc_per_node"] == 2
    assert program_from_args(["python", "t.py"], cwd=tmp_path).nproc_per_node == 1


# -- loopback counters and a local rank's process -------------------------------------------------------
NET_DEV = "\n".join([
    "Inter-|   Receive                                                |  Transmit",
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier",
    "    lo:   10280      10    0    0    0     0          0         0    10280      10    0    0    0     0       0 0",
    "  eth0: 9999 7 0 0 0 0 0 0 1234 5 0 0 0 0 0 0", ""])


def test_net_dev_rows_are_read_and_a_broken_one_is_refused() -> None:
    assert parse_net_dev(NET_DEV) == {"lo": (10280, 10280), "eth0": (9999, 1234)}
    with pytest.raises(NetDevError, match="not a /proc/net/dev row"):
        parse_net_dev(NET_DEV + "  eth1: 1 2 3\n")


def test_the_loopback_meter_banks_what_a_killed_namespace_counted() -> None:
    counters = {0: 100, 1: 50}

    def read(node: int) -> int:
        if counters[node] < 0:
            raise NetDevError("gone")
        return counters[node]

    meter = LoopbackMeter(read, 2)
    meter.start()
    counters.update({0: 400, 1: 80})
    meter.before_kill(1)  # node 1 counted 30, then its namespace goes
    meter.restarted(1)
    counters.update({0: 1000, 1: 7})  # node 1's new namespace started from zero
    assert meter.finish() == (900, 37)
    counters[0] = -1
    assert meter.finish()[0] is None and meter.errors == ["node 0: gone"]


def test_a_local_ranks_process_is_found_by_its_local_rank() -> None:
    procs = [HostProcess(10, 1, 1, 0, "agent"), HostProcess(20, 10, 2, 0, "job"),
             HostProcess(31, 20, 3, 65534, "python t.py", 0), HostProcess(32, 20, 4, 65534, "python t.py", 1),
             HostProcess(40, 31, 5, 65534, "python -c worker", 0)]
    assert rank_pid(procs, 1, 2) == 31
    assert rank_pid(procs, 1, 2, local_rank=1) == 32
    assert rank_pid(procs, 1, 2, local_rank=2) is None


# -- matrices -------------------------------------------------------------------------------------------
def _matrix_file(tmp_path: Path, text: str) -> Path:
    (tmp_path / "t.py").write_text("")
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


def test_a_matrix_run_gives_its_ranks_per_node_to_programs_that_set_none(tmp_path: Path) -> None:
    path = _matrix_file(tmp_path, """
programs:
  - {name: a, command: [python, t.py]}
  - {name: b, command: [python, t.py], nproc_per_node: 1}
profiles: [lan]
workers: [2]
run: {seconds: 5, nproc_per_node: 2}
""")
    spec = load_matrix_file(path, known_protocols=["ring"])
    assert [p.nproc_per_node for p in spec.matrix.programs] == [2, 1]
    assert "nproc_per_node" not in spec.run and spec.nproc_per_node == 2
    assert spec.matrix.ids() == ["a-lan-w2x2", "b-lan-w2"]


@pytest.mark.parametrize(("text", "says"), [
    ("protocols: [ring]\nprofiles: [lan]\nworkers: [2]\nrun: {nproc_per_node: 2}\n",
     "run: nproc_per_node: only programs run several ranks per node"),
    ("programs: [{command: [python, t.py]}]\nprofiles: [lan]\nworkers: [2]\nrun: {nproc_per_node: 0}\n",
     "m.yaml: run: nproc_per_node: ranks per node must be an integer in 1..64, got 0"),
    ("programs: [{command: [python, t.py], nproc_per_node: two}]\nprofiles: [lan]\nworkers: [2]\n",
     r"programs\[0\]: nproc_per_node: ranks per node must be an integer"),
])
def test_a_matrix_with_nonsense_ranks_per_node_is_refused_naming_the_key(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(MatrixError, match=says):
        load_matrix_file(_matrix_file(tmp_path, text), known_protocols=["ring"])
