"""Squall as a third party gets it: the wheel, installed into a fresh virtualenv outside the repository,
finds its own assets, finds (or builds) the worker image, and runs someone else's protocol package
(docs/examples/myproto, the guide's example) through the pytest plugin in containers on shaped links.

Slow by nature (installing torch into a new virtualenv takes minutes on a busy host): one test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from squall import assets

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "myproto"
INSTALL_TIMEOUT_S = 1500  # pip install of torch and friends into a new virtualenv, on a loaded 2-core host


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _source_copy(dest: Path) -> Path:
    """The working tree's tracked and new files (what a clean checkout would hold), nothing ignored."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def _build_wheel(tmp: Path) -> Path:
    src = _source_copy(tmp / "src")
    dist = tmp / "dist"
    proc = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                 str(dist), str(src)], cwd=tmp, env=dict(os.environ), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = dist.glob("squall-*.whl")
    return wheel


def _user_env(venv: Path, cache: Path) -> dict[str, str]:
    """A user's shell with the new virtualenv activated and nothing of this checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               SQUALL_CACHE_DIR=str(cache))
    return env


def _containers_mounting(client: Any, root: Path) -> list[str]:
    """Squall containers with a bind mount from under ``root`` (this test's own runs, whatever else runs)."""
    found = []
    for container in client.containers.list(all=True, filters={"label": "squall.run"}):
        sources = [m.get("Source", "") for m in container.attrs.get("Mounts", [])]
        if any(Path(s).is_relative_to(root) for s in sources if s):
            found.append(container.name)
    return found


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(INSTALL_TIMEOUT_S + 900)
def test_an_installed_wheel_runs_a_third_party_protocol(tmp_path: Path, docker_client: Any) -> None:
    assert not tmp_path.is_relative_to(REPO)
    t0 = time.monotonic()
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    # One namespace: everything the wheel installs is the squall package or its metadata.
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"squall"}, sorted(tops)
    packaged = f"squall/{assets.PACKAGED_DIR}"
    for needed in ("netem_profiles/lan.yaml", "netem_profiles/README.md", "containers/worker.Dockerfile",
                   "containers/requirements.txt", "containers/base/debootstrap.sh", "claims.yaml",
                   "matrices/ci.yaml"):
        assert f"{packaged}/{needed}" in names, needed
    shipped = {p.name for p in (REPO / "netem_profiles").glob("*.yaml")}
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith(f"{packaged}/netem_profiles/")} >= shipped
    assert not [n for n in names if ".wheelhouse" in n or n.endswith(".whl")]  # no downloaded wheels
    assert wheel.stat().st_size < 5 * 2**20, wheel.stat().st_size

    venv, cache, user = tmp_path / "venv", tmp_path / "cache", tmp_path / "user"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = _user_env(venv, cache)
    install = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", str(wheel),
                    "torch==2.13.0", "pytest"], cwd=tmp_path, env=env, timeout=INSTALL_TIMEOUT_S)
    assert install.returncode == 0, install.stderr[-3000:]
    t_installed = time.monotonic()

    python = str(venv / "bin" / "python")
    where = _run([python, "-c", "import squall.assets as a, torch; print(a.__file__, a.layout(), torch.__version__)"],
                 cwd=tmp_path, env=env, timeout=300)
    module, layout, torch_version = where.stdout.split()
    assert Path(module).is_relative_to(venv) and layout == "wheel", where.stdout + where.stderr
    assert torch_version == "2.13.0+cpu"  # the on-disk CPU wheel, no CUDA packages

    squall = str(venv / "bin" / "squall")
    listing = _run([squall, "profiles", "list", "--json"], cwd=tmp_path, env=env, timeout=300)
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert {r["name"] for r in rows} >= {"lan", "wan-5ms", "lossy-1pct"}
    assert all(Path(r["path"]).is_relative_to(venv) for r in rows)

    claims = _run([squall, "claims"], cwd=tmp_path, env=env, timeout=300)  # the installed claims.yaml
    assert claims.returncode == 0 and "paper:" in claims.stdout, claims.stdout[-2000:] + claims.stderr[-2000:]

    image = _run([squall, "image", "build", "--json"], cwd=tmp_path, env=env, timeout=1800)  # finds, or builds
    assert image.returncode == 0, image.stderr[-3000:]
    tag = json.loads(image.stdout.splitlines()[-1])["image"]
    status = _run([squall, "image", "status"], cwd=tmp_path, env=env, timeout=300)
    assert status.returncode == 0 and tag in status.stdout, status.stdout + status.stderr

    shutil.copytree(EXAMPLE, user / "myproto", ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    t_pytest = time.monotonic()
    run = _run([python, "-m", "pytest", "-v", "-p", "no:cacheprovider", f"--squall-report={user / 'report'}",
                "--junitxml=junit.xml"], cwd=user / "myproto", env=env, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert "4 passed" in run.stdout, out[-3000:]
    for cell in ("myproto_protocol_main-lan-w4", "myproto_protocol_main-wan_30ms_2pct-w4"):
        assert f"test_reaches_the_target_on_each_network[{cell}] PASSED" in run.stdout
        assert cell in (user / "report" / "report.html").read_text()
    staged = list((cache / "code").iterdir())  # the containers mounted a copy of squall/, not site-packages
    assert len(staged) == 1 and [p.name for p in staged[0].iterdir()] == ["squall"]
    assert _containers_mounting(docker_client, tmp_path) == []  # nothing left behind
    print(f"wheel {wheel.stat().st_size / 1024:.0f} KiB, {len(names)} files; install {t_installed - t0:.0f} s; "
          f"plugin run {time.monotonic() - t_pytest:.0f} s; total {time.monotonic() - t0:.0f} s")
