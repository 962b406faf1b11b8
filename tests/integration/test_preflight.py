"""The CLI refuses to start what this machine cannot run: exit code 3, every reason, the pointer to
``squall doctor``, no traceback, nothing started (squall/cluster/preflight.py, issue 40 item 3).

Each command runs as a real unprivileged user (``nobody``, through ``runuser``, with a temporary
HOME), as root whose capabilities were dropped (``setpriv``), and as root asking for a backend the
host lacks. No container may start: the commands are refused before any.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from squall.cluster.engine import in_ci
from squall.cluster.ownership import LABEL_STATE

REPO = Path(__file__).resolve().parents[2]
NOBODY = "nobody"
TIMEOUT_S = 120
#: One command of each kind that starts runs: a protocol, a user's program, a matrix, a calibration, the demo.
COMMANDS: dict[str, list[str]] = {
    "run": ["run", "--protocol", "ring", "--profile", "lan", "--workers", "2", "--seconds", "3"],
    "run a program": ["run", "--profile", "lan", "--workers", "2", "--seconds", "3", "--", "python", "-c", "pass"],
    "matrix": ["matrix", "MATRIX"],
    "calibrate": ["calibrate", "--profile", "lan", "--workers", "2", "--quick"],
    "demo": ["demo", "--workers", "2"],
}
MATRIX = "protocols: [ring]\nprofiles: [lan]\nworkers: [2]\nrun: {seconds: 3}\ncalibrate: false\n"


@functools.cache
def _python_for(user: str) -> list[str]:
    """A Python 3.11 that ``user`` may run, with this checkout's squall and the venv's packages importable.

    The venv's interpreter is used when ``user`` can execute it; else the system's python3.11 (the same
    minor version, so the venv's compiled packages load), with the venv's site-packages on PYTHONPATH.
    """
    venv_python = Path(sys.executable)
    if subprocess.run(["runuser", "-u", user, "--", str(venv_python), "-c", "pass"], capture_output=True,
                      check=False).returncode == 0:
        return [str(venv_python)]
    for candidate in ("/usr/bin/python3.11", shutil.which("python3.11") or ""):
        if candidate and subprocess.run(["runuser", "-u", user, "--", candidate, "-c", "pass"], capture_output=True,
                                        check=False).returncode == 0:
            return [candidate]
    pytest.fail(f"no Python 3.11 that {user} may run: {venv_python} is not readable by {user} and there is no "
                "/usr/bin/python3.11")


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """A temporary HOME and working folder that ``nobody`` owns (outside /tmp/pytest-of-root, which is closed)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        if in_ci():
            pytest.fail("CI=true: this test needs root and runuser to run the CLI as another user")
        pytest.skip("needs root and runuser")
    folder = Path(tempfile.mkdtemp(prefix="squall-preflight-"))
    (folder / "matrix.yaml").write_text(MATRIX)
    shutil.chown(folder, NOBODY)
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _env(home: Path) -> dict[str, str]:
    site = sysconfig.get_paths()["purelib"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "SQUALL_"))}
    env.update(HOME=str(home), SQUALL_CACHE_DIR=str(home / "cache"), SQUALL_STATE_DIR=str(home / "state"),
               PYTHONPATH=os.pathsep.join([str(REPO), site]), SQUALL_PROGRESS="plain")
    return env


def _squall(prefix: list[str], python: list[str], args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    args = [str(home / "matrix.yaml") if a == "MATRIX" else a for a in args]
    return subprocess.run([*prefix, *python, "-m", "squall.cli.main", *args], cwd=home, env=_env(home),
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def _created_under(client: Any, home: Path, since: float) -> list[str]:
    """Containers created since ``since`` whose run state lives under ``home``: the commands' own, whatever
    else the engine runs meanwhile (Docker's event log, so a container created and removed is seen too)."""
    events = client.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                           filters={"type": "container", "event": "create", "label": LABEL_STATE})
    return [e["Actor"]["Attributes"].get("name", e["id"]) for e in events
            if str(e["Actor"]["Attributes"].get(LABEL_STATE, "")).startswith(str(home))]


def _refused(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, f"exit {proc.returncode}\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]
    assert "the run cannot start here" in proc.stderr and "squall doctor" in proc.stderr, out[-3000:]
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in\n{proc.stderr[-3000:]}"


@pytest.mark.docker
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unprivileged_user_gets_exit_3_and_every_reason(command: str, home: Path, docker_client: Any) -> None:
    t0 = time.time()
    proc = _squall(["runuser", "-u", NOBODY, "--"], _python_for(NOBODY), COMMANDS[command], home)
    _refused(proc, "nobody (uid 65534) may not use the Docker socket", "lacks CAP_NET_ADMIN and CAP_SYS_ADMIN")
    assert _created_under(docker_client, home, t0) == []


@pytest.mark.docker
def test_root_without_its_capabilities_is_refused_too(home: Path) -> None:
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is missing") if in_ci() else pytest.skip("needs setpriv")
    proc = _squall(["setpriv", "--inh-caps=-all", "--bounding-set=-all"], [sys.executable], COMMANDS["run"], home)
    _refused(proc, "root lacks CAP_NET_ADMIN and CAP_SYS_ADMIN")
    assert "Docker socket" not in proc.stderr  # root owns the socket: only the capabilities are missing


@pytest.mark.docker
def test_a_backend_the_host_lacks_is_refused_before_anything_starts(home: Path, docker_client: Any) -> None:
    """nfqueue without iptables on PATH; netem where the kernel has no sch_netem (this machine's case)."""
    from squall.shaping.select import netem_probe

    t0 = time.time()
    no_iptables = _env(home) | {"PATH": str(Path(sys.executable).parent)}  # python, no sbin: no iptables
    args = [*COMMANDS["run"], "--backend", "nfqueue"]
    proc = subprocess.run([sys.executable, "-m", "squall.cli.main", *args], cwd=home, env=no_iptables,
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    _refused(proc, "the nfqueue backend was asked for, but iptables is not on PATH")
    probe = netem_probe()
    netem = _squall([], [sys.executable], [*COMMANDS["run"], "--backend", "netem"], home)
    if probe.available:  # a netem kernel: the same command passes the preflight and runs
        assert netem.returncode == 0, (netem.stdout + netem.stderr)[-3000:]
    else:
        _refused(netem, "the netem backend was asked for, but it cannot run here", probe.reason, "--backend nfqueue")
        assert _created_under(docker_client, home, t0) == []
