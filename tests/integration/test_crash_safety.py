"""Crash safety, measured: a run killed mid-cell, or whose Docker engine restarts, leaves nothing after gc.

What a run puts on the host, and how each test looks for it after ``squall gc``:

* containers and the network (labels ``squall.run=<run id>``);
* with the network, Docker's host iptables rules and its bridge ``br-<id>`` with one veth per
  container (and their qdiscs): every ``iptables-save`` line, link and ``tc qdisc`` line that
  names the run's bridge, veths, subnet or chains;
* the nfqueue delay daemon and every other process the run started (pids and start times read
  while it trained), and any process whose command line names the run;
* the run's state directory and the shaper's work directory (``<tmp>/squall-nfq-<run id>-*``).

The engine-restart test stops ``dockerd`` (every container on the machine dies with it), so on a
developer's machine it runs only when no other run's containers are up; under ``CI=true`` (tests
run one at a time) it always runs. The engine is started again in a ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from squall.cluster.engine import in_ci
from squall.cluster.ownership import state_root
from squall.shaping.nfqueue.leftovers import WORKDIR_PREFIX

from .conftest import labelled

pytestmark = [pytest.mark.docker, pytest.mark.slow]
logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
SQUALL = [sys.executable, "-m", "squall.cli.main"]
TRAINING_TIMEOUT_S = 240.0  # cluster start (4 containers, torch imports on 2 cores) + the first metrics
GC_TIMEOUT_S = 120.0
FAIL_TIMEOUT_S = 120.0  # the run must fail this soon after the engine stopped; longer is a hang
ENGINE_TIMEOUT_S = 90.0


# -- the host, seen from outside ------------------------------------------------------------------
def _lines(argv: list[str]) -> list[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}"
    return proc.stdout.splitlines()


def _iptables() -> list[str]:
    return [line for line in _lines(["iptables-save"]) if not line.startswith("#")]


def _links() -> list[str]:
    return _lines(["ip", "-o", "link", "show"])


def _qdiscs() -> list[str]:
    return _lines(["tc", "qdisc", "show"])


@dataclass
class Footprint:
    """What one run holds on the host while it trains."""

    run_id: str
    state_dir: Path
    bridge: str  # the Docker network's host bridge, br-<12 hex digits>
    subnet: str  # the network's subnet, as iptables prints it
    veths: list[str]  # host ends of the containers' veths
    processes: list[tuple[int, float]]  # (pid, start time) of every process the run started
    daemons: int  # how many of them are nfqueue delay daemons

    def names(self) -> list[str]:
        """Strings whose presence in a host listing means the run left something."""
        return [self.bridge, self.subnet, f"SQUALL-{self.run_id}", *self.veths]


def _footprint(client: Any, run_id: str, state_dir: Path, owner: int) -> Footprint:
    (network,) = labelled(client, run_id)[1]
    network.reload()
    bridge = f"br-{network.id[:12]}"
    subnet = network.attrs["IPAM"]["Config"][0]["Subnet"]
    veths = [line.split(":")[1].strip().split("@")[0] for line in _links() if f" master {bridge} " in line]
    children = psutil.Process(owner).children(recursive=True)
    processes = [(p.pid, p.create_time()) for p in [psutil.Process(owner), *children]]
    daemons = sum("squall.shaping.nfqueue.cli" in " ".join(p.cmdline()) for p in children)
    return Footprint(run_id, state_dir, bridge, subnet, veths, processes, daemons)


def _same_process(pid: int, start: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - start) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def left_behind(client: Any, fp: Footprint) -> dict[str, list[str]]:
    """Everything of the run still on the host, by kind (empty lists: nothing)."""
    containers, networks = labelled(client, fp.run_id)
    mine = fp.names()
    named = [p for p in psutil.process_iter(["pid", "cmdline"]) if fp.run_id in " ".join(p.info["cmdline"] or [])]
    return {
        "containers": [c.name for c in containers],
        "networks": [n.name for n in networks],
        "iptables rules": [line for line in _iptables() if any(n in line for n in mine)],
        "links": [line for line in _links() if any(f" {n}:" in line or f" {n}@" in line for n in mine)],
        "qdiscs": [line for line in _qdiscs() if any(f" dev {n} " in line for n in mine)],
        "processes": [str(pid) for pid, start in fp.processes if _same_process(pid, start)]
        + [f"{p.pid} {' '.join(p.info['cmdline'])[:120]}" for p in named],
        "state dirs": [str(fp.state_dir)] if fp.state_dir.exists() else [],
        "nfqueue work dirs": [str(p) for p in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}{fp.run_id}-*")],
    }


def _counts(left: dict[str, list[str]]) -> dict[str, int]:
    return {kind: len(items) for kind, items in left.items()}


# -- a run as a user starts it --------------------------------------------------------------------
@dataclass
class Squall:
    """A ``squall`` command running in its own process group, stderr to a file."""

    proc: subprocess.Popen[bytes]
    stderr: Path

    @classmethod
    def start(cls, args: list[str], tmp_path: Path) -> Squall:
        stderr = tmp_path / "squall.stderr"
        with open(stderr, "wb") as err:
            proc = subprocess.Popen([*SQUALL, *args], cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err, start_new_session=True, env=dict(os.environ))
        return cls(proc, stderr)

    def text(self) -> str:
        return self.stderr.read_text(errors="replace")

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def wait_training(run: Squall, before: set[str], workers: int) -> tuple[str, Path]:
    """Wait until every worker of the run's first job wrote a metrics record; return run id and state dir."""
    root = state_root()
    deadline = time.monotonic() + TRAINING_TIMEOUT_S
    while time.monotonic() < deadline:
        if run.proc.poll() is not None:
            pytest.fail(f"squall exited ({run.proc.returncode}) before training:\n{run.text()[-3000:]}")
        new = [p for p in root.iterdir() if p.is_dir() and p.name not in before] if root.is_dir() else []
        for state_dir in new:
            metrics = [m for m in state_dir.glob("*/jobs/*/metrics.jsonl") if m.stat().st_size > 0]
            if len(metrics) >= workers:
                return state_dir.name, state_dir
        time.sleep(0.2)
    pytest.fail(f"no cell was training {TRAINING_TIMEOUT_S:.0f} s after start:\n{run.text()[-3000:]}")


