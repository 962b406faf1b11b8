"""The ``command`` job on this machine, with real processes: environment, figures, files, failures, budget
(squall/worker/command.py). In the containers it runs the same way; tests/integration/test_programs.py
runs it there."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from squall.job import JobContext, JobSpec, MetricsWriter
from squall.worker.command import (
    KILL_AFTER_S,
    CommandConfig,
    CommandError,
    program_environment,
    resolve_argv,
    run_command,
)

PEERS = ("10.9.0.2", "10.9.0.3", "10.9.0.4")
#: The interpreter the programs run with here. As root the runner drops to nobody, who cannot reach this
#: virtualenv's python (under /root); the system python3 runs them instead (in the containers, ``python``
#: is the image's, which everyone may run).
PY = "/usr/bin/python3" if os.geteuid() == 0 and Path("/usr/bin/python3").exists() else "python"


@pytest.fixture
def folder() -> Iterator[Path]:
    """A program folder the program's user can reach and read (it runs as nobody when the tests run as root;
    pytest's own tmp_path is under a folder only root may enter). Removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="squall-command-test-"))
    try:
        path.chmod(0o755)
        (path / "out").mkdir()
        (path / "out").chmod(0o777)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _run(folder: Path, source: str, **config: Any) -> tuple[dict[str, Any] | BaseException, Path]:
    (folder / "prog.py").write_text(textwrap.dedent(source))
    (folder / "prog.py").chmod(0o644)
    job = folder / "out" / "job"
    spec = JobSpec("j0001", "command", 1, 3, PEERS, str(job),
                   config={"argv": [PY, "prog.py"], "workdir": str(folder), "master_port": 29555, **config})
    job.mkdir()
    with MetricsWriter(job / "metrics.jsonl") as metrics:
        ctx = JobContext(spec, job, metrics, time.monotonic())
        try:
            return run_command(ctx), job
        except CommandError as exc:
            return exc, job


@pytest.fixture(autouse=True)
def _squall_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The program imports squall (as in the containers, where the code is on PYTHONPATH)."""
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", root)
    yield


def test_the_program_gets_torchruns_environment_and_its_figures_become_records(folder: Path) -> None:
    result, job = _run(folder, """
        import json, os
        from squall import log
        keys = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "GLOO_SOCKET_IFNAME", "SQUALL_PEERS", "TORCHELASTIC_RESTART_COUNT", "SQUALL_OUT_DIR"]
        print("env " + json.dumps({k: os.environ.get(k) for k in keys} | {"uid": os.getuid(), "cwd": os.getcwd()}))
        for step in (1, 2):
            print(f"step {step} loss {1.0 / step}", flush=True)
        log(step=7, loss=0.25, tokens=1e3)
        print("@squall {broken", flush=True)
        open(os.path.join(os.environ["SQUALL_OUT_DIR"], "model.txt"), "w").write("saved")
    """, metrics={"loss": r"step (?P<step>\d+) loss (?P<value>\S+)"}, restart=2)
    assert isinstance(result, dict), result
    assert result["state"] == "exited" and result["exit_code"] == 0 and result["records"] == 3
    stdout = (job / "stdout.txt").read_text()
    env = json.loads(stdout.splitlines()[0][4:])
    assert env["MASTER_ADDR"] == PEERS[0] and env["MASTER_PORT"] == "29555" and env["RANK"] == "1"
    assert env["WORLD_SIZE"] == "3" and env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"
    assert env["GROUP_RANK"] == "1" and env["GLOO_SOCKET_IFNAME"] == "eth0" and env["SQUALL_PEERS"] == ",".join(PEERS)
    assert env["TORCHELASTIC_RESTART_COUNT"] == "2" and env["cwd"] == str(folder)
    assert env["uid"] == (65534 if os.geteuid() == 0 else os.geteuid())  # root's programs run as nobody
    assert (job / "out" / "model.txt").read_text() == "saved"
    records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"], r["source"]) for r in records] == [(1, 1.0, "stdout"), (2, 0.5, "stdout"),
                                                                     (7, 0.25, "log")]
    assert records[2]["tokens"] == 1000.0 and all(r["wall"] > 0 for r in records)
    assert "line 5 of stdout ignored: log record is not JSON" in (job / "stderr.txt").read_text()
    assert json.loads((job / "program.json").read_text())["rejected"] == 1


def test_a_failing_program_fails_the_job_with_its_rank_code_and_stderr(folder: Path) -> None:
    result, job = _run(folder, """
        import sys
        print("working", flush=True)
        print("something broke", file=sys.stderr)
        sys.exit(3)
    """)
    assert isinstance(result, CommandError)
    assert f"rank 1: {PY} prog.py exited with exit code 3" in str(result) and "something broke" in str(result)
    summary = json.loads((job / "program.json").read_text())
    assert summary["state"] == "exited" and summary["exit_code"] == 3 and summary["stderr_tail"] == ["something broke"]


def test_the_budget_is_hard_even_for_a_program_that_ignores_sigterm(folder: Path) -> None:
    t0 = time.monotonic()
    result, _ = _run(folder, """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("step 1 loss 2.0", flush=True)
        time.sleep(600)
    """, seconds=1.0)
    took = time.monotonic() - t0
    assert isinstance(result, dict) and result["state"] == "budget" and result["exit_code"] == -9
    assert took < 1.0 + KILL_AFTER_S + 3.0, took  # SIGTERM at the budget, SIGKILL after the grace


def test_a_missing_command_and_a_bad_config_are_clear_errors(folder: Path) -> None:
    (folder / "prog.py").write_text("")
    job = folder / "out" / "job2"
    job.mkdir()
    spec = JobSpec("j0002", "command", 0, 1, PEERS[:1], str(job),
                   config={"argv": ["no-such-binary-xyz"], "workdir": str(folder)})
    with MetricsWriter(job / "metrics.jsonl") as metrics, pytest.raises(CommandError, match="cannot start"):
        run_command(JobContext(spec, job, metrics, time.monotonic()))
    assert json.loads((job / "program.json").read_text())["state"] == "error"
    for config, says in (({"argv": "python x.py"}, "argv must be a non-empty list"),
                         ({"argv": ["x"], "master_port": 80}, "master_port must be an integer in 1024..65535"),
                         ({"argv": ["x"], "seconds": 0}, "seconds must be a number > 0"),
                         ({"argv": ["x"], "metrics": {"loss": "("}}, "config metrics: metric 'loss'"),
                         ({"argv": ["x"], "workdir": "rel"}, "workdir must be an absolute path")):
        with pytest.raises(CommandError, match=says):
            CommandConfig.from_json(config)


def test_python_is_this_interpreter_and_the_environment_is_torchruns() -> None:
    assert resolve_argv(["python", "t.py"]) == [sys.executable, "t.py"]
    assert resolve_argv(["python3", "-u", "t.py"])[0] == sys.executable
    assert resolve_argv(["bash", "run.sh"]) == ["bash", "run.sh"]
    env = program_environment({"PATH": "/bin", "RANK": "stale"}, rank=2, world_size=4, peers=["a", "b", "c", "d"],
                              master_port=29600, restart=0, out_dir="/o", extra={"MY": "1"})
    assert env["RANK"] == "2" and env["MASTER_ADDR"] == "a" and env["PATH"] == "/bin" and env["MY"] == "1"
    assert env["ROLE_WORLD_SIZE"] == "4" and env["PYTHONUNBUFFERED"] == "1"
