"""docs/ci.md's GitHub Actions job, taken out of the page and run here step by step (issue 40, item 5).

The job's YAML is parsed from the page; every ``run:`` step is either run, in order, with
``bash -eo pipefail`` as GitHub runs it, or skipped for a reason :data:`STEPS` gives (a step the table
does not know fails the test: a new step in the page must say here whether it can run). ``uses:``
steps are GitHub's actions: checking out the repository is a copy of docs/examples/myproto as the
workspace, ``setup-python`` is this interpreter's Python 3.11 first on ``PATH``; caching and uploading
are GitHub's services.

What stands in for GitHub here, and why:

* ``SQUALL_GIT`` is a git repository made of this working tree (its tracked and new files, as the rest
  of the suite tests them; ``file://``, branch ``main``): no remote is known to the tests; the step
  still clones and pip still builds Squall from the clone, in a fresh virtualenv, with pip's own cache;
* ``TORCH_INDEX`` is the page's (PyTorch's CPU index) where it answers; on a machine that reaches no
  such index (this one), pip's configured index, whose find-links folder holds the CPU wheel: the
  step still names ``torch==2.13.0+cpu``;
* ``sudo``: where the machine has none and the test runs as root, a shim on ``PATH`` that drops
  sudo's options and ``exec``s the command (what sudo does for root, minus its policy).

The test step must leave pytest itself as the step's process (``exec``), so a cancel's signal reaches
it: the test reads ``/proc/<step pid>/cmdline`` while the step runs. The netem step installs an
Ubuntu kernel's modules package, which only a GitHub runner's kernel has: it is skipped.

Slow by nature: installing torch, Squall's dependencies and the example into a new virtualenv, then
the example's two container cells (minutes on a busy 2-core host; the durations are printed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from squall.cluster.image import DEFAULT_TORCH_INDEX, answers

from .source_copy import source_copy

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "ci.md"
EXAMPLE = REPO / "docs" / "examples" / "myproto"
STEP_TIMEOUT_S = 1800
#: Each run step of the page's job: "run", or "skip: why".
STEPS = {
    "Get Squall": "run",
    "Install torch's CPU build, Squall and this project": "run",
    "netem in the kernel (without it the links are shaped by the nfqueue backend)":
        "skip: installs linux-modules-extra-$(uname -r), a package of a GitHub runner's Ubuntu kernel",
    "Worker image (found when present, built otherwise; tagged by a hash of its recipe)": "run",
    "Could a run start here?": "run",
    "Tests on emulated networks": "run",
    "Remove what a cancelled run left": "run",
}
TEST_STEP = "Tests on emulated networks"


def job_in_doc(text: str) -> dict[str, Any]:
    """The one job of the page's first ```yaml block."""
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, f"{DOC}: no ```yaml block"
    workflow = yaml.safe_load(blocks[0])
    (job,) = workflow["jobs"].values()
    assert isinstance(job, dict)
    return job


def expand(value: str, workspace: Path) -> str:
    """GitHub's expressions the job uses in its env, resolved for this machine."""
    known = {"github.workspace": str(workspace)}

    def one(m: re.Match[str]) -> str:
        name = m.group(1).strip()
        assert name in known, f"{DOC}: the job's env uses ${{{{ {name} }}}}, which this test cannot resolve"
        return known[name]

    return re.sub(r"\$\{\{(.*?)\}\}", one, value)


def test_every_run_step_of_the_page_is_known_here() -> None:
    steps = [s for s in job_in_doc(DOC.read_text())["steps"] if "run" in s]
    assert [s["name"] for s in steps] == list(STEPS), "docs/ci.md's run steps changed: update STEPS"
    tests = next(s["run"] for s in steps if s["name"] == TEST_STEP)
    assert tests.startswith("exec "), "the test step must exec pytest, so that a cancel reaches it"