def run_gc() -> tuple[float, dict[str, Any]]:
    """``squall gc --json`` as a user runs it: its duration and its report."""
    t0 = time.monotonic()
    gc = subprocess.run([*SQUALL, "gc", "--json"], cwd=REPO, capture_output=True, text=True, check=False,
                        timeout=GC_TIMEOUT_S, env=dict(os.environ))
    took = time.monotonic() - t0
    assert gc.returncode == 0, f"squall gc failed ({gc.returncode}):\n{gc.stdout}\n{gc.stderr}"
    return took, json.loads(gc.stdout.splitlines()[-1])


def _require_root_tools() -> None:
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("iptables-save", "ip", "tc")):
        msg = "reading the host's iptables rules and qdiscs needs root and iptables-save, ip, tc"
        if in_ci():
            pytest.fail(f"{msg} (CI=true: a missing prerequisite is a failure, not a skip)")
        pytest.skip(msg)


def _assert_nothing_left(client: Any, fp: Footprint, when: str) -> None:
    left = left_behind(client, fp)
    assert not any(left.values()), f"{when}, run {fp.run_id} left: " + json.dumps(
        {k: v for k, v in left.items() if v}, indent=1)


def _assert_footprint_seen(fp: Footprint) -> None:
    """The checks can fail: while the run trains, the listings do show its objects."""
    assert any(fp.bridge in line for line in _links()), f"bridge {fp.bridge} not on the host"
    assert len(fp.veths) >= 1, f"no veth on {fp.bridge}"
    assert any(any(n in line for n in fp.names()) for line in _iptables()), f"no iptables rule names {fp.bridge}"
    workdirs = list(Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}{fp.run_id}-*"))
    assert fp.daemons == len(workdirs), f"{fp.daemons} nfqueue daemons for work dirs {workdirs}"  # nfqueue: 1, netem: 0


@pytest.fixture
def host_tools() -> None:
    """Name: host_tools. Scope: function. Depends: root, iptables-save, ip, tc on the host."""
    _require_root_tools()


