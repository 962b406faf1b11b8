"""The agent and the worker as real local processes (no Docker): jobs, waits, cancels, bad input."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from squall.cluster.agent_client import AgentClient
from squall.cluster.errors import JobError
from squall.job import JobSpec, JobSpecError
from squall.worker.agent import MAX_REQUEST, Agent
from squall.worker.commands import AgentCommand
from squall.worker.process import EXIT_BAD_SPEC, EXIT_FAILED, EXIT_OK, run_job

REPO = Path(__file__).resolve().parents[2]


def spec(out: Path, entry: str = "noop", job_id: str = "j1", **extra: Any) -> dict[str, Any]:
    return {"job_id": job_id, "entry": entry, "rank": 0, "world_size": 1, "peers": ["127.0.0.1"],
            "out_dir": str(out / job_id), **extra}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentClient]:
    sock = Path(f"/tmp/sq-agent-{os.getpid()}-{time.monotonic_ns()}.sock")
    proc = subprocess.Popen([sys.executable, "-m", "squall.worker.agent", "--socket", str(sock)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.DEVNULL)
    client = AgentClient(sock)
    try:
        assert client.wait_ready(time.monotonic() + 20) is not None, "agent did not come up"
        yield client
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        assert not sock.exists(), "the agent must remove its socket on exit"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rank": 3}, "rank must be in"),
        ({"world_size": 0}, "world_size must be >= 1"),
        ({"peers": []}, "peers must list 1 addresses"),
        ({"job_id": "../etc"}, "job_id"),
        ({"entry": "os.system('x')"}, "entry"),
        ({"deadline_s": -1}, "deadline_s must be > 0"),
        ({"rank": "0"}, "'rank' must be int"),
        ({"surprise": 1}, "unknown keys"),
    ],
)
def test_job_spec_rejects_bad_fields(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(JobSpecError, match=message):
        JobSpec.from_json({**spec(tmp_path), **change})


def test_worker_runs_an_entry_and_writes_its_result(tmp_path: Path) -> None:
    assert run_job(spec(tmp_path, "sleep", config={"seconds": 0.01})) == EXIT_OK
    result = json.loads((tmp_path / "j1" / "result.json").read_text())
    assert result["ok"] and result["value"] == {"slept_s": 0.01}


def test_worker_reports_failures_and_unknown_entries(tmp_path: Path) -> None:
    assert run_job(spec(tmp_path, "fail", job_id="a", config={"message": "boom"})) == EXIT_FAILED
    assert json.loads((tmp_path / "a" / "result.json").read_text())["error"] == "RuntimeError: boom"
    assert run_job(spec(tmp_path, "no_such_protocol", job_id="b")) == EXIT_BAD_SPEC
    assert "registered:" in json.loads((tmp_path / "b" / "result.json").read_text())["error"]
    assert run_job({"job_id": 1}) == EXIT_BAD_SPEC


def test_agent_runs_jobs_one_after_another(agent: AgentClient, tmp_path: Path) -> None:
    pids = set()
    for k in range(3):
        answer = agent.checked({"cmd": "run", "job": spec(tmp_path, job_id=f"n{k}")})
        pids.add(answer["pid"])
        done = agent.checked({"cmd": "wait", "job_id": f"n{k}", "timeout": 10})
        assert done["state"] == "done" and done["exit_code"] == 0
    assert len(pids) == 3  # each job in its own forked process
    ping = agent.checked({"cmd": "ping"})
    assert ping["running"] == 0


def test_agent_wait_times_out_and_cancel_kills(agent: AgentClient, tmp_path: Path) -> None:
    agent.checked({"cmd": "run", "job": spec(tmp_path, "sleep", config={"seconds": 60})})
    # the job sleeps 60 s: a wait that did not time out would return only when it is done
    assert agent.checked({"cmd": "wait", "job_id": "j1", "timeout": 0.3})["state"] == "running"
    cancelled = agent.checked({"cmd": "cancel", "job_id": "j1"})
    assert cancelled["state"] == "done" and cancelled["exit_code"] == -9


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"cmd": "explode"}, "unknown command 'explode'; known: ping, run, wait, cancel, shutdown"),
        ({"cmd": "wait", "job_id": "nope"}, "no job"),
        ({"cmd": "run", "job": {"entry": "noop"}}, "lacks"),
        ({"nocmd": 1}, "bad request: a request needs a string 'cmd', got None; known: ping"),
    ],
)
def test_agent_refuses_bad_requests(agent: AgentClient, request_: dict[str, Any], message: str) -> None:
    with pytest.raises(JobError, match=message):
        agent.checked(request_)
    assert agent.ping() is not None  # and keeps serving


def test_agent_refuses_a_duplicate_job_id(agent: AgentClient, tmp_path: Path) -> None:
    agent.checked({"cmd": "run", "job": spec(tmp_path)})
    with pytest.raises(JobError, match="already started"):
        agent.checked({"cmd": "run", "job": spec(tmp_path)})


def test_every_command_has_one_handler(tmp_path: Path) -> None:
    """The dispatch table covers the enumeration exactly: a new command without a handler fails here."""
    sock = Path(f"/tmp/sq-agent-{os.getpid()}-{time.monotonic_ns()}.sock")
    served = Agent(sock, [])
    try:
        assert set(served.handlers) == set(AgentCommand)
    finally:
        served.sel.close()
        served.server.close()
        sock.unlink()


def _raw(client: AgentClient, data: bytes) -> bytes:
    """What the agent answers to ``data`` sent as is on a fresh connection (it closes after an oversize line)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(str(client.socket_path))
        sock.sendall(data)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


def test_agent_answers_a_malformed_or_oversize_line_and_keeps_serving(agent: AgentClient) -> None:
    malformed = json.loads(_raw(agent, b"{not json\n"))
    assert malformed["ok"] is False and malformed["error"].startswith("bad request: not JSON")
    assert "expected a JSON object, got list" in json.loads(_raw(agent, b"[1]\n"))["error"]
    too_long = json.loads(_raw(agent, b"x" * (MAX_REQUEST + 2)))
    assert too_long == {"ok": False, "error": f"request longer than {MAX_REQUEST} bytes"}
    assert agent.ping() is not None
