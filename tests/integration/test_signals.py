"""SIGINT and SIGTERM sent to ``squall run``'s main process only (as ``kill`` and CI runners do) stop it
promptly and cleanly: the jobs are cancelled, everything is torn down, the process says so and
exits with the documented code (130, 143), and nothing is left: no container, network, state
directory, nfqueue daemon or work directory of the run, no helper process.

Both signals, during start-up (containers being created, agents not ready yet) and during training
(steps under way). Before the fix a signal during training waited for the job's whole budget
(22-27 s for a 20 s run); the run here has a 60 s budget, so a stop that waited for the job fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from squall.cluster.gc import collect
from squall.cluster.ownership import LABEL_PID, LABEL_RUN, state_root
from squall.protocols.allreduce.protocol import LOCAL_SGD

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]
#: Seconds from the signal to the process's exit. The goal is 2 s (teardown of 4 containers); a loaded
#: 2-core host has taken longer to remove containers, and the bug this guards against took the job's budget.
STOP_LIMIT_S = 10.0
BUDGET_S = 60  # the run's training budget: a stop that waits for the job takes about this long


class Run:
    """``squall run`` in a child process, its stderr read line by line on a thread."""

    def __init__(self) -> None:
        env = {**os.environ, "SQUALL_PROGRESS": "plain", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "squall.cli.main", "run", "--protocol", LOCAL_SGD, "--profile", "wan-5ms",
             "--workers", "4", "--seconds", str(BUDGET_S), "--report", "/tmp/squall-test-signals-report"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            # as a CI runner starts it: SIGINT is not ignored by inheritance here, the CLI installs its own
            start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, what: str, cond: Callable[[], bool], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                pytest.fail(f"squall run exited ({self.proc.returncode}) before {what}:\n{self.text[-3000:]}")
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"no {what} within {timeout} s:\n{self.text[-3000:]}")
            time.sleep(0.05)


def _ours(client: Any, pid: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Containers and networks owned by process ``pid``, as the engine lists them (the low-level list:
    the high-level one inspects each container and fails on one removed in between)."""
    flt = {"label": f"{LABEL_PID}={pid}"}
    return client.api.containers(all=True, filters=flt), client.api.networks(filters=flt)


def _training_step(run: Run) -> bool:
    return any(": training: step " in line for line in run.lines)


@pytest.mark.parametrize("phase", ["startup", "training"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_main_process_stops_the_run_and_leaves_nothing(
        docker_client: Any, worker_image: str, sig: signal.Signals, phase: str) -> None:
    run = Run()
    pid = run.proc.pid
    try:
        run.wait_for("container", lambda: bool(_ours(docker_client, pid)[0]))
        run_id = _ours(docker_client, pid)[0][0]["Labels"][LABEL_RUN]
        if phase == "training":
            run.wait_for("training step on the progress lines", lambda: _training_step(run))
        helpers = [p for p in psutil.Process(pid).children(recursive=True)]
        sent = time.monotonic()
        os.kill(pid, sig)  # the main process only, not its group
        code = run.proc.wait(timeout=BUDGET_S + 60)
        took = time.monotonic() - sent
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    run._reader.join(timeout=10)
    print(f"{sig.name} during {phase}: exit {code} {took:.2f} s after the signal")
    assert code == 128 + sig, run.text[-3000:]
    assert took < STOP_LIMIT_S, f"stopping took {took:.1f} s:\n{run.text[-3000:]}"
    assert f"squall: {sig.name} received: cancelling the jobs and tearing down" in run.text
    assert f"squall: stopped by {sig.name}: jobs cancelled and everything torn down in" in run.text
    if phase == "startup":
        assert ": training" not in run.text, "the signal came too late to test start-up"
    else:
        assert ": teardown" in run.text
    # nothing left: containers, networks, state directory, host-side shaping helpers, child processes
    assert _ours(docker_client, pid) == ([], [])
    assert not (state_root() / run_id).exists()
    leftover = collect(docker_client, dry_run=True)
    assert not [d for d in leftover.removed_dirs + leftover.removed_workdirs if run_id in d], leftover
    alive = [p.pid for p in helpers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"helper processes of the run still alive: {alive}"