# -- (a) SIGKILL in the middle of a cell ----------------------------------------------------------
def test_sigkilled_matrix_leaves_nothing_after_gc(docker_client: Any, worker_image: str, host_tools: None,
                                                 tmp_path: Path, request: pytest.FixtureRequest) -> None:
    matrix = tmp_path / "crash.yaml"
    matrix.write_text("protocols: [ring]\nprofiles: [wan-5ms]\nworkers: [4]\nseeds: [0]\n"
                      "run:\n  seconds: 120\n  lr: 0.5\n  config: {eval_every: 5}\n")
    root = state_root()
    before = {p.name for p in root.iterdir()} if root.is_dir() else set()
    run = Squall.start(["matrix", str(matrix), "--report", str(tmp_path / "report"), "--no-claims"], tmp_path)
    try:
        run_id, state_dir = wait_training(run, before, workers=4)
        fp = _footprint(docker_client, run_id, state_dir, run.proc.pid)
        _assert_footprint_seen(fp)
    finally:
        run.kill_group()
    after_kill = _counts(left_behind(docker_client, fp))
    took, report = run_gc()
    request.node.user_properties.append(("gc_seconds", round(took, 2)))
    request.node.user_properties.append(("left_after_sigkill", json.dumps(after_kill)))
    logger.info("run %s: after SIGKILL %s; gc took %.2f s: %s", run_id, after_kill, took, report)
    # 4 workers and the fork server: SIGKILL did leave the run behind...
    assert after_kill["containers"] == 5 and after_kill["networks"] == 1
    _assert_nothing_left(docker_client, fp, "after SIGKILL and gc")  # ...and gc took all of it


# -- (b) the Docker engine restarts in the middle of a run ----------------------------------------
def _dockerd() -> psutil.Process:
    found = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "dockerd"]
    if len(found) != 1 or os.environ.get("DOCKER_HOST"):
        msg = (f"need exactly one local dockerd to restart (found {len(found)}, "
               f"DOCKER_HOST={os.environ.get('DOCKER_HOST')})")
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    return found[0]


def _restart_engine(dockerd: psutil.Process) -> float:
    """Stop dockerd gracefully (SIGTERM; its containerd and every container go with it), start it again.

    Returns the time the engine stopped (time.monotonic). The engine is started again even when
    stopping failed, so a failing test never leaves the machine without one.
    """
    try:
        dockerd.terminate()
        try:
            dockerd.wait(ENGINE_TIMEOUT_S)
        except psutil.TimeoutExpired:
            dockerd.kill()
            dockerd.wait(30)
        return time.monotonic()
    finally:
        start = subprocess.run(["bash", str(REPO / "scripts" / "ensure-docker.sh")], capture_output=True, text=True,
                               check=False, timeout=ENGINE_TIMEOUT_S)
        assert start.returncode == 0, f"the Docker engine did not come back: {start.stderr}"


def test_engine_restart_mid_run_fails_clearly_and_gc_leaves_nothing(
        docker_client: Any, worker_image: str, host_tools: None, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    dockerd = _dockerd()
    running = [c.name for c in docker_client.containers.list()]
    if running and not in_ci():  # CI runs one test at a time: there, nothing else can be up
        pytest.skip(f"restarting the engine would kill containers of other runs: {running[:5]}")
    root = state_root()
    before = {p.name for p in root.iterdir()} if root.is_dir() else set()
    run = Squall.start(["run", "--protocol", "ring", "--profile", "wan-5ms", "--workers", "4", "--seconds", "120"],
                       tmp_path)
    try:
        run_id, state_dir = wait_training(run, before, workers=4)
        fp = _footprint(docker_client, run_id, state_dir, run.proc.pid)
        _assert_footprint_seen(fp)
        stopped = _restart_engine(dockerd)
        try:
            code = run.proc.wait(timeout=FAIL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"squall run still runs {FAIL_TIMEOUT_S:.0f} s after the engine stopped (a hang):\n"
                        f"{run.text()[-3000:]}")
        failed_after = time.monotonic() - stopped
    finally:
        if run.proc.poll() is None:
            run.kill_group()
    err = run.text()
    request.node.user_properties.append(("run_failed_s_after_engine_stop", round(failed_after, 1)))
    request.node.user_properties.append(("run_error", err.strip().splitlines()[-1] if err.strip() else ""))
    logger.info("run %s failed with %d, %.1f s after the engine stopped:\n%s", run_id, code, failed_after, err)
    assert code == 1, f"squall run exited {code} after the engine restarted, expected 1 (a failed run):\n{err}"
    assert "Traceback" not in err, f"squall run failed with a traceback, not a message:\n{err}"
    assert "ring on wan-5ms" in err and "ERROR" in err, f"no clear error on stderr:\n{err}"
    took, _ = run_gc()
    request.node.user_properties.append(("gc_seconds_after_engine_restart", round(took, 2)))
    _assert_nothing_left(docker_client, fp, "after the engine restart and gc")