def _repository_of_the_working_tree(dest: Path) -> str:
    """A git repository (branch ``main``) holding the working tree's tracked and new files, nothing ignored."""
    source_copy(dest)
    git = ["git", "-C", str(dest), "-c", "user.name=test", "-c", "user.email=test@invalid"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "working tree"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    return dest.as_uri()


def _stand_ins(bin_dir: Path) -> None:
    """``python`` (setup-python's), and ``sudo`` where there is none (see the module docstring)."""
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(Path(sys.executable).resolve())
    if shutil.which("sudo") is None:
        if os.geteuid() != 0:
            pytest.fail("no sudo and not root: the job's steps cannot run")
        shim = bin_dir / "sudo"
        shim.write_text('#!/bin/sh\n# sudo for root: drop the options, run the command\n'
                        'while [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
        shim.chmod(0o755)


def _env(job: dict[str, Any], workspace: Path, runner_temp: Path, bin_dir: Path, squall_git: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")
           and not k.startswith("SQUALL_")}
    env.update({k: expand(str(v), workspace) for k, v in job.get("env", {}).items()})
    env.update(GITHUB_WORKSPACE=str(workspace), RUNNER_TEMP=str(runner_temp), SQUALL_GIT=squall_git,
               SQUALL_REF="main", PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    if answers(DEFAULT_TORCH_INDEX + "/torch/"):  # unreachable here: pip's configured index and find-links
        env["TORCH_INDEX"] = env.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    return env


def _run_step(script: str, *, cwd: Path, env: dict[str, str], watch_for: str = "") -> tuple[
        subprocess.CompletedProcess[str], bool]:
    """Run ``script`` as GitHub does; with ``watch_for``, also whether the step's own process came to have it
    in its command line (it exec'd into that program)."""
    cmd = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script]
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        seen = False
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while watch_for and not seen and proc.poll() is None and time.monotonic() < deadline:
            try:
                seen = watch_for in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                break
            time.sleep(0.2)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), seen


def _containers_mounting(client: Any, root: Path) -> list[str]:
    found = []
    for container in client.api.containers(all=True, filters={"label": "squall.run"}):
        sources = [m.get("Source", "") for m in container.get("Mounts", [])]
        if any(Path(s).is_relative_to(root) for s in sources if s):
            found.append(container["Names"][0])
    return found


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(STEP_TIMEOUT_S * 2)
def test_the_pages_job_installs_squall_and_runs_the_examples_tests(tmp_path: Path, docker_client: Any,
                                                                    worker_image: str) -> None:
    job = job_in_doc(DOC.read_text())
    workspace, runner_temp, bin_dir = tmp_path / "workspace", tmp_path / "runner-temp", tmp_path / "bin"
    shutil.copytree(EXAMPLE, workspace, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.egg-info"))
    runner_temp.mkdir()
    _stand_ins(bin_dir)
    (tmp_path / "squall-origin").mkdir()
    env = _env(job, workspace, runner_temp, bin_dir, _repository_of_the_working_tree(tmp_path / "squall-origin"))
    took: dict[str, float] = {}
    for step in job["steps"]:
        if "run" not in step:
            continue
        how = STEPS[step["name"]]
        if how != "run":
            print(f"{step['name']}: {how}")
            continue
        t0 = time.monotonic()
        proc, exec_d = _run_step(step["run"], cwd=workspace, env=env,
                                 watch_for="pytest" if step["name"] == TEST_STEP else "")
        took[step["name"]] = time.monotonic() - t0
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"step {step['name']!r} exited {proc.returncode}:\n{out[-6000:]}"
        if step["name"] == "Could a run start here?":
            assert "ready: a run can start here" in proc.stdout, out[-3000:]
        if step["name"] == "Worker image (found when present, built otherwise; tagged by a hash of its recipe)":
            assert worker_image in proc.stdout, out[-3000:]  # the clone's recipe is this checkout's: same tag
        if step["name"] == TEST_STEP:
            assert exec_d, "the test step's process never became pytest: a cancel would stop at the shell"
            assert "4 passed" in proc.stdout, out[-4000:]
            for cell in ("myproto_protocol_main-lan-w4", "myproto_protocol_main-wan_30ms_2pct-w4"):
                assert f"test_reaches_the_target_on_each_network[{cell}] PASSED" in proc.stdout, out[-4000:]
    venv_python = str(workspace / ".venv" / "bin" / "python")
    where = subprocess.run([venv_python, "-c", "import squall.assets as a, torch, myproto; "
                            "print(a.layout(), torch.__version__, a.__file__, myproto.__file__)"],
                           cwd=workspace, env=env, capture_output=True, text=True, check=False)
    layout, torch_version, squall_file, myproto_file = where.stdout.split()
    assert layout == "wheel" and torch_version == "2.13.0+cpu", where.stdout + where.stderr
    assert Path(squall_file).is_relative_to(workspace / ".venv")  # built from the clone and installed
    assert Path(myproto_file).is_relative_to(workspace / "myproto")  # pip install -e .
    freeze = subprocess.run([venv_python, "-m", "pip", "list", "--format=freeze"], cwd=workspace, env=env,
                            capture_output=True,
                            text=True, check=True).stdout
    assert not re.search(r"(?im)^(nvidia-|triton==)", freeze), freeze  # no CUDA on the host either
    report = workspace / "squall-report"
    assert (report / "report.html").is_file() and "squall_backend" in (report / "junit.xml").read_text()
    staged = list((workspace / ".squall-cache" / "code").iterdir())  # Squall's code as the containers saw it
    assert len(staged) == 1 and [p.name for p in staged[0].iterdir()] == ["squall"]
    assert _containers_mounting(docker_client, tmp_path) == []  # the gc step and the teardowns left nothing
    print("; ".join(f"{name}: {seconds:.0f} s" for name, seconds in took.items()))
