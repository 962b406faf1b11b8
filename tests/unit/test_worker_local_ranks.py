"""Several ranks per node (squall/worker/local_ranks.py): torchrun's environment and rank arithmetic (pure), and
the launcher on this machine with real processes: each local rank's files, a failing rank stopping its node's
others, the budget. tests/integration/test_programs_nodes.py runs it in the containers."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from squall.job import JobContext, JobSpec, MetricsWriter
from squall.worker.command import CommandError
from squall.worker.local_ranks import (
    MAX_NPROC,
    global_rank,
    node_and_local,
    nproc_of,
    rank_environment,
    run_program,
)
from squall.worker.registry import REGISTRY

PEERS = ("10.9.0.2", "10.9.0.3", "10.9.0.4")
PY = "/usr/bin/python3" if os.geteuid() == 0 and Path("/usr/bin/python3").exists() else "python"
KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "SQUALL_PEERS", "SQUALL_OUT_DIR")


# -- pure -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("node", "nproc", "local", "rank"), [(0, 1, 0, 0), (3, 1, 0, 3), (0, 2, 1, 1), (1, 2, 0, 2),
                                                              (1, 2, 1, 3), (2, 4, 3, 11)])
def test_global_rank_is_node_times_nproc_plus_local_and_back(node: int, nproc: int, local: int, rank: int) -> None:
    assert global_rank(node, nproc, local) == rank
    assert node_and_local(rank, nproc) == (node, local)


def test_a_local_rank_outside_the_node_is_refused() -> None:
    with pytest.raises(ValueError, match=r"local rank 2 is outside 0\.\.1"):
        global_rank(0, 2, 2)


def test_every_rank_of_two_nodes_of_two_gets_torchruns_environment() -> None:
    seen = {}
    for node in range(2):
        for local in range(2):
            env = rank_environment({"PATH": "/bin", "RANK": "stale"}, node=node, nodes=2, nproc=2, local_rank=local,
                                   peers=["a", "b"], master_port=29600, restart=1, out_dir=f"/o{local}",
                                   extra={"MY": "1"})
            seen[(node, local)] = {k: env[k] for k in KEYS}
            assert env["PATH"] == "/bin" and env["MY"] == "1" and env["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert seen[(1, 1)] == {"MASTER_ADDR": "a", "MASTER_PORT": "29600", "RANK": "3", "WORLD_SIZE": "4",
                            "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
                            "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4", "SQUALL_PEERS": "a,b", "SQUALL_OUT_DIR": "/o1"}
    assert sorted(int(e["RANK"]) for e in seen.values()) == [0, 1, 2, 3]
    assert {e["GROUP_RANK"] for (node, _), e in seen.items() if node == 0} == {"0"}


@pytest.mark.parametrize("bad", [0, -1, MAX_NPROC + 1, "2", 1.5, True])
def test_nproc_per_node_must_be_a_whole_number_of_ranks(bad: object) -> None:
    with pytest.raises(CommandError, match=f"nproc_per_node must be an integer in 1..{MAX_NPROC}"):
        nproc_of({"nproc_per_node": bad})
    assert nproc_of({}) == 1 and nproc_of({"nproc_per_node": 3}) == 3


def test_the_command_job_is_the_launcher() -> None:
    assert REGISTRY["command"] == "squall.worker.local_ranks:run_program"


# -- real processes -------------------------------------------------------------------------------------
@pytest.fixture
def folder() -> Iterator[Path]:
    """A program folder nobody can read (the tests may run as root: the program then runs as nobody)."""
    path = Path(tempfile.mkdtemp(prefix="squall-ranks-test-"))
    try:
        path.chmod(0o755)
        (path / "out").mkdir()
        (path / "out").chmod(0o777)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _squall_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    yield


def _run(folder: Path, source: str, *, node: int = 1, **config: Any) -> tuple[dict[str, Any] | BaseException, Path]:
    (folder / "prog.py").write_text(textwrap.dedent(source))
    (folder / "prog.py").chmod(0o644)
    job = folder / "out" / f"job{node}"
    spec = JobSpec(f"j{node}", "command", node, 3, PEERS, str(job),
                   config={"argv": [PY, "prog.py"], "workdir": str(folder), "master_port": 29555, **config})
    job.mkdir()
    with MetricsWriter(job / "metrics.jsonl") as metrics:
        try:
            return run_program(JobContext(spec, job, metrics, time.monotonic())), job
        except CommandError as exc:
            return exc, job


def _local(job: Path, local: int, name: str) -> str:
    return (job / f"local{local}" / name).read_text()


def test_each_local_rank_runs_with_its_environment_and_keeps_its_own_files(folder: Path) -> None:
    result, job = _run(folder, """
        import json, os
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "SQUALL_OUT_DIR"]
        print("env " + json.dumps({k: os.environ[k] for k in keys}), flush=True)
        print(f"step 1 loss {int(os.environ['RANK']) / 10}", flush=True)
        open(os.path.join(os.environ["SQUALL_OUT_DIR"], "mine.txt"), "w").write(os.environ["LOCAL_RANK"])
    """, nproc_per_node=2, metrics={"loss": r"step (?P<step>\d+) loss (?P<value>\S+)"})
    assert isinstance(result, dict), result
    assert result["state"] == "exited" and result["exit_code"] == 0 and result["nproc_per_node"] == 2
    for local in (0, 1):
        env = json.loads(_local(job, local, "stdout.txt").splitlines()[0][4:])
        assert env == {"RANK": str(2 + local), "WORLD_SIZE": "6", "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": "2",
                       "GROUP_RANK": "1", "SQUALL_OUT_DIR": str(job / f"local{local}" / "out")}
        records = [json.loads(line) for line in _local(job, local, "metrics.jsonl").splitlines()]
        assert [(r["step"], r["loss"]) for r in records] == [(1, (2 + local) / 10)]
        assert _local(job, local, "out/mine.txt") == str(local)
        row = json.loads(_local(job, local, "program.json"))
        assert (row["rank"], row["local_rank"], row["node"], row["state"], row["exit_code"]) == (2 + local, local, 1,
                                                                                                 "exited", 0)
    assert (job / "metrics.jsonl").read_text() == ""  # the job's own file: every figure is in a local rank's


def test_a_failing_local_rank_stops_the_others_and_fails_the_job_naming_it(folder: Path) -> None:
    result, job = _run(folder, """
        import os, sys, time
        if os.environ["LOCAL_RANK"] == "1":
            print("rank 1 broke", file=sys.stderr, flush=True)
            sys.exit(4)
        print("waiting", flush=True)
        time.sleep(600)
    """, nproc_per_node=3, node=0)
    assert isinstance(result, CommandError), result
    assert "rank 1 (local rank 1 of node 0)" in str(result) and "exit code 4" in str(result)
    assert "rank 1 broke" in str(result)
    rows = [json.loads(_local(job, local, "program.json")) for local in range(3)]
    assert [r["state"] for r in rows] == ["stopped", "exited", "stopped"]
    assert rows[1]["exit_code"] == 4 and rows[0]["exit_code"] == rows[2]["exit_code"] == -15  # SIGTERM
    summary = json.loads((job / "program.json").read_text())
    assert summary["exit_code"] == 4 and [r["state"] for r in summary["locals"]] == ["stopped", "exited", "stopped"]
    assert rows[0]["duration_s"] < 60  # stopped, not run to the end of its sleep


def test_a_rank_that_finishes_early_leaves_the_others_running_to_the_end(folder: Path) -> None:
    result, job = _run(folder, """
        import os, time
        time.sleep(0.0 if os.environ["LOCAL_RANK"] == "0" else 1.0)
        print("done", os.environ["LOCAL_RANK"], flush=True)
    """, nproc_per_node=2)
    assert isinstance(result, dict) and result["state"] == "exited"
    assert [_local(job, k, "stdout.txt") for k in (0, 1)] == ["done 0\n", "done 1\n"]


def test_the_budget_stops_every_local_rank_even_one_that_ignores_sigterm(folder: Path) -> None:
    result, job = _run(folder, """
        import os, signal, time
        if os.environ["LOCAL_RANK"] == "1":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("step 1 loss 2.0", flush=True)
        time.sleep(600)
    """, nproc_per_node=2, seconds=1.0)
    assert isinstance(result, dict) and result["state"] == "budget" and result["exit_code"] == 0
    rows = [json.loads(_local(job, k, "program.json")) for k in (0, 1)]
    assert [(r["state"], r["exit_code"]) for r in rows] == [("budget", -15), ("budget", -9)]
